#include "row_store.h"

#include <algorithm>
#include <utility>

namespace tensorflow {
namespace ttf {

// ---------------------------------------------------------------- KeyIndex

KeyIndex::KeyIndex(int64_t capacity) : slots_(capacity), mask_(capacity - 1), capacity_(capacity) {
  std::fill(slots_.get(), slots_.get() + capacity, Slot{0, kNone});
}

int64_t KeyIndex::CapacityFor(int64_t keys) {
  int64_t cap = 16;
  while (keys * 4 > cap * 3) cap *= 2;
  return cap;
}

void KeyIndex::Insert(int64_t key, uint64_t hash, uint32_t id) {
  uint64_t pos = hash & mask_;
  while (slots_[pos].id != kNone) pos = (pos + 1) & mask_;
  slots_[pos] = Slot{key, id};
  ++size_;
}

uint32_t KeyIndex::Erase(int64_t key, uint64_t hash) {
  if (capacity_ == 0) return kNone;
  uint64_t pos = hash & mask_;
  while (true) {
    if (slots_[pos].id == kNone) return kNone;
    if (slots_[pos].key == key) break;
    pos = (pos + 1) & mask_;
  }
  const uint32_t erased = slots_[pos].id;
  // Backward-shift deletion: pull later entries of the probe run into the hole when their
  // home slot does not lie cyclically in (hole, current].
  uint64_t hole = pos;
  for (uint64_t cur = (pos + 1) & mask_; slots_[cur].id != kNone; cur = (cur + 1) & mask_) {
    const uint64_t home = HashKey(slots_[cur].key) & mask_;
    const bool stays = (hole <= cur) ? (hole < home && home <= cur) : (hole < home || home <= cur);
    if (!stays) {
      slots_[hole] = slots_[cur];
      hole = cur;
    }
  }
  slots_[hole].id = kNone;
  --size_;
  return erased;
}

void KeyIndex::MoveAllInto(KeyIndex* bigger) const {
  ForEach([bigger](int64_t key, uint32_t id) { bigger->Insert(key, HashKey(key), id); });
}

// ---------------------------------------------------------------- RowStore

int64_t RowStore::ChunksNeeded(int64_t extra) const {
  const int64_t available =
      static_cast<int64_t>(free_ids_.size()) + static_cast<int64_t>(chunks_.size()) * kChunkRows - next_id_;
  if (extra <= available) return 0;
  return (extra - available + kChunkRows - 1) / kChunkRows;
}

RowStore::Chunk RowStore::NewChunk(int64_t stride) {
  Chunk chunk;
  if (stride > 0) chunk.values = PageArray<float>(kChunkRows * stride);
  chunk.meta = PageArray<RowMeta>(kChunkRows);
  return chunk;
}

uint32_t RowStore::Take() {
  if (!free_ids_.empty()) {
    const uint32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  return next_id_++;
}

int64_t RowStore::bytes() const {
  return static_cast<int64_t>(chunks_.size()) * kChunkRows * (stride_ * sizeof(float) + sizeof(RowMeta)) +
         static_cast<int64_t>(free_ids_.capacity()) * sizeof(uint32_t);
}

int64_t ProbeAll(const KeyedStore& ks, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids) {
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + 16 < n) ks.index.Prefetch(hashes[i + 16]);
    ids[i] = ks.index.Find(keys[i], hashes[i]);
    missing += ids[i] == KeyIndex::kNone;
  }
  return missing;
}

std::vector<uint32_t>& ScratchIds(int64_t n) {
  thread_local std::vector<uint32_t> ids;  // reused across calls: no allocation per lookup
  if (static_cast<int64_t>(ids.size()) < n) ids.resize(n);
  return ids;
}

bool CompactStore(KeyedStore* ks, int64_t max_allocated) {
  const int64_t live = ks->index.size(), allocated = ks->store.allocated_rows();
  const bool index_oversized = ks->index.capacity() > 4 * KeyIndex::CapacityFor(live);
  const bool over = max_allocated > 0 && allocated > max_allocated + RowStore::kChunkRows;
  if (!index_oversized && !over && (allocated <= RowStore::kChunkRows || live * 2 > allocated)) return false;
  const int64_t stride = ks->store.stride();
  KeyedStore dense(stride);
  dense.index = KeyIndex(KeyIndex::CapacityFor(live));
  for (int64_t c = dense.store.ChunksNeeded(live); c > 0; --c) dense.store.AddChunk(RowStore::NewChunk(stride));
  dense.store.TakeFirst(live);
  uint32_t next = 0;
  ks->index.ForEach([&](int64_t key, uint32_t id) {
    dense.index.Insert(key, HashKey(key), next);
    if (stride > 0) std::memcpy(dense.store.row(next), ks->store.row(id), stride * sizeof(float));
    dense.store.meta(next) = ks->store.meta(id);
    ++next;
  });
  *ks = std::move(dense);
  return true;
}

void GrowFor(KeyedStore* ks, int64_t extra) {
  if (!ks->index.HasRoom(extra)) {
    KeyIndex bigger(KeyIndex::CapacityFor(ks->index.size() + extra));
    ks->index.MoveAllInto(&bigger);
    std::swap(ks->index, bigger);
  }
  for (int64_t c = ks->store.ChunksNeeded(extra); c > 0; --c) ks->store.AddChunk(RowStore::NewChunk(ks->store.stride()));
}

}  // namespace ttf
}  // namespace tensorflow
