// The table as an orchestrator: shards, their locks and the step, calling each concern
// (admission, eviction, tiering, change log) where an update, a removal or a re-layout needs
// it. Lookups are in table_lookup.cc, snapshots in table_snapshot.cc.
#include "embedding_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ttf {

EmbeddingTable::EmbeddingTable(const TableConfig& config)
    : config_(config),
      admission_(config_),
      eviction_(config_),
      tiering_(config_),
      layout_(config.rows, config.dim, "", 0) {
  shards_.reserve(config.num_shards);
  for (int i = 0; i < config.num_shards; ++i)
    shards_.emplace_back(new TableShard(layout_.words(), admission_.NewShard()));
}

std::string EmbeddingTable::DebugString() const {
  return strings::StrCat("ttf.EmbeddingTable(dim=", config_.dim, ", size=", Size(), ")");
}

void EmbeddingTable::AdvanceStep(int64_t step) {
  int64_t seen = step_.load(std::memory_order_relaxed);
  while (step > seen && !step_.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
  }
}

void EmbeddingTable::FillDefault(float* out) const { std::fill(out, out + config_.dim, config_.default_value); }

void EmbeddingTable::ReserveRoom(std::unique_lock<std::shared_mutex>& lock, KeyedStore* ks, int64_t extra) {
  const bool grow_index = !ks->index.HasRoom(extra);
  const int64_t new_capacity = KeyIndex::CapacityFor(ks->index.size() + extra);
  const int64_t chunks = ks->store.ChunksNeeded(extra);
  const int64_t stride = ks->store.stride();
  lock.unlock();
  KeyIndex bigger = grow_index ? KeyIndex(new_capacity) : KeyIndex();
  std::vector<RowStore::Chunk> fresh;
  for (int64_t i = 0; i < chunks; ++i) fresh.push_back(RowStore::NewChunk(stride));
  lock.lock();
  // Another thread may have grown the shard meanwhile; only ever move to a larger index.
  if (grow_index && bigger.capacity() > ks->index.capacity() && bigger.capacity() >= new_capacity) {
    ks->index.MoveAllInto(&bigger);
    std::swap(ks->index, bigger);
  }
  if (ks->store.stride() == stride) {  // a slot re-layout in between makes these chunks too narrow
    for (auto& chunk : fresh) ks->store.AddChunk(std::move(chunk));
  }
}

Status EmbeddingTable::OpenTier() {
  if (!tiering_.enabled()) return OkStatus();
  for (auto& sh : shards_) {
    std::unique_lock<std::shared_mutex> lock(sh->mu);
    TF_RETURN_IF_ERROR(tiering_.Open(sh.get()));
  }
  return OkStatus();
}

