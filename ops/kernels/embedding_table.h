// EmbeddingTable: a dynamic hash table from int64 keys to float32 rows, the resource behind
// every ttf embedding op.
//
// Layout. The table is split into shards by key hash; each shard has its own lock, its own
// open-addressing index (key -> row id) and its own row store. A row holds the embedding
// value and the optimizer's slots side by side ([value | slot 0 | slot 1], each `dim`
// floats), so one probe reaches all of them. Rows live in fixed-size chunks that never move,
// so growing the store never copies rows. Per-row metadata (times seen, last-seen step)
// sits in a parallel chunk. Keys not yet admitted (admission_min_count) are counted in a
// second, row-less store of the same shape.
//
// Memory per key with dim 16 and Adam: 192 bytes of row, 16 bytes of metadata and 12 bytes
// per index slot at a load factor between 3/8 and 3/4 (16-32 bytes), i.e. 224-240 bytes
// against 200 raw bytes (8-byte key + 3 * 16 floats).
//
// Concurrency. A shard's lock guards its index, its stores, its rows and its record of
// deleted keys. Lookups (training and inference: neither changes the table) take it shared;
// optimizer updates (which insert, count, admit and evict by capacity) and explicit
// evictions take it exclusive. An operation holds one shard lock at a time, except the
// whole-table operations, which take all of them in shard order (so they cannot deadlock
// with each other): slot re-layout and Import take them exclusive (the slot layout and the
// content change for every shard at once: no reader ever sees two layouts), Export takes
// them shared (one consistent snapshot, one layout; writers wait, readers go on). A save
// (Save) takes one shard lock at a time, shared: each shard is a consistent snapshot and an
// update waits for one shard's copy at most; it holds relayout_mu_ shared throughout, so the
// slot layout stays one and no Import lands in the middle. Growth
// allocates with the lock released (ReserveRoom), then re-takes it to rehash, so a growing
// shard never blocks readers during the allocation itself.
#ifndef TTF_OPS_KERNELS_EMBEDDING_TABLE_H_
#define TTF_OPS_KERNELS_EMBEDDING_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

// SplitMix64 finaliser: a fast, well-mixed 64-bit hash (Steele et al., 2014).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t HashKey(int64_t key) { return Mix64(static_cast<uint64_t>(key)); }

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

// Memory for rows and index slots, in 2 MiB transparent huge pages where the kernel gives
// them (THP in "madvise" or "always" mode): a lookup's random rows and index slots then
// miss the TLB far less often (one entry covers 2 MiB, not 4 KiB), which was the largest cost
// left against a plain gather (docs/lookup_speed.md). Blocks of at least 64 KiB are carved
// from 2 MiB-aligned slabs marked MADV_HUGEPAGE, page-aligned (so a row of 16k floats fills
// whole cache lines); smaller ones come from operator new, 64-byte aligned. A freed block's
// pages go back to the system at once (MADV_DONTNEED; a slab with no live block is unmapped),
// so RSS falls after an eviction. Thread-safe; allocation is rare (a chunk of rows, an index).
void* AllocatePages(size_t bytes);
void FreePages(void* block, size_t bytes);

// `n` Ts (trivially copyable, left uninitialised) from AllocatePages; freed with the array.
template <typename T>
class PageArray {
  static_assert(std::is_trivially_copyable<T>::value, "PageArray holds plain data");

 public:
  PageArray() = default;
  explicit PageArray(int64_t n)
      : data_(n > 0 ? static_cast<T*>(AllocatePages(static_cast<size_t>(n) * sizeof(T))) : nullptr), n_(n) {}
  ~PageArray() { Reset(); }
  PageArray(PageArray&& o) noexcept : data_(o.data_), n_(o.n_) { o.data_ = nullptr, o.n_ = 0; }
  PageArray& operator=(PageArray&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_, n_ = o.n_;
      o.data_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  PageArray(const PageArray&) = delete;
  PageArray& operator=(const PageArray&) = delete;
  T* get() const { return data_; }
  T& operator[](int64_t i) const { return data_[i]; }
  int64_t size() const { return n_; }

 private:
  void Reset() {
    if (data_ != nullptr) FreePages(data_, static_cast<size_t>(n_) * sizeof(T));
    data_ = nullptr, n_ = 0;
  }
  T* data_ = nullptr;
  int64_t n_ = 0;
};

enum class InitKind { kNormal, kTruncatedNormal, kUniform, kZeros, kConstant };
Status ParseInitKind(const std::string& name, InitKind* kind);

// How a new key's row is filled: a pure function of (seed, key), so values never depend on
// arrival order, on threads, or on how the table is sharded.
struct RowInitializer {
  InitKind kind = InitKind::kUniform;
  float a = -0.05f;  // normal/truncated_normal: mean; uniform: minval; constant: value
  float b = 0.05f;   // normal/truncated_normal: stddev; uniform: maxval
  int64_t seed = 0;
  void Fill(int64_t key, float* row, int64_t dim) const;
};

// Bounds on a table's size attributes: rows of more than kMaxDim floats, or more than
// kMaxShards shards, are refused when the table is created (a chunk of kChunkRows rows
// must stay a sane allocation, and sizes must never overflow).
constexpr int64_t kMaxDim = 4096;
constexpr int64_t kMaxShards = 4096;
constexpr int64_t kMaxCandidates = int64_t{1} << 31;

// Which rows go first when a table holds more than its capacity: least recently updated
// (LRU, by last-seen step), least often updated (LFU, by count), or, for TTL, every row not
// updated for ttl_steps steps (and LRU order above the capacity, if one is set).
enum class EvictPolicy { kLru, kLfu, kTtl };
Status ParseEvictPolicy(const std::string& name, EvictPolicy* policy);

struct TableConfig {
  int64_t dim = 0;
  RowInitializer init;
  float default_value = 0.0f;         // the row a missing (or not yet admitted) key reads
  int64_t admission_min_count = 0;    // a key gets a row once seen in this many updates
  int64_t max_candidates = int64_t{1} << 22;  // admission candidates kept (oldest dropped)
  // > 0: sightings counted in a count-min sketch of this many bytes (AdmissionSketch), no
  // candidates stored.
  int64_t admission_sketch_bytes = 0;
  int num_shards = 16;
  // Bounded size: at most `capacity` rows (0: unbounded) after each update, plus that
  // update's own new keys; rows beyond it go by `evict_policy` (ttl: also every row not
  // updated for ttl_steps steps).
  int64_t capacity = 0;
  // Bounded size in bytes instead (0: none; not with `capacity`, not tiered): each shard keeps
  // at most capacity_bytes / num_shards bytes of rows, RowBytes each at the current width.
  int64_t capacity_bytes = 0;
  EvictPolicy evict_policy = EvictPolicy::kLru;
  int64_t ttl_steps = 0;
  // DRAM + SSD tier (both set, or neither): rows beyond `dram_budget` bytes of DRAM rows
  // (value, slots, metadata and their index entry) live in files under `ssd_dir`.
  int64_t dram_budget = 0;
  std::string ssd_dir;
  bool tiered() const { return dram_budget > 0; }
  // A capacity (rows or bytes) bounds the rows after each update.
  bool capped() const { return capacity > 0 || capacity_bytes > 0; }
  bool operator==(const TableConfig& o) const;
  std::string DebugString() const;
};
// Checks every field of a config for a table's creation (InvalidArgument naming the attr).
Status ValidateConfig(const TableConfig& config);
// InvalidArgument unless a capacity_bytes config gives each shard room for one row of
// `stride` floats (the row width grows when an optimizer adds its slots).
Status CheckCapacityBytesHoldARow(const TableConfig& config, int64_t stride);

// The slot count each optimizer's apply op keeps per row ("" = rows without slots).
// Returns false for a name no apply op uses.
bool SlotsOfOptimizer(const std::string& optimizer, int64_t* num_slots);

struct RowMeta {
  int64_t count;      // training updates (or explicit inserts) that touched the key
  int64_t last_seen;  // step of its latest update (table step for an explicit insert)
};

// A row in the order the table's evict_policy removes rows, smallest first: lfu the fewest
// updates, then the least recent; lru and ttl the least recent, then the fewest updates; then
// the key. The capacity's eviction and the tier's demotion sort by it; the tier's DRAM
// admission compares a disk row with the last row demoted by it.
struct Victim {
  int64_t first, second, key;
  static Victim Of(bool lfu, const RowMeta& m, int64_t key) {
    return lfu ? Victim{m.count, m.last_seen, key} : Victim{m.last_seen, m.count, key};
  }
  bool operator<(const Victim& o) const {
    if (first != o.first) return first < o.first;
    if (second != o.second) return second < o.second;
    return key < o.key;
  }
};

// The RAM bytes a row counts against dram_budget and capacity_bytes: value and optimizer
// slots (`stride` floats), metadata, and its index entry (12 bytes at a load of ~1/2).
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

  uint32_t Find(int64_t key, uint64_t hash) const {
    if (capacity_ == 0) return kNone;
    for (uint64_t pos = hash & mask_;; pos = (pos + 1) & mask_) {
      const Slot& slot = slots_[pos];
      if (slot.id == kNone) return kNone;
      if (slot.key == key) return slot.id;
    }
  }
  // No emptiness check: with `if (capacity_ != 0)` around the prefetches, GCC 12 compiled this
  // member to nothing (as it does any inline member whose `if` guards only prefetches), so no
  // probe was ever prefetched. A prefetch never faults (no slots: null, mask_ 0).
  void Prefetch(uint64_t hash) const {
    const char* slot = reinterpret_cast<const char*>(slots_.get() + (hash & mask_));
    __builtin_prefetch(slot);
    __builtin_prefetch(slot + sizeof(Slot) - 1);  // a 12-byte slot may straddle two cache lines
  }
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
  PageArray<Slot> slots_;
  uint64_t mask_ = 0;
  int64_t capacity_ = 0;
  int64_t size_ = 0;
};

// Rows of `stride` floats plus a RowMeta each, in chunks of kChunkRows that never move.
// Freed ids are reused before new ones are taken.
class RowStore {
 public:
  static constexpr int64_t kChunkRows = 1024;
  explicit RowStore(int64_t stride) : stride_(stride) {}
  int64_t stride() const { return stride_; }
  float* row(uint32_t id) { return chunks_[id / kChunkRows].values.get() + (id % kChunkRows) * stride_; }
  const float* row(uint32_t id) const {
    return chunks_[id / kChunkRows].values.get() + (id % kChunkRows) * stride_;
  }
  RowMeta& meta(uint32_t id) { return chunks_[id / kChunkRows].meta[id % kChunkRows]; }
  const RowMeta& meta(uint32_t id) const { return chunks_[id / kChunkRows].meta[id % kChunkRows]; }
  int64_t ChunksNeeded(int64_t extra) const;
  int64_t allocated_rows() const { return static_cast<int64_t>(chunks_.size()) * kChunkRows; }
  struct Chunk {
    PageArray<float> values;  // kChunkRows x stride
    PageArray<RowMeta> meta;  // kChunkRows
  };
  static Chunk NewChunk(int64_t stride);
  void AddChunk(Chunk chunk) { chunks_.push_back(std::move(chunk)); }
  uint32_t Take();  // requires ChunksNeeded(1) == 0
  void Release(uint32_t id) { free_ids_.push_back(id); }
  // Ids 0..n-1 taken in order, for a store being filled from scratch (chunks added first).
  void TakeFirst(int64_t n) { next_id_ = static_cast<uint32_t>(n); }
  int64_t bytes() const;
  // Rebuilds every row with a wider stride: old floats first, then `fill` per new float.
  void Widen(int64_t new_stride, const std::vector<float>& fill_per_slot, int64_t dim);

