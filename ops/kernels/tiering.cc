#include "tiering.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "table_shard.h"

namespace tensorflow {
namespace ttf {

Status Tiering::Open(TableShard* sh) const {
  if (sh->tier.disk.open()) return OkStatus();
  return sh->tier.disk.Open(config_.ssd_dir, sh->rows.store.stride());
}

int64_t Tiering::DramRowLimit(const TableShard& sh) const {
  // Per row: RowBytes. The disk tier's key index is RAM too and counts inside the budget:
  // DRAM holds what is left.
  const int64_t left = config_.dram_budget / config_.num_shards - sh.tier.disk.index.bytes();
  return std::max<int64_t>(1, left / RowBytes(sh.rows.store.stride()));
}

bool Tiering::IndexCrowdsDram(const TableShard& sh) const {
  return config_.tiered() && sh.tier.disk.index.bytes() > config_.dram_budget / config_.num_shards / 2;
}

Status Tiering::MakeRoom(TableShard* sh, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids,
                         int64_t* missing) {
  sh->tier.write_back.clear();
  // Room for this update's missing keys first, so a failed write (a full disk) returns
  // before any key of this update changed. This update's own rows never leave. Demotion
  // moves only rows outside this update, so the ids probed here stay valid unless it
  // compacted the store (new ids).
  *missing = ProbeAll(sh->rows, keys, hashes, n, ids);
  if (sh->rows.index.size() > std::max<int64_t>(0, DramRowLimit(*sh) - *missing)) {
    const std::vector<int64_t> keep(keys, keys + n);
    bool renumbered = false;
    TF_RETURN_IF_ERROR(Demote(sh, *missing, keep, &renumbered));
    if (renumbered) *missing = -1;
  }
  return OkStatus();
}

Status Tiering::Demote(TableShard* sh, int64_t reserve, const std::vector<int64_t>& keep, bool* renumbered) {
  if (IndexCrowdsDram(*sh) && !index_warned_.exchange(true)) {
    // Straight to stderr, once a table: TensorFlow's C++ log follows TF_CPP_MIN_LOG_LEVEL,
    // which many jobs set to hide TensorFlow's own lines.
    std::fprintf(stderr,
                 "ttf warning: the SSD tier's key index of a table shard takes %lld bytes of its %lld-byte share "
                 "of dram_budget, leaving DRAM %lld rows: more rows are read from disk. Raise dram_budget=. "
                 "tier_stats()['crowded_shards'] counts such shards.\n",
                 static_cast<long long>(sh->tier.disk.index.bytes()),
                 static_cast<long long>(config_.dram_budget / config_.num_shards),
                 static_cast<long long>(DramRowLimit(*sh)));
  }
  // The disk index grows with what is demoted and counts inside the budget, so the limit can
  // fall while demoting: repeat until DRAM is within it (a pass or two: the index grows by
  // 5/4 at a time) or only `keep` is left.
  while (true) {
    const int64_t before = sh->rows.index.size();
    TF_RETURN_IF_ERROR(DemotePass(sh, std::max<int64_t>(0, DramRowLimit(*sh) - reserve), keep, renumbered));
    if (sh->rows.index.size() <= std::max<int64_t>(0, DramRowLimit(*sh) - reserve) ||
        sh->rows.index.size() == before)
      return OkStatus();
  }
}

namespace {
// Moves n DRAM rows of a shard to its disk tier (row_at(i): {key, DRAM row id}), appended in
// batches, each written first and removed from DRAM after: a failed write leaves its rows, and
// those of the batches after it, where they were, and is returned. Demotion and write-back.
template <typename RowAt>
Status MoveToDisk(TableShard* sh, size_t n, RowAt row_at) {
  constexpr size_t kBatch = 4096;
  std::vector<int64_t> keys;
  std::vector<const RowMeta*> metas;
  std::vector<const float*> rows;
  for (size_t begin = 0; begin < n; begin += kBatch) {
    const size_t end = std::min(n, begin + kBatch);
    keys.clear(), metas.clear(), rows.clear();
    for (size_t i = begin; i < end; ++i) {
      const std::pair<int64_t, uint32_t> row = row_at(i);
      keys.push_back(row.first);
      metas.push_back(&sh->rows.store.meta(row.second));
      rows.push_back(sh->rows.store.row(row.second));
    }
    TF_RETURN_IF_ERROR(sh->tier.disk.Append(keys.size(), keys.data(), metas.data(), rows.data()));
    for (int64_t key : keys) sh->rows.Remove(key, HashKey(key));
    sh->tier.rows_demoted += keys.size();
  }
  return OkStatus();
}
}  // namespace

Status Tiering::DemotePass(TableShard* sh, int64_t limit, const std::vector<int64_t>& keep, bool* renumbered) {
  const int64_t size = sh->rows.index.size();
  if (size <= limit) return OkStatus();
  // Down to 7/8 of the limit at once, so the scan below (~25 ns a DRAM row) is paid once per
  // limit/8 demotions: at 15/16 it was 7% of a tiered step's CPU time (profiled, 64 MiB budget).
  const int64_t target = limit - limit / 8;
  // The table's evict_policy orders the demotion too (Victim); each keeps its DRAM row id, so
  // no probe finds it again.
  struct DramVictim : Victim {
    uint32_t id;
  };
  const bool lfu = config_.evict_policy == EvictPolicy::kLfu;
  // The rows of `keep` are marked by row id: a probe per kept key, where a search of `keep`
  // per DRAM row made this scan a tenth of a tiered step (profiled).
  std::vector<bool> kept(sh->rows.store.allocated_rows(), false);
  for (int64_t key : keep) {
    const uint32_t id = sh->rows.index.Find(key, HashKey(key));
    if (id != KeyIndex::kNone) kept[id] = true;
  }
  std::vector<DramVictim> victims;
  victims.reserve(size);
  sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
    if (kept[id]) return;
    const RowMeta& m = sh->rows.store.meta(id);
    victims.push_back(DramVictim{Victim::Of(lfu, m, key), id});
  });
  const size_t drop = std::min<size_t>(victims.size(), static_cast<size_t>(size - target));
  if (drop == 0) return OkStatus();
  std::nth_element(victims.begin(), victims.begin() + (drop - 1), victims.end());
  sh->tier.last_demoted = victims[drop - 1];  // the DRAM admission's bar (Promote)
  TF_RETURN_IF_ERROR(MoveToDisk(sh, drop, [&](size_t i) { return std::make_pair(victims[i].key, victims[i].id); }));
  TF_RETURN_IF_ERROR(sh->tier.disk.CompactIfStale());
  // The demoted rows' chunks go back to the system once half are free.
  if (CompactShard(sh, DramRowLimit(*sh)) && renumbered != nullptr) *renumbered = true;
  return OkStatus();
}

Status Tiering::Promote(TableShard* sh, int64_t key, uint64_t hash, int64_t now, uint32_t* id) {
  *id = KeyIndex::kNone;
  ShardTier& tier = sh->tier;
  const int64_t stride = sh->rows.store.stride();
  // A record staged by this step's lookup is the key's live record when its slot is still in
  // the index under the key's fingerprint (same generation: records never change in place);
  // otherwise the record is read (and its key checked) here.
  uint32_t slot = DiskIndex::kNone;
  const char* record = nullptr;
  const auto staged = tier.staged.find(key);
  if (staged != tier.staged.end() && staged->second.generation == tier.disk.generation() &&
      tier.disk.index.Holds(DiskIndex::Fingerprint(hash), staged->second.slot)) {
    slot = staged->second.slot;
    record = tier.staged_bytes.data() + staged->second.offset;
  } else {
    thread_local std::vector<char> read;
    read.resize(sizeof(RowMeta) + stride * sizeof(float));
    TF_RETURN_IF_ERROR(tier.disk.Locate(key, hash, &slot, reinterpret_cast<RowMeta*>(read.data()),
                                        reinterpret_cast<float*>(read.data() + sizeof(RowMeta)), stride));
    record = read.data();
  }
  if (slot == DiskIndex::kNone) return OkStatus();
  RowMeta meta;
  *id = sh->rows.Add(key, hash);
  std::memcpy(&meta, record, sizeof(meta));
  std::memcpy(sh->rows.store.row(*id), record + sizeof(meta), stride * sizeof(float));
  tier.disk.Drop(hash, slot);
  // Ranked by its history, below the rows DRAM lets go: updated here, then written back.
  const bool lfu = config_.evict_policy == EvictPolicy::kLfu;
  if (tier.last_demoted && !(*tier.last_demoted < Victim::Of(lfu, meta, key))) tier.write_back.push_back(key);
  sh->rows.store.meta(*id) = RowMeta{meta.count + 1, now};
  ++tier.rows_promoted;
  return OkStatus();
}

Status Tiering::WriteBack(TableShard* sh) const {
  ShardTier& tier = sh->tier;
  if (tier.write_back.empty()) return OkStatus();
  std::vector<std::pair<int64_t, uint32_t>> rows;  // {key, DRAM row id}
  for (int64_t key : tier.write_back) {
    const uint32_t id = sh->rows.index.Find(key, HashKey(key));
    if (id != KeyIndex::kNone) rows.emplace_back(key, id);  // else evicted by the capacity meanwhile
  }
  tier.write_back.clear();
  const int64_t demoted_before = tier.rows_demoted;
  const Status moved = MoveToDisk(sh, rows.size(), [&](size_t i) { return rows[i]; });
  tier.rows_written_back += tier.rows_demoted - demoted_before;
  if (!moved.ok()) return OkStatus();  // the rows not written stay in DRAM (see the declaration)
  return tier.disk.CompactIfStale();
}

void Tiering::EndUpdate(TableShard* sh) const {
  sh->tier.staged.clear();
  sh->tier.staged_bytes.clear();
}

void Tiering::Stage(const TableShard& sh, size_t n, const std::pair<int64_t, uint32_t>* keys_and_slots,
                    const char* records, int64_t record_bytes) const {
  if (n == 0) return;
  auto& tier = const_cast<ShardTier&>(sh.tier);  // the staging has its own lock
  std::lock_guard<std::mutex> staging(tier.staged_mu);
  const int64_t generation = tier.disk.generation();
  for (size_t j = 0; j < n && tier.staged.size() < ShardTier::kMaxStaged; ++j) {
    const size_t offset = tier.staged_bytes.size();
    tier.staged_bytes.insert(tier.staged_bytes.end(), records + j * record_bytes, records + (j + 1) * record_bytes);
    tier.staged[keys_and_slots[j].first] = {generation, keys_and_slots[j].second, offset};
  }
}

}  // namespace ttf
}  // namespace tensorflow