Status EmbeddingTable::TouchKeys(int s, std::unique_lock<std::shared_mutex>& lock, const int64_t* keys,
                                 const uint64_t* hashes, int64_t n, int64_t now, uint32_t* ids) {
  TableShard& sh = *shards_[s];
  const int64_t dim = config_.dim;
  const bool tiered = tiering_.enabled();
  int64_t missing = -1;  // keys without a DRAM row; -1: not probed yet (ids not valid)
  // Tiered: DRAM room for this update's missing keys first (a failed write returns before
  // any key of this update changed); -1 again when the demotion renumbered the rows.
  if (tiered) TF_RETURN_IF_ERROR(tiering_.MakeRoom(&sh, keys, hashes, n, ids, &missing));
  while (true) {
    // Probe every key once, remembering its row id. Repeated after a ReserveRoom, which
    // releases the lock (other threads may insert or evict meanwhile).
    if (missing < 0) missing = ProbeAll(sh.rows, keys, hashes, n, ids);
    if (missing == 0) break;
    if (admission_.UsesCandidates(sh.admission) && !sh.admission.candidates.HasRoom(missing)) {
      ReserveRoom(lock, &sh.admission.candidates, missing);
      missing = -1;
      continue;
    }
    if (!sh.rows.HasRoom(missing)) {
      ReserveRoom(lock, &sh.rows, missing);
      missing = -1;
      continue;
    }
    break;
  }
  // Room is reserved for every missing key: from here on nothing allocates.
  for (int64_t i = 0; i < n; ++i) {
    if (i + 4 < n && ids[i + 4] != KeyIndex::kNone) {
      __builtin_prefetch(&sh.rows.store.meta(ids[i + 4]), 1);
    } else if (tiered && i + 4 < n) {  // a promotion's index probe: a cache miss in a large index
      sh.tier.disk.index.Prefetch(DiskIndex::Fingerprint(hashes[i + 4]));
    }
    if (ids[i] != KeyIndex::kNone) {
      RowMeta& m = sh.rows.store.meta(ids[i]);
      ++m.count;
      m.last_seen = now;
      continue;
    }
    if (tiered) {  // on disk: promoted (room is reserved; the DRAM row is filled from disk)
      TF_RETURN_IF_ERROR(tiering_.Promote(&sh, keys[i], hashes[i], now, &ids[i]));
      if (ids[i] != KeyIndex::kNone) continue;
    }
    const int64_t count = admission_.Sight(&sh.admission, keys[i], hashes[i], now, change_log_, &sh.log);
    if (count == 0) continue;  // not admitted yet: ids[i] stays kNone
    const uint32_t id = sh.rows.Add(keys[i], hashes[i]);
    float* row = sh.rows.store.row(id);
    if (layout_.fp32()) {
      config_.init.Fill(keys[i], row, dim);
    } else {  // the initializer's value rounded to nearest: a pure function of (seed, key)
      thread_local std::vector<float> value;
      value.resize(dim);
      config_.init.Fill(keys[i], value.data(), dim);
      layout_.EncodeValue(value.data(), nullptr, row);
    }
    layout_.InitSlots(slot_init_, row);
    sh.rows.store.meta(id) = RowMeta{count, now};
    ids[i] = id;
  }
  Status evicted = OkStatus();
  if (eviction_.active()) evicted = EnforceCapacity(&sh, now);
  if (tiered) tiering_.EndUpdate(&sh);
  return evicted;
}

Status EmbeddingTable::WriteBack(int s) { return tiering_.WriteBack(shards_[s].get()); }

Status EmbeddingTable::EnforceCapacity(TableShard* sh, int64_t now) {
  std::vector<int64_t> doomed, doomed_candidates;
  bool swept = false;
  TF_RETURN_IF_ERROR(eviction_.Expired(sh, now, &swept, &doomed, &doomed_candidates));
  if (swept) {
    TF_RETURN_IF_ERROR(RemoveKeys(sh, doomed, &sh->eviction.rows_evicted));
    int64_t rows_removed = 0;  // none: candidates have no rows
    TF_RETURN_IF_ERROR(RemoveKeys(sh, doomed_candidates, &rows_removed));
    eviction_.Swept(sh, now);
    doomed.clear();
  }
  TF_RETURN_IF_ERROR(eviction_.OverCapacity(*sh, now, &doomed));
  return RemoveKeys(sh, doomed, &sh->eviction.rows_evicted);
}

bool EmbeddingTable::CompactIfSparse(TableShard* sh) {
  return CompactShard(sh, tiering_.enabled() ? tiering_.DramRowLimit(*sh) : 0);
}

Status EmbeddingTable::FindOrInsert(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, float* out) {
  TableShard& sh = *shards_[s];
  const int64_t dim = config_.dim;
  std::unique_lock<std::shared_mutex> lock(sh.mu);
  std::vector<uint32_t>& ids = ScratchIds(n);
  TF_RETURN_IF_ERROR(TouchKeys(s, lock, keys, hashes, n, step(), ids.data()));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] == KeyIndex::kNone) {
      FillDefault(out + i * dim);
    } else {
      layout_.DecodeValue(sh.rows.store.row(ids[i]), out + i * dim);
    }
  }
  return WriteBack(s);
}