 private:
  int64_t stride_;
  std::vector<Chunk> chunks_;
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

// The disk tier's key index: 8 bytes an entry, a 32-bit fingerprint of the key's hash and
// the 32-bit record number, where a KeyIndex slot takes 12 (the key). The key itself is in
// its record, so a fingerprint match is only a candidate, confirmed by the record's key when
// it is read (DiskTier::Locate), which a lookup or a promotion does anyway. Linear probing
// with backward-shift deletion; the home position is a function of the fingerprint (so an
// entry's home is known without its key), and the table grows by 5/4, not 2, keeping its
// load between 3/5 and 3/4: ~12 bytes a disk key, where a KeyIndex takes 16-32. It counts
// inside dram_budget, so what it saves is DRAM rows.
class DiskIndex {
 public:
  static constexpr uint32_t kNone = KeyIndex::kNone;
  DiskIndex() = default;
  static uint32_t Fingerprint(uint64_t hash) { return static_cast<uint32_t>(hash ^ (hash >> 32)); }
  int64_t size() const { return size_; }
  int64_t bytes() const { return static_cast<int64_t>(entries_.size()) * sizeof(uint64_t); }
  // The records that may hold `hash`'s key: start with pos = Home(fingerprint), call until kNone.
  uint64_t Home(uint32_t fingerprint) const {
    return (static_cast<uint64_t>(fingerprint) * entries_.size()) >> 32;
  }
  uint32_t NextCandidate(uint32_t fingerprint, uint64_t* pos) const {
    if (entries_.empty()) return kNone;
    for (;;) {
      const uint64_t entry = entries_[*pos];
      if (static_cast<uint32_t>(entry) == kNone) return kNone;
      *pos = *pos + 1 == entries_.size() ? 0 : *pos + 1;
      if (static_cast<uint32_t>(entry >> 32) == fingerprint) return static_cast<uint32_t>(entry);
    }
  }
  void Prefetch(uint32_t fingerprint) const {  // unconditional: see KeyIndex::Prefetch
    __builtin_prefetch(entries_.data() + Home(fingerprint));
  }
  // Whether record `slot` is live and filed under this fingerprint (exact: a slot is unique).
  bool Holds(uint32_t fingerprint, uint32_t slot) const;
  // Makes room for `extra` more entries (a rehash into 5/3 of the entries' count).
  void Reserve(int64_t extra);
  void Insert(uint32_t fingerprint, uint32_t slot);  // room reserved; slot not yet present
  void Erase(uint32_t fingerprint, uint32_t slot);   // requires Holds(fingerprint, slot)

 private:
  static uint64_t Entry(uint32_t fingerprint, uint32_t slot) {
    return (static_cast<uint64_t>(fingerprint) << 32) | slot;
  }
  std::vector<uint64_t> entries_;  // empty: the low word is kNone
  int64_t size_ = 0;
};

// A shard's disk tier, in the shape of DeepRec's SSDHASH: an append-only file of fixed-size
// records [key, count, last_seen | stride floats], a key -> record index in RAM (DiskIndex,
// ~12 bytes a key), demoted rows written in one large append per
// batch (a write per row costs ~20x more, docs/tiers.md), and compaction (one sequential
// pass into a new file) once stale records outnumber live ones. The file is unlinked as soon
// as it is opened: a cache only this process sees, gone when it ends (a kill -9 included);
// a checkpoint holds every row, the disk tier's too. Writes happen under the shard lock held
// exclusively, reads under it held at least shared (pread/pwrite: no shared file offset).
class DiskTier {
 public:
  static constexpr int64_t kHeaderWords = 3;  // key, count, last_seen (int64 each)
  DiskTier() = default;
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;
  // Creates the (unlinked) file under dir for rows of `stride` floats.
  Status Open(const std::string& dir, int64_t stride);
  bool open() const { return fd_ >= 0; }
  int64_t record_bytes() const { return kHeaderWords * 8 + stride_ * 4; }
  // At most this many records in a file, live or stale (so the DiskIndex's table, 4/3 of
  // its entries at most, stays below 2^32 positions).
  static constexpr int64_t kMaxRecords = int64_t{3} << 30;
  // Appends n rows (keys absent from this tier) in one write; on failure the tier is unchanged.
  Status Append(int64_t n, const int64_t* keys, const RowMeta* const* metas, const float* const* rows);
  // Finds the key's record: *slot is its record number, or kNone when the key is not on
  // disk. When found, `meta` (if non-null) gets its meta and `row` its first `floats` floats;
  // neither is written otherwise. Reads each candidate record of the index (one pread each:
  // one in all but a 2^-32 chance) and returns the first read error.
  Status Locate(int64_t key, uint64_t hash, uint32_t* slot, RowMeta* meta, float* row, int64_t floats) const;
  // Locate for n keys (slots[i], metas[i] if metas is non-null, rows + i * floats), their
  // records read together (ReadMany: *waited of them waited for the device). Returns the
  // first error.
  Status LocateMany(int64_t n, const int64_t* keys, const uint64_t* hashes, uint32_t* slots, RowMeta* metas,
                    float* rows, int64_t floats, int64_t* waited) const;
  // Drops a record found by Locate (promoted, or removed) from the index.
  void Drop(uint64_t hash, uint32_t slot) { index.Erase(DiskIndex::Fingerprint(hash), slot); }
  // Removes the key's row if it is on disk (*removed says whether it was); a read error is returned.
  Status Remove(int64_t key, uint64_t hash, bool* removed);
  void Clear();  // drops every row and truncates the file
  // Rewrites the live records into a new file, sequentially; with a wider stride, each row
  // gets fill_per_slot[f / dim - 1] after its old floats. On failure the tier is unchanged.
  Status Rewrite(int64_t new_stride, const std::vector<float>& fill_per_slot, int64_t dim);
  Status CompactIfStale();  // Rewrite when stale records outnumber live ones
  // Calls f(key, meta, row) for every live record (row: stride floats, valid during the call),
  // reading the file sequentially ~4 MiB at a time: one pass, bounded RAM, no read per row.
  // Returns the first read error (f is not called after it).
  template <typename F>
  Status ForEachLive(F&& f) const;
  int64_t file_bytes() const { return static_cast<int64_t>(next_slot_) * record_bytes(); }
  // Bumped by Clear and Rewrite (which renumber records): within one generation a slot's
  // record never changes, so (generation, slot) names one record's content.
  int64_t generation() const { return generation_; }
  DiskIndex index;  // key (fingerprint) -> slot

 private:
  // Whether `record` (header, then floats) is the key's: then copies its meta and floats out.
  static bool Take(int64_t key, const char* record, RowMeta* meta, float* row, int64_t floats);
  std::string dir_;
  int fd_ = -1;
  int64_t stride_ = 0;
  uint32_t next_slot_ = 0;  // records in the file, live or stale
  int64_t generation_ = 0;
  std::vector<char> buffer_;  // exclusive-lock paths only (Append, Rewrite)
};

// Reads `bytes` at `offset` (retrying short reads); an error names ssd_dir `dir` and errno.
Status DiskReadAll(int fd, const std::string& dir, char* data, int64_t bytes, int64_t offset);

template <typename F>
Status DiskTier::ForEachLive(F&& f) const {
  if (fd_ < 0 || index.size() == 0) return OkStatus();
  const int64_t bytes = record_bytes();
  const int64_t per_pass = std::max<int64_t>(1, (4 << 20) / bytes);
  std::vector<char> in(std::min<int64_t>(per_pass, next_slot_) * bytes);
  for (int64_t first = 0; first < next_slot_; first += per_pass) {
    const int64_t n = std::min<int64_t>(per_pass, next_slot_ - first);
    TF_RETURN_IF_ERROR(DiskReadAll(fd_, dir_, in.data(), n * bytes, first * bytes));
    for (int64_t j = 0; j < n; ++j) {
      const char* record = in.data() + j * bytes;
      int64_t header[kHeaderWords];
      std::memcpy(header, record, sizeof(header));
      if (!index.Holds(DiskIndex::Fingerprint(HashKey(header[0])), static_cast<uint32_t>(first + j)))
        continue;  // stale
      f(header[0], RowMeta{header[1], header[2]}, reinterpret_cast<const float*>(record + sizeof(header)));
    }
  }
  return OkStatus();
}

// Admission counts in fixed memory: a count-min sketch (Cormode & Muthukrishnan, 2005) of
// kDepth rows of 8-bit counters, updated conservatively (only the counters at the minimum
// grow), every counter halved after each width/8 additions (the aging of TinyLFU, Einziger
// et al., 2017). Each row gets at most width/8 increments a window, so a counter's expected
// value stays below 1/4 (1/8 this window, at most 1/8 from halved earlier ones): a key never
// seen reads >= c in all rows with probability at most (1/(4c))^kDepth (Markov, independent
// row hashes). Guarded by the shard lock: Add exclusive, Estimate at least shared.
class AdmissionSketch {
 public:
  static constexpr int kDepth = 4;
  AdmissionSketch() = default;
  explicit AdmissionSketch(int64_t bytes) {
    width_ = 64;
    while (width_ * 2 * kDepth <= bytes) width_ *= 2;
    counters_.assign(width_ * kDepth, 0);
  }
  bool enabled() const { return width_ > 0; }
  int64_t bytes() const { return static_cast<int64_t>(counters_.size()); }
  int64_t Estimate(uint64_t hash) const {
    int64_t least = 255;
    for (int r = 0; r < kDepth; ++r) least = std::min<int64_t>(least, counters_[Slot(hash, r)]);
    return least;
  }
  // Counts one sighting (at least `times` in all, for a restored candidate); returns the new estimate.
  int64_t Add(uint64_t hash, int64_t times = 1) {
    const int64_t updated = std::min<int64_t>(255, Estimate(hash) + times);
    for (int r = 0; r < kDepth; ++r) {
      uint8_t& c = counters_[Slot(hash, r)];
      c = std::max<uint8_t>(c, static_cast<uint8_t>(updated));
    }
    if (++additions_ >= width_ / 8) {
      for (uint8_t& c : counters_) c >>= 1;
      additions_ = 0;
    }
    return updated;
  }

