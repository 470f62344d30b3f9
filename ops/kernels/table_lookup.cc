// The table's lookups: Find (a shard's distinct keys, training or inference) and FindEach
// (inference, ids as they come). Both only read: insertion and counting happen at the update.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "embedding_table.h"
#include "group_keys.h"

namespace tensorflow {
namespace ttf {
namespace {
// A shard's index and rows by value (KeyIndex::View, RowStore::View), in a local array by
// shard: each id's slot and row addresses are then one load from it, not a chain of loads
// through the shard's store that held back every prefetch once the tables outgrew the cache
// (at 10M keys 1.49-1.65x the bare hash loop before, 1.19x after: benchmarks/lookup_floor.py).
struct ShardView {
  KeyIndex::View index;
  RowStore::View rows;
};

// FindEach's two loops over a block, each a function of its own: inlined into FindEach's
// span loop, the compiler kept their pointers on the stack (a copy of the loop built
// outside the library ran 5-12% faster; docs/lookup_speed.md, session 10).
// rows[q] = the row of ids begin + q (q < m) of a span, or null; index slots prefetched kAhead
// ids ahead, each row at once: its first line, and the line of byte value_end too when that is
// not 0 (a compressed row's value is not line-aligned: int8 at dim 32 spans two lines in 3 of
// 5 rows).
template <int64_t kAhead>
__attribute__((noinline)) void ProbeBlock(const ShardView* views, const int64_t* keys, const uint64_t* hashes,
                                          const int32_t* shard, int64_t begin, int64_t m, int64_t span,
                                          int64_t value_end, const float** rows) {
  for (int64_t q = 0; q < m; ++q) {
    const int64_t i = begin + q;
    if (i + kAhead < span) views[shard[i + kAhead]].index.Prefetch(hashes[i + kAhead]);
    const ShardView& v = views[shard[i]];
    const uint32_t id = v.index.Find(keys[i], hashes[i]);
    rows[q] = id == KeyIndex::kNone ? nullptr : v.rows.row(id);
    __builtin_prefetch(rows[q]);
    if (value_end != 0) __builtin_prefetch(reinterpret_cast<const char*>(rows[q]) + value_end);
  }
}

// out row q = rows[q], or default_value where rows[q] is null.
__attribute__((noinline)) void CopyBlock(const float* const* rows, int64_t m, int64_t dim, float default_value,
                                         float* out) {
  for (int64_t q = 0; q < m; ++q) {
    float* dst = out + q * dim;
    if (rows[q] != nullptr) {
      CopyRow(dst, rows[q], dim);
    } else {
      std::fill_n(dst, dim, default_value);
    }
  }
}

// CopyBlock of compressed rows: each decoded (bf16, int8: row_layout.h).
__attribute__((noinline)) void DecodeBlock(const float* const* rows, int64_t m, const RowLayout& layout,
                                           float default_value, float* out) {
  const int64_t dim = layout.dim();
  for (int64_t q = 0; q < m; ++q) {
    float* dst = out + q * dim;
    if (rows[q] != nullptr) {
      layout.DecodeValue(rows[q], dst);
    } else {
      std::fill_n(dst, dim, default_value);
    }
  }
}
}  // namespace

Status EmbeddingTable::FindEach(const int64_t* keys, int64_t n, float* out) const {
  const int64_t dim = config_.dim;
  const bool tiered = config_.tiered();
  std::vector<ShardView> views(shards_.size());  // set under each span's locks
  std::vector<int64_t> dram_hits(tiered ? shards_.size() : 0);
  // Every shard lock is held shared for kLockedIds ids at a time (~0.1 ms), in shard order as
  // every multi-shard lock is taken: an update waits for one such span, not a whole call. In a
  // span: hash and shard every id first (one division each), then probe in blocks, the index
  // slot prefetched kAhead ids ahead, each found row prefetched at once and copied after its
  // block, so a cold id's two misses (slot, row) overlap with other ids' instead of adding up.
  // Tiered: the span's ids without a DRAM row are then looked up by Find, shard by shard with
  // only that shard's lock (their disk reads batched, no update waiting on other shards).
  // Fixed-size buffers: a call of any size holds no memory beyond them.
  constexpr int64_t kLockedIds = kFindEachSpan, kBlock = 256, kAhead = 32;
  uint64_t hashes[kLockedIds];
  int32_t shard[kLockedIds];
  int32_t missing[kLockedIds];  // tiered: span positions without a DRAM row
  const float* rows[kBlock];
  const int64_t value_end = layout_.fp32() ? 0 : layout_.value_words() * 4 - 1;
  for (int64_t locked = 0; locked < n; locked += kLockedIds) {
    const int64_t span = std::min(kLockedIds, n - locked);
    const int64_t* span_keys = keys + locked;
    for (int64_t i = 0; i < span; ++i) {
      hashes[i] = HashKey(span_keys[i]);
      shard[i] = ShardOf(hashes[i]);
    }
    int64_t num_missing = 0;
    {
      std::vector<std::shared_lock<std::shared_mutex>> locks;
      locks.reserve(shards_.size());
      for (const auto& sh : shards_) locks.emplace_back(sh->mu);
      for (size_t s = 0; s < shards_.size(); ++s)
        views[s] = {shards_[s]->rows.index.view(), shards_[s]->rows.store.view()};
      for (int64_t begin = 0; begin < span; begin += kBlock) {
        const int64_t m = std::min(kBlock, span - begin);
        ProbeBlock<kAhead>(views.data(), span_keys, hashes, shard, begin, m, span, value_end, rows);
        if (layout_.fp32()) {
          CopyBlock(rows, m, dim, config_.default_value, out + (locked + begin) * dim);
        } else {
          DecodeBlock(rows, m, layout_, config_.default_value, out + (locked + begin) * dim);
        }
        if (!tiered) continue;  // tiered only, a pass of its own: the untiered copy loop stays as it was
        for (int64_t q = 0; q < m; ++q) {
          if (rows[q] != nullptr) {
            ++dram_hits[shard[begin + q]];
          } else {
            missing[num_missing++] = static_cast<int32_t>(begin + q);
          }
        }
      }
    }
    if (num_missing > 0)
      TF_RETURN_IF_ERROR(FindMissing(span_keys, missing, num_missing, out + locked * dim));
  }
  for (size_t s = 0; s < dram_hits.size(); ++s)
    if (dram_hits[s] > 0) shards_[s]->tier.dram_hits.fetch_add(dram_hits[s], std::memory_order_relaxed);
  return OkStatus();
}

Status EmbeddingTable::FindMissing(const int64_t* keys, const int32_t* positions, int64_t n, float* out) const {
  const int64_t dim = config_.dim;
  // Their distinct keys by shard (GroupKeys): each shard's read once (a repeated cold id is one disk read).
  int64_t missing_keys[kFindEachSpan];
  for (int64_t j = 0; j < n; ++j) missing_keys[j] = keys[positions[j]];
  GroupedKeys grouped;
  GroupKeys(missing_keys, n, *this, &grouped);
  thread_local std::vector<float> rows;
  rows.resize(grouped.size() * dim);
  for (int s = 0; s < num_shards(); ++s) {
    const int64_t first = grouped.offsets[s], count = grouped.offsets[s + 1] - first;
    if (count > 0)
      TF_RETURN_IF_ERROR(Find(s, &grouped.keys[first], &grouped.hashes[first], count, /*training=*/false,
                              rows.data() + first * dim));
  }
  for (int64_t j = 0; j < n; ++j)
    CopyRow(out + positions[j] * dim, rows.data() + static_cast<int64_t>(grouped.inverse[j]) * dim, dim);
  return OkStatus();
}

Status EmbeddingTable::Find(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, bool training,
                            float* out) const {
  const TableShard& sh = *shards_[s];
  const bool tiered = config_.tiered();
  int64_t disk_hits = 0, disk_waits = 0;
  thread_local std::vector<char> to_stage;
  thread_local std::vector<std::pair<int64_t, uint32_t>> staged_keys;  // (key, slot)
  to_stage.clear();
  staged_keys.clear();
  const int64_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(sh.mu);
  // Training: whole disk records are read (one pread either way) and staged for the update.
  // The stride is read under the lock: an import or slot re-layout changes it (and the disk
  // file's records) under the lock held exclusively; read before it, a changed layout made
  // a lookup read its last record past the file's end and stage records of the old size.
  const int64_t stride = sh.rows.store.stride();
  const int64_t value_end = layout_.fp32() ? 0 : layout_.value_words() * 4 - 1;
  const int64_t staged_record_bytes = sizeof(RowMeta) + stride * sizeof(float);
  std::vector<uint32_t>& ids = ScratchIds(n);
  ProbeAll(sh.rows, keys, hashes, n, ids.data());
  // The keys without a DRAM row are read from disk first, all at once (LocateMany): a
  // training lookup reads whole records (meta and the stride's words: one pread either way)
  // and stages them for the update; an inference lookup reads the value's words only.
  thread_local std::vector<int64_t> disk_keys;
  thread_local std::vector<uint64_t> disk_hashes;
  thread_local std::vector<uint32_t> disk_slots;
  thread_local std::vector<RowMeta> disk_metas;
  thread_local std::vector<float> disk_rows;
  const int64_t disk_floats = training ? stride : layout_.value_words();
  if (tiered) {
    disk_keys.clear();
    disk_hashes.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] != KeyIndex::kNone) continue;
      disk_keys.push_back(keys[i]);
      disk_hashes.push_back(hashes[i]);
    }
    const int64_t m = static_cast<int64_t>(disk_keys.size());
    disk_slots.resize(m);
    disk_metas.resize(m);
    disk_rows.resize(m * disk_floats);
    TF_RETURN_IF_ERROR(sh.tier.disk.LocateMany(m, disk_keys.data(), disk_hashes.data(), disk_slots.data(),
                                          disk_metas.data(), disk_rows.data(), disk_floats, &disk_waits));
  }
  int64_t next_disk = 0;  // position in disk_keys of the next key without a DRAM row
  for (int64_t i = 0; i < n; ++i) {
    if (i + 8 < n && ids[i + 8] != KeyIndex::kNone) {
      const char* ahead = reinterpret_cast<const char*>(sh.rows.store.row(ids[i + 8]));
      __builtin_prefetch(ahead);
      if (value_end != 0) __builtin_prefetch(ahead + value_end);  // as FindEach's
    }
    const uint32_t id = ids[i];
    float* dst = out + i * dim;
    if (id != KeyIndex::kNone) {
      if (layout_.fp32()) {
        CopyRow(dst, sh.rows.store.row(id), dim);
      } else {
        layout_.DecodeValue(sh.rows.store.row(id), dst);
      }
      continue;
    }
    if (tiered) {  // read from disk above, not promoted: the apply promotes (TouchKeys)
      const int64_t j = next_disk++;
      if (disk_slots[j] != DiskIndex::kNone) {
        ++disk_hits;
        const float* row = disk_rows.data() + j * disk_floats;
        layout_.DecodeValue(row, dst);  // a disk record holds the stored words
        if (training) {
          const size_t at = to_stage.size();
          to_stage.resize(at + staged_record_bytes);
          std::memcpy(to_stage.data() + at, &disk_metas[j], sizeof(RowMeta));
          std::memcpy(to_stage.data() + at + sizeof(RowMeta), row, stride * sizeof(float));
          staged_keys.emplace_back(keys[i], disk_slots[j]);
        }
        continue;
      }
    }
    // Admitted by this step's update if this sighting reaches admission_min_count.
    if (training && admission_.AdmitsNext(sh.admission, keys[i], hashes[i])) {
      config_.init.Fill(keys[i], dst, dim);
      layout_.RoundValue(dst);  // as the apply will store it
    } else {
      FillDefault(dst);
    }
  }
  if (tiered) {
    int64_t dram_hits = 0;
    for (int64_t i = 0; i < n; ++i) dram_hits += ids[i] != KeyIndex::kNone;
    auto& counters = const_cast<ShardTier&>(sh.tier);  // atomics
    counters.dram_hits.fetch_add(dram_hits, std::memory_order_relaxed);
    counters.disk_hits.fetch_add(disk_hits, std::memory_order_relaxed);
    counters.disk_waits.fetch_add(disk_waits, std::memory_order_relaxed);
    tiering_.Stage(sh, staged_keys.size(), staged_keys.data(), to_stage.data(), staged_record_bytes);
  }
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow
