// The DRAM half of a table shard: an open-addressing index from key to row id (KeyIndex) and
// the rows it points into (RowStore), together a KeyedStore. A row holds the embedding value
// and the optimizer's slots side by side in `stride` 4-byte words (fp32 rows: [value | slot 0 |
// slot 1], each `dim` floats; bf16 and int8 rows: row_layout.h), so one probe reaches all of
// them; rows live in fixed-size chunks that never move, so growing the
// store never copies rows. Per-row metadata (RowMeta) sits in a parallel chunk. Admission
// candidates use the same shape with no floats (stride 0).
#ifndef TTF_OPS_KERNELS_ROW_STORE_H_
#define TTF_OPS_KERNELS_ROW_STORE_H_

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "page_memory.h"
#include "table_hash.h"

namespace tensorflow {
namespace ttf {

// Copies one row of `dim` floats. The common dims get a fixed-size copy the compiler inlines:
// a memcpy call per 64-byte row cost more than the copy itself (a third of a lookup's time).
inline void CopyRow(float* __restrict dst, const float* __restrict src, int64_t dim) {
  switch (dim) {
    case 8: std::memcpy(dst, src, 8 * sizeof(float)); return;
    case 16: std::memcpy(dst, src, 16 * sizeof(float)); return;
    case 32: std::memcpy(dst, src, 32 * sizeof(float)); return;
    case 64: std::memcpy(dst, src, 64 * sizeof(float)); return;
    default: std::memcpy(dst, src, dim * sizeof(float));
  }
}

struct RowMeta {
  int64_t count;      // training updates (or explicit inserts) that touched the key
  int64_t last_seen;  // step of its latest update (table step for an explicit insert)
};

// The RAM bytes a row counts against dram_budget and capacity_bytes: value and optimizer
// slots (`stride` 4-byte words), metadata, and its index entry (12 bytes at a load of ~1/2).
inline int64_t RowBytes(int64_t stride) {
  return stride * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(RowMeta)) + 24;
}

// key -> uint32 id, open addressing with linear probing (cache friendly; deletion by backward
// shift, so no tombstones accumulate under eviction churn). Keys may be any int64: emptiness
// is marked in the slot's id, not with a reserved key.
class KeyIndex {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;
  KeyIndex() = default;
  explicit KeyIndex(int64_t capacity);  // capacity: a power of two

  uint32_t Find(int64_t key, uint64_t hash) const { return view().Find(key, hash); }
  void Prefetch(uint64_t hash) const { view().Prefetch(hash); }
  // The key must be absent and HasRoom(1) true.
  void Insert(int64_t key, uint64_t hash, uint32_t id);
  // Returns the erased id, or kNone when the key is absent.
  uint32_t Erase(int64_t key, uint64_t hash);
  bool HasRoom(int64_t extra) const { return (size_ + extra) * 4 <= capacity_ * 3; }
  static int64_t CapacityFor(int64_t keys);
  void MoveAllInto(KeyIndex* bigger) const;  // rehash; `bigger` is pre-allocated
  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes() const { return capacity_ * sizeof(Slot); }
  template <typename F>
  void ForEach(F&& f) const {  // f(key, id)
    for (int64_t pos = 0; pos < capacity_; ++pos)
      if (slots_[pos].id != kNone) f(slots_[pos].key, slots_[pos].id);
  }

 private:
  // Key and id side by side (12 bytes, packed to 4-byte alignment): one probe reads one
  // cache line, where separate key and id arrays cost two misses per probe.
#pragma pack(push, 4)
  struct Slot {
    int64_t key;
    uint32_t id;  // kNone: empty
  };
#pragma pack(pop)
  static_assert(sizeof(Slot) == 12, "KeyIndex slots are 12 bytes");

 public:
  // The index by value, for a lookup's probe loop: with the views of every shard in a small
  // local array, finding a slot's address is one load, not a chain of three pointer loads to
  // the shard's index (each on the path of every prefetch; issue 37 item 5). Valid while the
  // shard lock is held.
  class View {
   public:
    uint32_t Find(int64_t key, uint64_t hash) const {
      if (slots_ == nullptr) return kNone;  // no slots (capacity 0)
      for (uint64_t pos = hash & mask_;; pos = (pos + 1) & mask_) {
        const Slot& slot = slots_[pos];
        if (slot.id == kNone) return kNone;
        if (slot.key == key) return slot.id;
      }
    }
    // No emptiness check: with `if (slots_ != nullptr)` around the prefetches, GCC 12 compiled
    // this member to nothing (as it does any inline member whose `if` guards only prefetches),
    // so no probe was ever prefetched. A prefetch never faults (no slots: null, mask_ 0).
    void Prefetch(uint64_t hash) const {
      const char* slot = reinterpret_cast<const char*>(slots_ + (hash & mask_));
      __builtin_prefetch(slot);
      __builtin_prefetch(slot + sizeof(Slot) - 1);  // a 12-byte slot may straddle two cache lines
    }

   private:
    friend class KeyIndex;
    const Slot* slots_ = nullptr;
    uint64_t mask_ = 0;
  };
  View view() const {
    View v;
    v.slots_ = slots_.get();
    v.mask_ = mask_;
    return v;
  }

 private:
  PageArray<Slot> slots_;
  uint64_t mask_ = 0;
  int64_t capacity_ = 0;
  int64_t size_ = 0;
};

// Rows of `stride` 4-byte words (row_layout.h) plus a RowMeta each, in chunks of kChunkRows
// that never move.
// Freed ids are reused before new ones are taken.
class RowStore {
 public:
  static constexpr int64_t kChunkRows = 1024;
  explicit RowStore(int64_t stride) : stride_(stride) {}
  int64_t stride() const { return stride_; }
  float* row(uint32_t id) { return values_[id / kChunkRows] + (id % kChunkRows) * stride_; }
  const float* row(uint32_t id) const { return view().row(id); }
  // The rows by value, for a lookup's probe loop (as KeyIndex::View). Valid while the shard
  // lock is held.
  struct View {
    const float* const* values;
    int64_t stride;
    const float* row(uint32_t id) const { return values[id / kChunkRows] + (id % kChunkRows) * stride; }
  };
  View view() const { return View{values_.data(), stride_}; }
  RowMeta& meta(uint32_t id) { return chunks_[id / kChunkRows].meta[id % kChunkRows]; }
  const RowMeta& meta(uint32_t id) const { return chunks_[id / kChunkRows].meta[id % kChunkRows]; }
  int64_t ChunksNeeded(int64_t extra) const;
  int64_t allocated_rows() const { return static_cast<int64_t>(chunks_.size()) * kChunkRows; }
  struct Chunk {
    PageArray<float> values;  // kChunkRows x stride
    PageArray<RowMeta> meta;  // kChunkRows
  };
  static Chunk NewChunk(int64_t stride);
  void AddChunk(Chunk chunk) {
    values_.push_back(chunk.values.get());
    chunks_.push_back(std::move(chunk));
  }
  uint32_t Take();  // requires ChunksNeeded(1) == 0
  void Release(uint32_t id) { free_ids_.push_back(id); }
  // Ids 0..n-1 taken in order, for a store being filled from scratch (chunks added first).
  void TakeFirst(int64_t n) { next_id_ = static_cast<uint32_t>(n); }
  int64_t bytes() const;
  // Rebuilds every row with a wider stride: the old words first, then init_slots(new row)
  // writes the rest.
  template <typename F>
  void Widen(int64_t new_stride, F init_slots) {
    for (Chunk& chunk : chunks_) {
      PageArray<float> wider(kChunkRows * new_stride);
      for (int64_t r = 0; r < kChunkRows; ++r) {
        float* dst = wider.get() + r * new_stride;
        std::memcpy(dst, chunk.values.get() + r * stride_, stride_ * sizeof(float));
        init_slots(dst);
      }
      chunk.values = std::move(wider);
    }
    for (size_t c = 0; c < chunks_.size(); ++c) values_[c] = chunks_[c].values.get();
    stride_ = new_stride;
  }

 private:
  int64_t stride_;
  std::vector<Chunk> chunks_;
  std::vector<float*> values_;  // chunks_[c].values.get(): 8 bytes a chunk for row(), not 32
  std::vector<uint32_t> free_ids_;
  uint32_t next_id_ = 0;
};

// An index plus its store: the admitted rows, or the admission candidates (stride 0).
struct KeyedStore {
  explicit KeyedStore(int64_t stride) : store(stride) {}
  KeyIndex index;
  RowStore store;
  bool HasRoom(int64_t extra) const { return index.HasRoom(extra) && store.ChunksNeeded(extra) == 0; }
  uint32_t Add(int64_t key, uint64_t hash) {
    const uint32_t id = store.Take();
    index.Insert(key, hash, id);
    return id;
  }
  void Remove(int64_t key, uint64_t hash) {
    const uint32_t id = index.Erase(key, hash);
    if (id != KeyIndex::kNone) store.Release(id);
  }
};

// Probes each of n keys once (prefetching ahead), writing its id or KeyIndex::kNone;
// returns how many are missing. The caller holds the shard lock.
int64_t ProbeAll(const KeyedStore& ks, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids);
// A per-thread buffer of at least n ids, reused across calls.
std::vector<uint32_t>& ScratchIds(int64_t n);

// Rebuilds `ks` densely when at most half of its allocated rows are live, or its index is 4x
// what they need, or (max_allocated > 0) it holds more than max_allocated rows: rows move to
// fresh, contiguous ids, the index shrinks to fit, and the old chunks are freed. Returns
// whether it did.
bool CompactStore(KeyedStore* ks, int64_t max_allocated = 0);
// Makes room in `ks` for `extra` more keys, allocating in place (the caller holds the shard
// lock exclusively and accepts allocating under it: an import, not the training path).
void GrowFor(KeyedStore* ks, int64_t extra);

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_ROW_STORE_H_