 private:
  size_t Slot(uint64_t hash, int r) const {
    return r * width_ + (Mix64(hash + 0x632be59bd9b4e019ULL * (r + 1)) & (width_ - 1));
  }
  int64_t width_ = 0;
  int64_t additions_ = 0;
  std::vector<uint8_t> counters_;
};

struct TableShard {
  explicit TableShard(int64_t stride) : rows(stride), candidates(0) {}
  mutable std::shared_mutex mu;
  KeyedStore rows;
  KeyedStore candidates;
  int64_t candidates_dropped = 0;     // by the max_candidates bound
  AdmissionSketch sketch;             // admission_sketch_bytes > 0: sightings of keys without a row
  int64_t rows_evicted = 0;           // by the capacity and TTL (not by explicit Evict/Remove)
  int64_t next_ttl_sweep = 0;         // the step at which TTL next scans this shard
  // Removed rows and candidates, one record per reader (DeletedRecord) while it tracks them.
  std::vector<int64_t> deleted_keys[2];
  // Keys of the checkpoint record that saves took with this shard's rows (Save) and that no
  // save has committed yet (CommitSave): the next save takes them again, so a failed save
  // loses none. The checkpoint record reads as deleted_keys[kCheckpointRecord] plus these.
  std::vector<int64_t> deleted_in_save;
  DiskTier disk;                      // cold rows (tiered tables only)
  int64_t rows_demoted = 0, rows_promoted = 0;
  // DRAM admission (tiered): the last row a demotion moved to disk. A disk row an update
  // reads comes back to DRAM only if, before that update, it ranks above this row (Victim
  // order): otherwise it is updated in DRAM and written straight back after the update
  // (WriteBack), so ids seen once in a long while do not push rows trained often out of
  // DRAM. Before the first demotion (none yet) every row comes back.
  std::optional<Victim> last_demoted;
  std::vector<int64_t> write_back;    // this update's keys to write back (exclusive lock)
  int64_t rows_written_back = 0;      // of rows_demoted
  // Lookups of keys with a row, by tier (atomics: lookups hold the lock shared).
  std::atomic<int64_t> dram_hits{0}, disk_hits{0}, disk_waits{0};
  // Disk records read by training lookups, kept for the shard's next update, which promotes
  // them without a second read: key -> StagedRecord, the record ([RowMeta | row]) in
  // staged_bytes. Lookups add under staged_mu (they hold the shard lock shared); the update
  // (exclusive) uses them, then clears them. Bounded by kMaxStaged records.
  static constexpr size_t kMaxStaged = 1 << 12;
  struct StagedRecord {
    int64_t generation;
    uint32_t slot;
    size_t offset;
  };
  std::mutex staged_mu;
  std::unordered_map<int64_t, StagedRecord> staged;
  std::vector<char> staged_bytes;
};

// The readers of deleted keys, each with its own record, reset by that reader only: delta
// checkpoints (reset at each save) and serving publication (reset at each published delta),
// so neither disturbs the other's chain.
enum DeletedRecord : int { kCheckpointRecord = 0, kPublishRecord = 1, kNumDeletedRecords = 2 };

// Where Export writes its snapshot, allocated by the caller once the counts are known (all shard
// locks are held meanwhile, so the counts stay exact): keys [rows], values [rows, stride],
// meta [rows, 2] (count, last_seen), candidate_keys [candidates], candidate_meta [candidates, 2].
struct ExportBuffers {
  int64_t* keys = nullptr;
  float* values = nullptr;
  int64_t* meta = nullptr;
  int64_t* candidate_keys = nullptr;
  int64_t* candidate_meta = nullptr;
};
struct ExportLayout {
  int64_t rows = 0, candidates = 0, stride = 0;  // rows and candidates: of the export (Export only)
  std::string optimizer;
  std::vector<float> slot_init;
  int64_t step = 0;
};
using ExportAllocator = std::function<Status(const ExportLayout&, ExportBuffers*)>;
// The buffer a streamed save (Save) fills from the front: room for max_rows rows (keys,
// values [rows, stride], meta [rows, 2]) and max_candidates candidates (candidate_keys,
// candidate_meta [c, 2]). `write` writes its first `rows` rows and `candidates` candidates
// out as the next piece; the save then refills it from the front.
struct SavePiece {
  int64_t max_rows = 0, max_candidates = 0;
  int64_t* keys = nullptr;
  float* values = nullptr;
  int64_t* meta = nullptr;
  int64_t* candidate_keys = nullptr;
  int64_t* candidate_meta = nullptr;
  int64_t rows = 0, candidates = 0;  // filled
  std::function<Status(const SavePiece&)> write;
};
// Called once by Save, with the layout and no shard lock held: sets the piece's room,
// buffers and writer.
using SaveAllocator = std::function<Status(const ExportLayout&, SavePiece*)>;

// An Import's input, read in place from the op's input tensors (never copied).
struct ImportSource {
  const int64_t* keys = nullptr;
  int64_t num_rows = 0;
  const float* values = nullptr;  // num_rows x dim * (1 + slot_init.size())
  const int64_t* meta = nullptr;  // num_rows x 2
  const int64_t* candidate_keys = nullptr;
  int64_t num_candidates = 0;
  const int64_t* candidate_meta = nullptr;  // num_candidates x 2
  std::string optimizer;
  std::vector<float> slot_init;
  int64_t step = 0;
  // Only keys with PartitionOf(key, num_partitions) == partition are imported.
  int64_t num_partitions = 1, partition = 0;
  // false: replace the whole content; true: upsert these rows, keep the others.
  bool merge = false;
};
// The partition (parameter server, Horovod rank) owning a key: the low 32 bits of its
// SplitMix64 hash mod n, as ttf.embedding.shard_of computes it in stock TF ops. ShardOf (the
// lock shard inside one table) uses bits 40..63 of the same hash, so the two never correlate.
inline int64_t PartitionOf(int64_t key, int64_t n) {
  return static_cast<int64_t>(HashKey(key) & 0xffffffffULL) % n;
}

// Probes each of n keys once (prefetching ahead), writing its id or KeyIndex::kNone;
// returns how many are missing. The caller holds the shard lock.
int64_t ProbeAll(const KeyedStore& ks, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids);
// A per-thread buffer of at least n ids, reused across calls.
std::vector<uint32_t>& ScratchIds(int64_t n);

class EmbeddingTable : public ResourceBase {
 public:
  explicit EmbeddingTable(const TableConfig& config);

  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return MemoryBytes(); }

  const TableConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  // A 32-bit division (24 bits of hash by at most 4,096 shards: the same result), where a
  // 64-bit one took ~4% of the samples of an inference lookup, which shards every id.
  int ShardOf(uint64_t hash) const {
    return static_cast<int>(static_cast<uint32_t>(hash >> 40) % static_cast<uint32_t>(shards_.size()));
  }
  TableShard& shard(int i) { return *shards_[i]; }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  void AdvanceStep(int64_t step);

  // Lookup of distinct keys (all in shard `s`), read-only (shared lock): copies each key's
  // value into `out` (rows of dim). A missing key reads the row it would get if this step's
  // update inserted it: with `training`, the initializer's row when the key would be admitted
  // at this sighting (always without admission), else the default row; without `training`
  // (inference), always the default row. Nothing is inserted or counted: a step that never
  // reaches its update (a skipped, non-finite step) leaves the table as it was.
  // A key whose row is on the disk tier reads it from there (promotion happens at apply).
  Status Find(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, bool training, float* out) const;
  // Inference lookup of n ids as they come, duplicates and all (no de-dup, no grouping by
  // shard): out[i] = the value of keys[i], or the default row for a missing key. Every shard
  // lock is held shared, 4096 ids at a time. Tiered: the ids of those 4096 without a DRAM row
  // then go to Find (FindMissing), which reads them from disk, batched per shard; dram_hits
  // count ids, disk_hits a span's distinct keys. Returns Find's disk read error.
  Status FindEach(const int64_t* keys, int64_t n, float* out) const;
  static constexpr int64_t kFindEachSpan = 4096;  // ids FindEach probes under one set of shard locks
  // Counts one sighting at step `now` of each of n distinct keys of shard `s`, whose lock the
  // caller holds exclusively in `lock` (released and re-taken to grow the shard): a key with a
  // row gets count + 1 and last_seen = now; a missing key gets a row (initializer, then the
  // slots' initial values) or, under admission, counts as a candidate until admitted. ids[i]
  // is the key's row id, KeyIndex::kNone for a key not (yet) admitted. The optimizer apply
  // ops call it for the keys they update, so insertion happens at apply, never in forward.
  // Tiered: a key on disk is promoted (read back into DRAM, meta and all), and first, when
  // this update would take DRAM past its budget, the least recently updated rows not in this
  // update are demoted to disk. A failed disk read or write (a full disk) returns the error
  // with the shard consistent: every row is in exactly one tier, none changed by this call
  // unless the error comes from a read of a promotion (keys before it are then counted).
  // A promoted row whose history ranks below the last row demoted (TableShard::last_demoted)
  // is marked for WriteBack, which the caller runs once it has updated the rows.
  Status TouchKeys(int s, std::unique_lock<std::shared_mutex>& lock, const int64_t* keys, const uint64_t* hashes,
                 int64_t n, int64_t now, uint32_t* ids);
  // After TouchKeys and the update of its rows (same exclusive lock): writes the rows TouchKeys
  // marked back to disk and drops them from DRAM. A failed write keeps them in DRAM (the
  // shard stays consistent, over its DRAM limit by at most this update's rows; the next
  // update's demotion meets the same disk and reports it); a failed compaction is returned.
  Status WriteBack(int s);
  // TouchKeys at the table step, then copies each key's value into `out` (the default row for
  // a key not yet admitted): fills a table outside training (TtfTableFindOrInsert).
  Status FindOrInsert(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, float* out);

  // Makes rows hold `slot_init.size()` optimizer slots for `optimizer`, widening every row
  // (slot j filled with slot_init[j]) the first time. Fails if another optimizer's slots
  // are already there.
  Status EnsureSlots(const std::string& optimizer, const std::vector<float>& slot_init);

  int64_t Size() const;
  int64_t CandidateCount() const;
  int64_t CandidatesDropped() const;
  int64_t RowsEvicted() const;  // by the capacity and TTL policy
  // Creates the disk tier's files (tiered tables; before first use).
  Status OpenTier();
  struct TierStats {
    int64_t dram_rows = 0, disk_rows = 0, dram_hits = 0, disk_hits = 0, demoted = 0, promoted = 0;
    int64_t written_back = 0;  // of demoted: disk rows an update read and wrote straight back
    int64_t dram_bytes = 0, disk_index_bytes = 0, disk_file_bytes = 0, dram_row_limit = 0;
    int64_t disk_waits = 0;  // lookups' disk reads that missed the page cache
    int64_t crowded_shards = 0;  // shards whose disk index takes over half their share of dram_budget
  };
  TierStats Tiers() const;
  int64_t MemoryBytes() const;
  // Removes keys whose last-seen step is below min_last_seen or whose count is below
  // min_count, from both tiers; candidates go by last-seen only. Sets the number of rows
  // removed. A disk tier that cannot be read fails it (Internal, naming ssd_dir).
  Status Evict(int64_t min_last_seen, int64_t min_count, int64_t* evicted);
  // Removes these keys' rows and candidates; sets the number of rows removed. A disk tier
  // that cannot be read fails it (Internal, naming ssd_dir; the keys reached before the
  // failing read are removed, every key still in one tier or gone).
  Status Remove(const int64_t* keys, int64_t n, int64_t* removed);

  // One consistent snapshot under every shard lock (shared): the rows and candidates whose
  // last-seen step is > since_step (INT64_MIN: all), written straight into the buffers
  // `allocate` returns. With `deleted` non-null, also the keys removed since the deleted-key
  // record was last reset (sorted, distinct); reset_deleted clears the record in the same
  // snapshot and starts it if it was off.
  // `record` (a DeletedRecord) names whose record of deleted keys is read and reset.
  Status Export(int64_t since_step, const ExportAllocator& allocate, std::vector<int64_t>* deleted,
                bool reset_deleted, int record);
  // A streamed save (TtfTableSave): the rows and candidates last seen after since_step
  // (INT64_MIN: all) into the piece `allocate` sets up, written out each time it is full.
  // One lock shard at a time, held shared while its rows (DRAM, then its disk tier's, read
  // sequentially) and candidates are copied: each shard is a consistent snapshot, and an
  // update waits for one shard's copy (plus a piece's write when a shard holds more than a
  // piece). A piece is written with no lock held when the next shard would not fit in it.
  // In the same step as a shard's copy, its checkpoint record of deleted keys moves to
  // deleted_in_save; `deleted` gets every shard's deleted_in_save (sorted, distinct): the keys
  // removed since the last committed save. layout.step is read before the first shard: a
  // row changed after its shard's copy is stamped with a later step by its update.
  Status Save(int64_t since_step, const SaveAllocator& allocate, std::vector<int64_t>* deleted);
  // A save is durable (TtfTableCommitSave): forgets the deleted keys saves took; deletions
  // recorded after each shard's copy stay for the next delta.
  void CommitSave();
  // Returns (and with reset, clears and starts) the deleted-key record `record`.
  void DeletedKeys(bool reset, std::vector<int64_t>* deleted, int record);
  // Replaces the content (or upserts into it, src.merge) from an export; validates `src`
  // completely before anything changes.
  Status Import(const ImportSource& src);

 private:
  // FindEach's ids without a DRAM row (n <= kFindEachSpan positions in `keys`): Find of each
  // shard's distinct keys among them, each row copied to out + position * dim.
  Status FindMissing(const int64_t* keys, const int32_t* positions, int64_t n, float* out) const;
  void DropOldestCandidates(TableShard* sh);
  // Sketch tables: imported candidates count as their sightings in the sketch (lock held).
  void FoldCandidatesIntoSketch(TableShard* sh);
  // After an update at step `now` (shard lock held exclusively): TTL sweep, then eviction
  // down to the shard's share of the capacity by policy, never touching rows updated at `now`.
  // Tiered: the capacity counts both tiers' rows, and rows leave either tier by the policy.
  Status EnforceCapacity(TableShard* sh, int64_t now);
  // Removes each key's row (DRAM or disk) and candidate and records it deleted; adds the rows
  // removed to *removed. Lock held exclusively. A failed disk read stops it there.
  Status RemoveKeys(TableShard* sh, const std::vector<int64_t>& keys, int64_t* removed);
  // Rebuilds a shard's stores densely when at most half their allocated rows are live, so
  // the freed chunks (and a too-large index) go back to the system. Lock held exclusively.
  // Returns whether the rows moved to new ids.
  bool CompactIfSparse(TableShard* sh);
  void RecordDeleted(TableShard* sh, int64_t key) {
    for (int r = 0; r < kNumDeletedRecords; ++r)
      if (track_deleted_[r].load(std::memory_order_relaxed)) sh->deleted_keys[r].push_back(key);
  }
  void CollectDeleted(bool reset, std::vector<int64_t>* deleted, int record);  // all shard locks held
  // With `lock` held exclusively on shard `s`, makes room for `extra` more keys in `ks`.
  // Allocation happens with the lock released; returns with it held again. The caller
  // must re-probe afterwards: other threads may have changed the shard meanwhile.
  void ReserveRoom(std::unique_lock<std::shared_mutex>& lock, KeyedStore* ks, int64_t extra);
  void FillDefault(float* out) const;
  // The most DRAM rows a shard of a tiered table keeps: its share of the budget, less its
  // disk tier's key index, over the bytes of a DRAM row (lock held).
  int64_t DramRowLimit(const TableShard& sh) const;
  // Whether the shard's disk index takes over half its share of dram_budget (warned once).
  bool IndexCrowdsDram(const TableShard& sh) const;
  // The most rows a shard of a capped table keeps (both tiers): its share of capacity, rounded
  // up, or of capacity_bytes over RowBytes at the current row width (lock held).
  int64_t CapacityRowLimit(const TableShard& sh) const;
  // Tiered, lock held exclusively: moves least recently updated rows to disk until the shard
  // holds at most DramRowLimit - `reserve` DRAM rows, never one whose key is in `keep`.
  // Sets *renumbered when the rows left moved to new ids (the store was compacted).
  Status Demote(TableShard* sh, int64_t reserve, const std::vector<int64_t>& keep, bool* renumbered);
  // One pass of it: down to 7/8 of `limit` rows.
  Status DemotePass(TableShard* sh, int64_t limit, const std::vector<int64_t>& keep, bool* renumbered);

