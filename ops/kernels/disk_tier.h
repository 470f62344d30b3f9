// A shard's disk tier: its key index (DiskIndex) and its file of rows (DiskTier). What moves
// rows between DRAM and disk, and when, is the tiering's (tiering.h).
#ifndef TTF_OPS_KERNELS_DISK_TIER_H_
#define TTF_OPS_KERNELS_DISK_TIER_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "row_store.h"
#include "table_hash.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

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
  // Rewrites the live records into a new file, sequentially; with a wider stride, each row's
  // old words are followed by what init_slots(row) writes (the slots' initial values in the
  // table's row layout). On failure the tier is unchanged.
  Status Rewrite(int64_t new_stride, const std::function<void(float* row)>& init_slots);
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
}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_DISK_TIER_H_
