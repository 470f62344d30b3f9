// The C++-loop floor of benchmarks/lookup_floor.py: what the same rows cost with no hash
// table at all. Rows sit in one contiguous [rows, 3 * dim] array (value | m | v, the layout
// of a ttf row under Adam) and ids are row numbers. Built by the benchmark with the flags
// ttf's op library uses (-O3, no -march=native) and called through ctypes.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" {

// out[p] = the value part of row idx[p] (the inference lookup's work without the table).
void floor_gather(const float* store, int64_t stride, const int64_t* idx, int64_t n, int64_t dim, float* out) {
  for (int64_t p = 0; p < n; ++p) {
    if (p + 8 < n) __builtin_prefetch(store + idx[p + 8] * stride);
    std::memcpy(out + p * dim, store + idx[p] * stride, dim * sizeof(float));
  }
}

// The Adam update of rows idx[p] with grads[p], in place (a gather and scatter of value and
// both slots fused into one pass; Keras' epsilon placement, as ttf's AdamUpdate).
void floor_adam(float* store, int64_t stride, const int64_t* idx, int64_t n, int64_t dim, const float* grads,
                float alpha, float beta_1, float beta_2, float epsilon) {
  for (int64_t p = 0; p < n; ++p) {
    if (p + 8 < n) {
      const char* ahead = reinterpret_cast<const char*>(store + idx[p + 8] * stride);
      for (int64_t b = 0; b < stride * 4; b += 64) __builtin_prefetch(ahead + b, 1);
    }
    float* __restrict row = store + idx[p] * stride;
    float* __restrict m = row + dim;
    float* __restrict v = row + 2 * dim;
    const float* __restrict g = grads + p * dim;
    for (int64_t j = 0; j < dim; ++j) {
      m[j] += (g[j] - m[j]) * (1.0f - beta_1);
      v[j] += (g[j] * g[j] - v[j]) * (1.0f - beta_2);
      row[j] -= (m[j] * alpha) / (std::sqrt(v[j]) + epsilon);
    }
  }
}

// The bare hash loop of ttf's own layout (lookup_layout_model.cc's "index", issue 37 item 5),
// here on the benchmark's own ids and rows: 12-byte (key, row) linear-probing slots at ttf's
// load (grown x2 past 3/4), the key hashed by SplitMix64 as ttf's HashKey, rows by number in
// the store above; FindEach's pipeline: hash every id of the batch, then blocks of 256 ids,
// each slot prefetched 32 ids ahead, each found row prefetched at once and copied after its
// block. One index, no shards, no locks, no TensorFlow: the floor of a hash lookup. The
// benchmark gives it rows of its own, so no other path warms them (the gather's, on the same
// ranks just before, made it 1.6x faster than on rows as cold as ttf's).
namespace {
#pragma pack(push, 4)
struct Slot {
  int64_t key;
  uint32_t id;  // ~0u: empty
};
#pragma pack(pop)
struct HashIndex {
  Slot* slots;
  uint64_t mask;
};
inline uint64_t HashKey(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// A row's value, inlined for the common widths as ttf's CopyRow (a libc memcpy call per row
// of a runtime width was half of this loop's samples, profiled).
inline void CopyValue(float* __restrict dst, const float* __restrict src, int64_t dim) {
  switch (dim) {
    case 8: std::memcpy(dst, src, 8 * sizeof(float)); return;
    case 16: std::memcpy(dst, src, 16 * sizeof(float)); return;
    case 32: std::memcpy(dst, src, 32 * sizeof(float)); return;
    case 64: std::memcpy(dst, src, 64 * sizeof(float)); return;
    default: std::memcpy(dst, src, dim * sizeof(float));
  }
}
}  // namespace

// An index of keys[r] -> r (r < n), its slots in transparent huge pages as ttf's
// (page_memory.h) and the store's (numpy's large arrays); free with floor_hash_free.
void* floor_hash_build(const int64_t* keys, int64_t n) {
  uint64_t capacity = 1;
  while (capacity * 3 < static_cast<uint64_t>(n) * 4) capacity <<= 1;
  void* slots = mmap(nullptr, capacity * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (slots == MAP_FAILED) return nullptr;
  madvise(slots, capacity * sizeof(Slot), MADV_HUGEPAGE);
  auto* index = new HashIndex{static_cast<Slot*>(slots), capacity - 1};
  for (uint64_t p = 0; p < capacity; ++p) index->slots[p].id = ~0u;
  for (int64_t r = 0; r < n; ++r) {
    uint64_t p = HashKey(keys[r]) & index->mask;
    while (index->slots[p].id != ~0u) p = (p + 1) & index->mask;
    index->slots[p] = Slot{keys[r], static_cast<uint32_t>(r)};
  }
  return index;
}

void floor_hash_free(void* index) {
  munmap(static_cast<HashIndex*>(index)->slots, (static_cast<HashIndex*>(index)->mask + 1) * sizeof(Slot));
  delete static_cast<HashIndex*>(index);
}

// out[p] = the value part of the row of keys[p] (every key present).
void floor_hash_lookup(const void* index_ptr, const float* store, int64_t stride, const int64_t* keys, int64_t n,
                       int64_t dim, float* out) {
  constexpr int64_t kBlock = 256, kAhead = 32;
  const HashIndex& index = *static_cast<const HashIndex*>(index_ptr);
  static thread_local uint64_t* hashes = nullptr;
  static thread_local int64_t room = 0;
  if (room < n) {
    std::free(hashes);
    hashes = static_cast<uint64_t*>(std::malloc(n * sizeof(uint64_t)));
    room = n;
  }
  const float* found[kBlock];
  for (int64_t p = 0; p < n; ++p) hashes[p] = HashKey(keys[p]);
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    for (int64_t q = 0; q < m; ++q) {
      const int64_t i = begin + q;
      if (i + kAhead < n) {
        const char* slot = reinterpret_cast<const char*>(index.slots + (hashes[i + kAhead] & index.mask));
        __builtin_prefetch(slot);
        __builtin_prefetch(slot + sizeof(Slot) - 1);
      }
      uint64_t pos = hashes[i] & index.mask;
      while (index.slots[pos].key != keys[i]) pos = (pos + 1) & index.mask;
      found[q] = store + static_cast<int64_t>(index.slots[pos].id) * stride;
      __builtin_prefetch(found[q]);
    }
    for (int64_t q = 0; q < m; ++q) CopyValue(out + (begin + q) * dim, found[q], dim);
  }
}

}  // extern "C"