Status EmbeddingTable::EnsureSlots(const std::string& optimizer, const std::vector<float>& slot_init) {
  {
    std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);
    if (optimizer_ == optimizer && slot_init_.size() == slot_init.size()) return OkStatus();
  }
  std::unique_lock<std::shared_mutex> relayout_lock(relayout_mu_);  // waits for a save in progress
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  if (optimizer_ == optimizer && slot_init_.size() == slot_init.size()) return OkStatus();
  if (!optimizer_.empty() && !slot_init_.empty()) {
    return errors::InvalidArgument("this table holds ", slot_init_.size(), " optimizer slot(s) of '", optimizer_,
                                   "' per row; it cannot be updated by '", optimizer,
                                   "'. Train a table with one optimizer (or start from a fresh table).");
  }
  const int64_t num_slots = static_cast<int64_t>(slot_init.size());
  const RowLayout layout(config_.rows, config_.dim, optimizer, num_slots);
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(config_, layout.words(), num_slots));
  // A one-time re-layout when the first optimizer step meets rows made by lookups alone.
  return Relayout(optimizer, slot_init);
}

Status EmbeddingTable::Relayout(const std::string& optimizer, const std::vector<float>& slot_init) {
  // Rows hold a value only before their first slots (EnsureSlots, a merge into a fresh table):
  // the value's words stay, the slots' initial values follow.
  const RowLayout layout(config_.rows, config_.dim, optimizer, static_cast<int64_t>(slot_init.size()));
  auto init_slots = [&](float* row) { layout.InitSlots(slot_init, row); };
  for (auto& sh : shards_) TF_RETURN_IF_ERROR(sh->tier.disk.Rewrite(layout.words(), init_slots));
  for (auto& sh : shards_) sh->rows.store.Widen(layout.words(), init_slots);
  optimizer_ = optimizer;
  slot_init_ = slot_init;
  layout_ = layout;
  return OkStatus();
}

namespace {
// The sum over shards of f(shard), each read under its lock held shared.
template <typename F>
int64_t SumOverShards(const std::vector<std::unique_ptr<TableShard>>& shards, F f) {
  int64_t total = 0;
  for (const auto& sh : shards) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += f(*sh);
  }
  return total;
}
}  // namespace

int64_t EmbeddingTable::Size() const {
  return SumOverShards(shards_, [](const TableShard& sh) { return sh.rows.index.size() + sh.tier.disk.index.size(); });
}

int64_t EmbeddingTable::CandidateCount() const {
  return SumOverShards(shards_, [](const TableShard& sh) { return sh.admission.candidates.index.size(); });
}

int64_t EmbeddingTable::CandidatesDropped() const {
  return SumOverShards(shards_, [](const TableShard& sh) { return sh.admission.candidates_dropped; });
}

int64_t EmbeddingTable::RowsEvicted() const {
  return SumOverShards(shards_, [](const TableShard& sh) { return sh.eviction.rows_evicted; });
}

int64_t EmbeddingTable::MemoryBytes() const {
  return sizeof(*this) + SumOverShards(shards_, [](const TableShard& sh) {
           return static_cast<int64_t>(sizeof(TableShard)) + sh.rows.index.bytes() + sh.rows.store.bytes() +
                  sh.admission.candidates.index.bytes() + sh.admission.candidates.store.bytes() +
                  sh.admission.sketch.bytes() + sh.log.bytes() + sh.tier.disk.index.bytes();
         });
}