  const TableConfig config_;
  std::vector<std::unique_ptr<TableShard>> shards_;
  std::atomic<int64_t> step_{0};
  // Set once by EnsureSlots/Import under every shard lock; read under any shard lock.
  std::string optimizer_;
  std::vector<float> slot_init_;
  // The deleted-key record is off until the first reset (nobody reads it before), so a
  // table that never makes delta checkpoints does not grow it. Its reads and resets are
  // serialised by deleted_mu_ (taken before any shard lock); appends hold the shard lock.
  std::atomic<bool> track_deleted_[kNumDeletedRecords] = {{false}, {false}};
  std::mutex deleted_mu_;
  // Held shared by Save for its whole span, exclusively by the slot re-layout and Import,
  // before any other lock: a save copies its shards under one layout and one content.
  std::shared_mutex relayout_mu_;
  std::atomic<bool> index_warned_{false};  // the disk index took over half a shard's budget (logged once)
};

// The distinct keys of a batch, ordered by shard: keys[offsets[s] .. offsets[s+1]) all
// live in shard s. inverse[p] is the position in `keys` of input key p.
struct GroupedKeys {
  std::vector<int64_t> keys;
  std::vector<uint64_t> hashes;
  std::vector<int64_t> offsets;  // num_shards + 1
  std::vector<int32_t> inverse;
  int64_t size() const { return static_cast<int64_t>(keys.size()); }
};

inline void GroupKeys(const int64_t* keys, int64_t n, const EmbeddingTable& table, GroupedKeys* out) {
  // De-duplicate with a local open-addressing set sized for a load factor <= 1/2, holding
  // each slot's key beside its position (no second, dependent load per probe), its slots
  // prefetched 16 keys ahead (a set of 2n slots outgrows the L1 cache).
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  const uint64_t mask = cap - 1;
  // Per-thread scratch reused across calls: large fresh buffers would page-fault every step.
  // Bound to references once: each access to a thread_local of a shared library is a call.
  thread_local std::vector<uint64_t> tl_hashes;
  thread_local std::vector<int32_t> tl_slot_pos;   // -1: empty, else the key's index in first_keys
  thread_local std::vector<int64_t> tl_slot_keys;  // read only where slot_pos >= 0
  thread_local std::vector<int64_t> tl_first_keys;
  thread_local std::vector<uint64_t> tl_first_hashes;
  std::vector<uint64_t>& hashes = tl_hashes;
  std::vector<int32_t>& slot_pos = tl_slot_pos;
  std::vector<int64_t>& slot_keys = tl_slot_keys;
  std::vector<int64_t>& first_keys = tl_first_keys;
  std::vector<uint64_t>& first_hashes = tl_first_hashes;
  hashes.resize(n);
  for (int64_t p = 0; p < n; ++p) hashes[p] = HashKey(keys[p]);
  slot_pos.assign(cap, -1);
  if (static_cast<int64_t>(slot_keys.size()) < cap) slot_keys.resize(cap);
  if (static_cast<int64_t>(first_keys.size()) < n) first_keys.resize(n), first_hashes.resize(n);
  out->inverse.resize(n);
  int32_t* inverse = out->inverse.data();
  int32_t u = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (p + 16 < n) {
      const uint64_t ahead = hashes[p + 16] & mask;
      __builtin_prefetch(&slot_pos[ahead]);
      __builtin_prefetch(&slot_keys[ahead]);
    }
    const int64_t key = keys[p];
    uint64_t pos = hashes[p] & mask;
    while (slot_pos[pos] >= 0 && slot_keys[pos] != key) pos = (pos + 1) & mask;
    if (slot_pos[pos] < 0) {
      slot_pos[pos] = u;
      slot_keys[pos] = key;
      first_keys[u] = key;
      first_hashes[u] = hashes[p];
      ++u;
    }
    inverse[p] = slot_pos[pos];
  }
  // Counting sort of the distinct keys by shard; remap inverse to the sorted order.
  const int num_shards = table.num_shards();
  thread_local std::vector<int32_t> tl_shard_of, tl_new_pos;
  std::vector<int32_t>& shard_of = tl_shard_of;
  std::vector<int32_t>& new_pos = tl_new_pos;
  shard_of.resize(u);
  out->offsets.assign(num_shards + 1, 0);
  for (int64_t i = 0; i < u; ++i) {
    shard_of[i] = table.ShardOf(first_hashes[i]);
    ++out->offsets[shard_of[i] + 1];
  }
  for (int s = 0; s < num_shards; ++s) out->offsets[s + 1] += out->offsets[s];
  std::vector<int64_t> cursor(out->offsets.begin(), out->offsets.end() - 1);
  new_pos.resize(u);
  out->keys.resize(u);
  out->hashes.resize(u);
  for (int64_t i = 0; i < u; ++i) {
    const int64_t dst = cursor[shard_of[i]]++;
    new_pos[i] = static_cast<int32_t>(dst);
    out->keys[dst] = first_keys[i];
    out->hashes[dst] = first_hashes[i];
  }
  for (int64_t p = 0; p < n; ++p) inverse[p] = new_pos[inverse[p]];
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_EMBEDDING_TABLE_H_