EmbeddingTable::TierStats EmbeddingTable::Tiers() const {
  TierStats t;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    const ShardTier& tier = sh->tier;
    t.dram_rows += sh->rows.index.size();
    t.disk_rows += tier.disk.index.size();
    t.dram_hits += tier.dram_hits.load(std::memory_order_relaxed);
    t.disk_hits += tier.disk_hits.load(std::memory_order_relaxed);
    t.disk_waits += tier.disk_waits.load(std::memory_order_relaxed);
    t.demoted += tier.rows_demoted;
    t.promoted += tier.rows_promoted;
    t.written_back += tier.rows_written_back;
    t.dram_bytes += sh->rows.index.bytes() + sh->rows.store.bytes();
    t.disk_index_bytes += tier.disk.index.bytes();
    t.disk_file_bytes += tier.disk.file_bytes();
    if (tiering_.enabled()) t.dram_row_limit += tiering_.DramRowLimit(*sh);
    t.crowded_shards += tiering_.IndexCrowdsDram(*sh);
  }
  return t;
}

Status EmbeddingTable::RemoveKeys(TableShard* sh, const std::vector<int64_t>& keys, int64_t* removed) {
  KeyedStore& candidates = sh->admission.candidates;
  for (int64_t key : keys) {
    const uint64_t h = HashKey(key);
    bool on_disk = false;  // a key is in one tier: the disk is read only for a key not in DRAM
    const uint32_t row = sh->rows.index.Erase(key, h);
    if (row == KeyIndex::kNone) TF_RETURN_IF_ERROR(sh->tier.disk.Remove(key, h, &on_disk));
    const uint32_t cand = candidates.index.Erase(key, h);
    if (row != KeyIndex::kNone) sh->rows.store.Release(row);
    if (cand != KeyIndex::kNone) candidates.store.Release(cand);
    *removed += row != KeyIndex::kNone || on_disk;
    if (row != KeyIndex::kNone || on_disk || cand != KeyIndex::kNone) change_log_.Record(&sh->log, key);
  }
  return OkStatus();
}

Status EmbeddingTable::Evict(int64_t min_last_seen, int64_t min_count, int64_t* evicted) {
  *evicted = 0;
  auto expired = [&](const RowMeta& m) { return m.last_seen < min_last_seen || m.count < min_count; };
  std::vector<int64_t> doomed;
  for (auto& sh : shards_) {
    std::unique_lock<std::shared_mutex> lock(sh->mu);
    doomed.clear();
    sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
      if (expired(sh->rows.store.meta(id))) doomed.push_back(key);
    });
    // The disk tier's meta is on disk: one sequential pass; an unreadable file fails the op
    // (shards before this one are evicted, this one is unchanged).
    TF_RETURN_IF_ERROR(sh->tier.disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) {
      if (expired(m)) doomed.push_back(key);
    }));
    TF_RETURN_IF_ERROR(RemoveKeys(sh.get(), doomed, evicted));
    doomed.clear();
    const KeyedStore& candidates = sh->admission.candidates;
    candidates.index.ForEach([&](int64_t key, uint32_t id) {  // candidates go by last-seen only
      if (candidates.store.meta(id).last_seen < min_last_seen) doomed.push_back(key);
    });
    int64_t rows_removed = 0;  // none: candidates have no rows
    TF_RETURN_IF_ERROR(RemoveKeys(sh.get(), doomed, &rows_removed));
    CompactIfSparse(sh.get());
  }
  ReleaseFreedMemory();  // RSS falls: the freed chunks go back to the system
  return OkStatus();
}

Status EmbeddingTable::Remove(const int64_t* keys, int64_t n, int64_t* removed) {
  // Keys grouped by shard first, so each shard is locked once.
  std::vector<std::vector<int64_t>> by_shard(shards_.size());
  for (int64_t i = 0; i < n; ++i) by_shard[ShardOf(HashKey(keys[i]))].push_back(keys[i]);
  *removed = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::unique_lock<std::shared_mutex> lock(shards_[s]->mu);
    TF_RETURN_IF_ERROR(RemoveKeys(shards_[s].get(), by_shard[s], removed));
  }
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow
