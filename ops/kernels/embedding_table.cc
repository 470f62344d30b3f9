#include "embedding_table.h"
#include "disk_reads.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/logging.h"

namespace tensorflow {
namespace ttf {
namespace {
// Hands memory freed by the allocator back to the system. glibc keeps freed pages in the
// arena of the thread that allocated them; without this, RSS would not fall after an
// eviction or a restore frees rows.
void ReleaseFreedMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}
}  // namespace

Status ParseInitKind(const std::string& name, InitKind* kind) {
  if (name == "normal") *kind = InitKind::kNormal;
  else if (name == "truncated_normal") *kind = InitKind::kTruncatedNormal;
  else if (name == "uniform") *kind = InitKind::kUniform;
  else if (name == "zeros") *kind = InitKind::kZeros;
  else if (name == "constant") *kind = InitKind::kConstant;
  else
    return errors::InvalidArgument("initializer must be one of normal, truncated_normal, uniform, zeros, ",
                                   "constant; got '", name, "'");
  return OkStatus();
}

Status ParseEvictPolicy(const std::string& name, EvictPolicy* policy) {
  if (name == "lru") *policy = EvictPolicy::kLru;
  else if (name == "lfu") *policy = EvictPolicy::kLfu;
  else if (name == "ttl") *policy = EvictPolicy::kTtl;
  else return errors::InvalidArgument("evict_policy must be one of lru, lfu, ttl; got '", name, "'");
  return OkStatus();
}

bool TableConfig::operator==(const TableConfig& o) const {
  return dim == o.dim && init.kind == o.init.kind && init.a == o.init.a && init.b == o.init.b &&
         init.seed == o.init.seed && default_value == o.default_value &&
         admission_min_count == o.admission_min_count && max_candidates == o.max_candidates &&
         num_shards == o.num_shards && capacity == o.capacity && capacity_bytes == o.capacity_bytes &&
         evict_policy == o.evict_policy && ttl_steps == o.ttl_steps && dram_budget == o.dram_budget && ssd_dir == o.ssd_dir &&
         admission_sketch_bytes == o.admission_sketch_bytes;
}

std::string TableConfig::DebugString() const {
  static const char* kKinds[] = {"normal", "truncated_normal", "uniform", "zeros", "constant"};
  static const char* kPolicies[] = {"lru", "lfu", "ttl"};
  return strings::StrCat("dim=", dim, ", initializer=", kKinds[static_cast<int>(init.kind)], ", init_a=", init.a,
                         ", init_b=", init.b, ", seed=", init.seed, ", default_value=", default_value,
                         ", admission_min_count=", admission_min_count, ", max_candidates=", max_candidates,
                         ", num_shards=", num_shards, ", capacity=", capacity,
                         ", capacity_bytes=", capacity_bytes, ", evict_policy=",
                         kPolicies[static_cast<int>(evict_policy)], ", ttl_steps=", ttl_steps,
                         ", dram_budget=", dram_budget, ", ssd_dir='", ssd_dir,
                         "', admission_sketch_bytes=", admission_sketch_bytes);
}

Status ValidateConfig(const TableConfig& c) {
  if (c.dim < 1 || c.dim > kMaxDim)
    return errors::InvalidArgument("dim must be in [1, ", kMaxDim, "], got ", c.dim);
  if (c.num_shards < 1 || c.num_shards > kMaxShards)
    return errors::InvalidArgument("num_shards must be in [1, ", kMaxShards, "], got ", c.num_shards);
  if (c.admission_min_count < 0)
    return errors::InvalidArgument("admission_min_count must be >= 0, got ", c.admission_min_count);
  if (c.max_candidates < 1 || c.max_candidates > kMaxCandidates)
    return errors::InvalidArgument("max_candidates must be in [1, ", kMaxCandidates, "], got ", c.max_candidates);
  if (c.admission_sketch_bytes < 0 || c.admission_sketch_bytes > (int64_t{1} << 40))
    return errors::InvalidArgument("admission_sketch_bytes must be in [0, 2^40], got ", c.admission_sketch_bytes);
  if (c.admission_sketch_bytes > 0 && c.admission_min_count == 0)
    return errors::InvalidArgument("admission_sketch_bytes (", c.admission_sketch_bytes,
                                   ") counts admission sightings: set admission_min_count > 0 too, or leave it 0");
  if (c.admission_sketch_bytes > 0 && c.admission_sketch_bytes / c.num_shards < 512)
    return errors::InvalidArgument("admission_sketch_bytes (", c.admission_sketch_bytes, ") must give each of the ",
                                   c.num_shards, " shards at least 512 bytes");
  if (c.capacity < 0) return errors::InvalidArgument("capacity must be >= 0 (0: unbounded), got ", c.capacity);
  if (c.capacity_bytes < 0)
    return errors::InvalidArgument("capacity_bytes must be >= 0 (0: no byte capacity), got ", c.capacity_bytes);
  if (c.capacity > 0 && c.capacity_bytes > 0)
    return errors::InvalidArgument("capacity (", c.capacity, " rows) and capacity_bytes (", c.capacity_bytes,
                                   ") both set: give the capacity in rows or in bytes, not both");
  if (c.capacity_bytes > 0 && c.dram_budget > 0)
    return errors::InvalidArgument("capacity_bytes (", c.capacity_bytes, ") with dram_budget (", c.dram_budget,
                                   "): a tiered table's RAM is already bounded by dram_budget; use capacity (rows) "
                                   "to bound both tiers");
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(c, c.dim));
  if (c.ttl_steps < 0) return errors::InvalidArgument("ttl_steps must be >= 0, got ", c.ttl_steps);
  if (c.dram_budget < 0) return errors::InvalidArgument("dram_budget must be >= 0 bytes (0: no SSD tier), got ", c.dram_budget);
  if (c.tiered() == c.ssd_dir.empty())
    return errors::InvalidArgument("dram_budget (", c.dram_budget, ") and ssd_dir ('", c.ssd_dir,
                                   "') go together: set both for a DRAM + SSD tier, or neither");
  if ((c.evict_policy == EvictPolicy::kTtl) != (c.ttl_steps > 0))
    return errors::InvalidArgument("ttl_steps (", c.ttl_steps, ") must be > 0 exactly when evict_policy is 'ttl'");
  if (!std::isfinite(c.init.a) || !std::isfinite(c.init.b))
    return errors::InvalidArgument("init_a and init_b must be finite, got ", c.init.a, " and ", c.init.b);
  if (!std::isfinite(c.default_value))
    return errors::InvalidArgument("default_value must be finite, got ", c.default_value);
  const InitKind kind = c.init.kind;
  if ((kind == InitKind::kNormal || kind == InitKind::kTruncatedNormal) && !(c.init.b > 0))
    return errors::InvalidArgument("initializer '", kind == InitKind::kNormal ? "normal" : "truncated_normal",
                                   "' needs a stddev (init_b) > 0, got ", c.init.b);
  if (kind == InitKind::kUniform && !(c.init.a < c.init.b))
    return errors::InvalidArgument("uniform initializer needs minval (init_a) < maxval (init_b), got ", c.init.a,
                                   " and ", c.init.b);
  return OkStatus();
}

Status CheckCapacityBytesHoldARow(const TableConfig& c, int64_t stride) {
  if (c.capacity_bytes == 0 || c.capacity_bytes / c.num_shards >= RowBytes(stride)) return OkStatus();
  return errors::InvalidArgument("capacity_bytes (", c.capacity_bytes, ") gives each of the ", c.num_shards,
                                 " shards ", c.capacity_bytes / c.num_shards, " bytes, below one row of ",
                                 RowBytes(stride), " bytes (", stride / c.dim - 1,
                                 " optimizer slot(s) at dim ", c.dim, "): raise it to at least ",
                                 RowBytes(stride) * c.num_shards, " or use fewer num_shards");
}

bool SlotsOfOptimizer(const std::string& optimizer, int64_t* num_slots) {
  if (optimizer.empty() || optimizer == "sgd") *num_slots = 0;
  else if (optimizer == "adagrad") *num_slots = 1;
  else if (optimizer == "adam" || optimizer == "ftrl") *num_slots = 2;
  else return false;
  return true;
}

namespace {
// Uniform in (0, 1) from counter `c` of the key's stream: 53 random bits, never 0 or 1.
inline double Uniform01(uint64_t stream, uint64_t c) {
  return (static_cast<double>(Mix64(stream + c) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
// Standard normal by Box-Muller from two uniforms of the stream.
inline double Normal(uint64_t stream, uint64_t c) {
  const double u1 = Uniform01(stream, c), u2 = Uniform01(stream, c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

void RowInitializer::Fill(int64_t key, float* row, int64_t dim) const {
  // Each element j draws from its own counter range (j << 8), so element values do not
  // depend on dim, and truncated-normal redraws (up to 127) never overlap the next element.
  const uint64_t stream = Mix64(static_cast<uint64_t>(seed) ^ Mix64(static_cast<uint64_t>(key)));
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t c = static_cast<uint64_t>(j) << 8;
    double v = 0.0;
    switch (kind) {
      case InitKind::kZeros: v = 0.0; break;
      case InitKind::kConstant: v = a; break;
      case InitKind::kUniform: v = a + (b - a) * Uniform01(stream, c); break;
      case InitKind::kNormal: v = a + b * Normal(stream, c); break;
      case InitKind::kTruncatedNormal: {
        double z = Normal(stream, c);
        for (uint64_t t = 1; std::fabs(z) > 2.0 && t < 127; ++t) z = Normal(stream, c + 2 * t);
        if (std::fabs(z) > 2.0) z = 0.0;  // probability ~1e-170: keep the bound exact
        v = a + b * z;
        break;
      }
    }
    row[j] = static_cast<float>(v);
  }
}

// ---------------------------------------------------------------- AllocatePages

namespace {
constexpr size_t kPageBytes = 4096;
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kSmallBlockBytes = size_t{64} << 10;  // below: operator new (too small to matter)
constexpr size_t kSlabBytes = size_t{16} << 20;        // 8 huge pages: a slab's unused tail is < one block
constexpr size_t kSmallAlignment = 64;                 // a cache line

size_t RoundUp(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

// `bytes` (a multiple of kHugePageBytes) of zeroed memory at a 2 MiB boundary, marked for
// transparent huge pages. MAP_NORESERVE: untouched slab tails take no commit charge.
char* MapHugeAligned(size_t bytes) {
  const size_t padded = bytes + kHugePageBytes;
  void* mapped = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = RoundUp(start, kHugePageBytes);
  if (aligned > start) ::munmap(mapped, aligned - start);
  const uintptr_t end = aligned + bytes;
  if (start + padded > end) ::munmap(reinterpret_cast<void*>(end), start + padded - end);
  // Best effort: a kernel without THP (or with it "never") keeps 4 KiB pages, and all still works.
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(aligned);
}

// Slabs carved front to back (a bump pointer: blocks live long, a chunk of rows or an index,
// and are freed in bulk by compaction, re-layout and restore). A freed block's range is not
// reused: its pages are returned, and the slab goes once its last block does. Blocks above
// half a slab get a mapping of their own. One arena per process, as malloc is: a row chunk
// is allocated outside any shard lock (ReserveRoom) and outlives nothing but its table.
class PageArena {
 public:
  static PageArena& Get() {
    static PageArena* arena = new PageArena;  // never destroyed: tables may free blocks at exit
    return *arena;
  }
  void* Allocate(size_t bytes) {
    bytes = RoundUp(bytes, kPageBytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > kSlabBytes / 2) {
      const size_t size = RoundUp(bytes, kHugePageBytes);
      char* base = MapHugeAligned(size);
      slabs_[base] = Slab{size, size, bytes};
      return base;
    }
    if (current_ == nullptr || slabs_[current_].used + bytes > kSlabBytes) {
      if (current_ != nullptr && slabs_[current_].live == 0) Unmap(slabs_.find(current_));
      current_ = MapHugeAligned(kSlabBytes);
      slabs_[current_] = Slab{kSlabBytes, 0, 0};
    }
    Slab& slab = slabs_[current_];
    char* block = current_ + slab.used;
    slab.used += bytes;
    slab.live += bytes;
    return block;
  }
  void Free(void* block, size_t bytes) {
    bytes = RoundUp(bytes, kPageBytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slabs_.upper_bound(static_cast<char*>(block));
    --it;  // the slab starting at or before the block
    it->second.live -= bytes;
    if (it->second.live == 0) {
      Unmap(it);
    } else {
      ::madvise(block, bytes, MADV_DONTNEED);  // RSS falls now; the slab stays for its other blocks
    }
  }

 private:
  struct Slab {
    size_t size, used, live;  // bytes: mapped, carved, carved and not freed
  };
  void Unmap(std::map<char*, Slab>::iterator it) {
    ::munmap(it->first, it->second.size);
    if (it->first == current_) current_ = nullptr;
    slabs_.erase(it);
  }
  std::mutex mu_;
  std::map<char*, Slab> slabs_;  // by base address
  char* current_ = nullptr;      // the slab being carved
};
}  // namespace

void* AllocatePages(size_t bytes) {
  if (bytes < kSmallBlockBytes) return ::operator new(bytes, std::align_val_t(kSmallAlignment));
  return PageArena::Get().Allocate(bytes);
}

void FreePages(void* block, size_t bytes) {
  if (bytes < kSmallBlockBytes) return ::operator delete(block, std::align_val_t(kSmallAlignment));
  PageArena::Get().Free(block, bytes);
}

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

void RowStore::Widen(int64_t new_stride, const std::vector<float>& fill_per_slot, int64_t dim) {
  for (Chunk& chunk : chunks_) {
    PageArray<float> wider(kChunkRows * new_stride);
    for (int64_t r = 0; r < kChunkRows; ++r) {
      float* dst = wider.get() + r * new_stride;
      std::memcpy(dst, chunk.values.get() + r * stride_, stride_ * sizeof(float));
      for (int64_t f = stride_; f < new_stride; ++f) dst[f] = fill_per_slot[f / dim - 1];
    }
    chunk.values = std::move(wider);
  }
  stride_ = new_stride;
}

// ---------------------------------------------------------------- DiskIndex

bool DiskIndex::Holds(uint32_t fingerprint, uint32_t slot) const {
  uint64_t pos = Home(fingerprint);
  for (uint32_t found; (found = NextCandidate(fingerprint, &pos)) != kNone;)
    if (found == slot) return true;
  return false;
}

void DiskIndex::Reserve(int64_t extra) {
  const int64_t needed = size_ + extra;
  if (needed * 4 <= static_cast<int64_t>(entries_.size()) * 3) return;
  // Rehashed into 5/3 of the entries (a load of 3/5): with the growth at 3/4, the load stays
  // in [3/5, 3/4], so entries take 10.7-13.3 bytes a key (16-32 for a table that doubles).
  std::vector<uint64_t> old(std::max<int64_t>(16, needed * 5 / 3), Entry(0, kNone));
  std::swap(entries_, old);
  size_ = 0;
  for (uint64_t entry : old)
    if (static_cast<uint32_t>(entry) != kNone) Insert(static_cast<uint32_t>(entry >> 32), static_cast<uint32_t>(entry));
}

void DiskIndex::Insert(uint32_t fingerprint, uint32_t slot) {
  uint64_t pos = Home(fingerprint);
  while (static_cast<uint32_t>(entries_[pos]) != kNone) pos = pos + 1 == entries_.size() ? 0 : pos + 1;
  entries_[pos] = Entry(fingerprint, slot);
  ++size_;
}

void DiskIndex::Erase(uint32_t fingerprint, uint32_t slot) {
  const uint64_t n = entries_.size(), target = Entry(fingerprint, slot);
  uint64_t pos = Home(fingerprint);
  while (entries_[pos] != target) pos = pos + 1 == n ? 0 : pos + 1;
  // Backward-shift deletion, as in KeyIndex::Erase: pull later entries of the probe run into
  // the hole when their home does not lie cyclically in (hole, current].
  uint64_t hole = pos;
  for (uint64_t cur = pos + 1 == n ? 0 : pos + 1; static_cast<uint32_t>(entries_[cur]) != kNone;
       cur = cur + 1 == n ? 0 : cur + 1) {
    const uint64_t home = Home(static_cast<uint32_t>(entries_[cur] >> 32));
    const bool stays = (hole <= cur) ? (hole < home && home <= cur) : (hole < home || home <= cur);
    if (!stays) {
      entries_[hole] = entries_[cur];
      hole = cur;
    }
  }
  entries_[hole] = Entry(0, kNone);
  --size_;
}

// ---------------------------------------------------------------- DiskTier

namespace {
Status DiskError(const std::string& dir, const char* what, int err) {
  const std::string why = std::strerror(err);
  if (err == ENOSPC || err == EFBIG || err == EDQUOT)
    return errors::ResourceExhausted("the SSD tier under ssd_dir '", dir, "' is full (", what, ": ", why,
                                     "); the table is unchanged by the failed write (the row stays in DRAM). ",
                                     "Free space there, point ssd_dir (--ssd-dir) at a larger disk, or raise ",
                                     "dram_budget (--dram-budget).");
  return errors::Internal("the SSD tier under ssd_dir '", dir, "' failed (", what, ": ", why, ")");
}
}  // namespace

DiskTier::~DiskTier() {
  if (fd_ >= 0) ::close(fd_);
}

Status DiskTier::Open(const std::string& dir, int64_t stride) {
  dir_ = dir;
  stride_ = stride;
  std::string path = dir + "/ttf-ssd-tier-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  if (fd_ < 0)
    return errors::InvalidArgument("ssd_dir '", dir, "' cannot be written (creating a file there: ",
                                   std::strerror(errno), "); give a writable directory");
  ::unlink(buf.data());  // a cache only this process sees: gone with it, even after kill -9
  // Records are read one at a time at random places: the kernel's readahead (up to 128 KiB a
  // read) was most of a tiered step's CPU time once the file outgrew the page cache
  // (profiled at 100M keys), and it evicts useful cached pages for pages never read.
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  return OkStatus();
}

namespace {
// Writes `bytes` at `offset`, retrying short writes; a full disk comes back as the error.
Status WriteAll(int fd, const std::string& dir, const char* data, int64_t bytes, off_t offset) {
  for (int64_t done = 0; done < bytes;) {
    const ssize_t w = ::pwrite(fd, data + done, bytes - done, offset + done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return DiskError(dir, "writing rows", w < 0 ? errno : ENOSPC);
    done += w;
  }
  return OkStatus();
}
}  // namespace

Status DiskReadAll(int fd, const std::string& dir, char* data, int64_t bytes, int64_t offset) {
  for (int64_t done = 0; done < bytes;) {
    const ssize_t r = ::pread(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return DiskError(dir, "reading rows", r < 0 ? errno : EIO);
    done += r;
  }
  return OkStatus();
}

Status DiskTier::Append(int64_t n, const int64_t* keys, const RowMeta* const* metas, const float* const* rows) {
  const int64_t bytes = record_bytes();
  if (static_cast<int64_t>(next_slot_) + n > kMaxRecords)
    return errors::ResourceExhausted("the SSD tier of one table shard holds at most ", kMaxRecords,
                                     " records; use more num_shards");
  buffer_.resize(n * bytes);
  for (int64_t i = 0; i < n; ++i) {
    char* record = buffer_.data() + i * bytes;
    const int64_t header[kHeaderWords] = {keys[i], metas[i]->count, metas[i]->last_seen};
    std::memcpy(record, header, sizeof(header));
    std::memcpy(record + sizeof(header), rows[i], stride_ * sizeof(float));
  }
  TF_RETURN_IF_ERROR(WriteAll(fd_, dir_, buffer_.data(), n * bytes, static_cast<off_t>(next_slot_) * bytes));
  index.Reserve(n);  // grows under the lock: a demotion already pays a write
  for (int64_t i = 0; i < n; ++i) {
    if (i + 8 < n) index.Prefetch(DiskIndex::Fingerprint(HashKey(keys[i + 8])));  // a miss in a large index
    index.Insert(DiskIndex::Fingerprint(HashKey(keys[i])), next_slot_++);
  }
  return OkStatus();
}

Status DiskTier::Locate(int64_t key, uint64_t hash, uint32_t* slot, RowMeta* meta, float* row,
                        int64_t floats) const {
  *slot = DiskIndex::kNone;
  const uint32_t fingerprint = DiskIndex::Fingerprint(hash);
  uint64_t pos = index.Home(fingerprint);
  thread_local std::vector<char> record;  // header and the floats asked for: one read
  record.resize(kHeaderWords * 8 + floats * sizeof(float));
  for (uint32_t candidate; (candidate = index.NextCandidate(fingerprint, &pos)) != DiskIndex::kNone;) {
    TF_RETURN_IF_ERROR(
        DiskReadAll(fd_, dir_, record.data(), record.size(), static_cast<int64_t>(candidate) * record_bytes()));
    if (Take(key, record.data(), meta, row, floats)) {
      *slot = candidate;
      break;
    }
  }
  return OkStatus();
}

bool DiskTier::Take(int64_t key, const char* record, RowMeta* meta, float* row, int64_t floats) {
  int64_t header[kHeaderWords];
  std::memcpy(header, record, sizeof(header));
  if (header[0] != key) return false;  // another key with the same fingerprint
  if (meta != nullptr) *meta = RowMeta{header[1], header[2]};
  if (floats > 0) std::memcpy(row, record + sizeof(header), floats * sizeof(float));
  return true;
}

Status DiskTier::LocateMany(int64_t n, const int64_t* keys, const uint64_t* hashes, uint32_t* slots,
                            RowMeta* metas, float* rows, int64_t floats, int64_t* waited) const {
  // Each key's first candidate record is read, all in one ReadMany; a key whose record holds
  // another key (a fingerprint shared with it: a 2^-32 chance) is then looked up alone.
  const int64_t bytes = kHeaderWords * 8 + floats * sizeof(float);
  thread_local std::vector<char> records;
  thread_local std::vector<DiskRead> reads;
  thread_local std::vector<int64_t> read_keys;  // the key of each read
  thread_local std::vector<uint32_t> read_slots;
  records.resize(n * bytes);
  reads.clear(), read_keys.clear(), read_slots.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i + 8 < n) index.Prefetch(DiskIndex::Fingerprint(hashes[i + 8]));
    slots[i] = DiskIndex::kNone;
    const uint32_t fingerprint = DiskIndex::Fingerprint(hashes[i]);
    uint64_t pos = index.Home(fingerprint);
    const uint32_t candidate = index.NextCandidate(fingerprint, &pos);
    if (candidate == DiskIndex::kNone) continue;  // not on disk
    reads.push_back(DiskRead{records.data() + reads.size() * bytes, bytes,
                             static_cast<int64_t>(candidate) * record_bytes()});
    read_keys.push_back(i);
    read_slots.push_back(candidate);
  }
  TF_RETURN_IF_ERROR(ReadMany(fd_, dir_, static_cast<int64_t>(reads.size()), reads.data(), waited));
  for (size_t j = 0; j < reads.size(); ++j) {
    const int64_t i = read_keys[j];
    RowMeta* meta = metas == nullptr ? nullptr : &metas[i];
    if (Take(keys[i], reads[j].data, meta, rows + i * floats, floats)) {
      slots[i] = read_slots[j];
    } else {
      TF_RETURN_IF_ERROR(Locate(keys[i], hashes[i], &slots[i], meta, rows + i * floats, floats));
    }
  }
  return OkStatus();
}

Status DiskTier::Remove(int64_t key, uint64_t hash, bool* removed) {
  uint32_t slot;
  TF_RETURN_IF_ERROR(Locate(key, hash, &slot, nullptr, nullptr, 0));
  *removed = slot != DiskIndex::kNone;
  if (*removed) Drop(hash, slot);
  return OkStatus();
}

void DiskTier::Clear() {
  index = DiskIndex();
  ++generation_;
  next_slot_ = 0;
  if (fd_ >= 0 && ::ftruncate(fd_, 0) != 0) {
    // Nothing to do: every record is stale either way, the file is only longer than needed.
  }
}

Status DiskTier::CompactIfStale() {
  const int64_t stale = static_cast<int64_t>(next_slot_) - index.size();
  if (stale < 4096 || stale <= index.size()) return OkStatus();
  return Rewrite(stride_, {}, 1);
}

Status DiskTier::Rewrite(int64_t new_stride, const std::vector<float>& fill_per_slot, int64_t dim) {
  if (fd_ < 0 || index.size() == 0) {
    Clear();
    stride_ = new_stride;
    return OkStatus();
  }
  DiskTier fresh;
  TF_RETURN_IF_ERROR(fresh.Open(dir_, new_stride));
  fresh.index.Reserve(index.size());
  const int64_t new_bytes = fresh.record_bytes();
  const int64_t per_write = std::max<int64_t>(1, (4 << 20) / new_bytes);  // ~4 MiB written at a time
  std::vector<int64_t> keys;
  auto flush = [&]() -> Status {
    TF_RETURN_IF_ERROR(WriteAll(fresh.fd_, dir_, fresh.buffer_.data(), fresh.buffer_.size(),
                                static_cast<off_t>(fresh.next_slot_) * new_bytes));
    for (int64_t key : keys) fresh.index.Insert(DiskIndex::Fingerprint(HashKey(key)), fresh.next_slot_++);
    fresh.buffer_.clear();
    keys.clear();
    return OkStatus();
  };
  Status written = OkStatus();
  TF_RETURN_IF_ERROR(ForEachLive([&](int64_t key, const RowMeta& meta, const float* old_row) {
    if (!written.ok()) return;
    const size_t at = fresh.buffer_.size();
    fresh.buffer_.resize(at + new_bytes);
    char* record = fresh.buffer_.data() + at;
    const int64_t header[kHeaderWords] = {key, meta.count, meta.last_seen};
    std::memcpy(record, header, sizeof(header));
    float* row = reinterpret_cast<float*>(record + sizeof(header));
    std::memcpy(row, old_row, stride_ * sizeof(float));
    for (int64_t f = stride_; f < new_stride; ++f) row[f] = fill_per_slot[f / dim - 1];
    keys.push_back(key);
    if (static_cast<int64_t>(keys.size()) == per_write) written = flush();
  }));
  TF_RETURN_IF_ERROR(written);
  TF_RETURN_IF_ERROR(flush());
  std::swap(fd_, fresh.fd_);  // `fresh` now closes the old file
  std::swap(index, fresh.index);
  std::swap(next_slot_, fresh.next_slot_);
  ++generation_;
  stride_ = new_stride;
  return OkStatus();
}

// ---------------------------------------------------------------- EmbeddingTable

EmbeddingTable::EmbeddingTable(const TableConfig& config) : config_(config) {
  shards_.reserve(config.num_shards);
  for (int i = 0; i < config.num_shards; ++i) {
    shards_.emplace_back(new TableShard(config.dim));
    if (config.admission_sketch_bytes > 0)
      shards_.back()->sketch = AdmissionSketch(config.admission_sketch_bytes / config.num_shards);
  }
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
  if (!config_.tiered()) return OkStatus();
  for (auto& sh : shards_) {
    std::unique_lock<std::shared_mutex> lock(sh->mu);
    if (!sh->disk.open()) TF_RETURN_IF_ERROR(sh->disk.Open(config_.ssd_dir, sh->rows.store.stride()));
  }
  return OkStatus();
}

int64_t EmbeddingTable::DramRowLimit(const TableShard& sh) const {
  // Per row: RowBytes. The disk tier's key index is RAM too and counts inside the budget:
  // DRAM holds what is left.
  const int64_t left = config_.dram_budget / num_shards() - sh.disk.index.bytes();
  return std::max<int64_t>(1, left / RowBytes(sh.rows.store.stride()));
}

int64_t EmbeddingTable::CapacityRowLimit(const TableShard& sh) const {
  // Bytes: at the current width, which grows when an optimizer adds its slots (Adam: 3x dim).
  if (config_.capacity_bytes > 0) return config_.capacity_bytes / num_shards() / RowBytes(sh.rows.store.stride());
  return (config_.capacity + num_shards() - 1) / num_shards();
}

bool EmbeddingTable::IndexCrowdsDram(const TableShard& sh) const {
  return config_.tiered() && sh.disk.index.bytes() > config_.dram_budget / num_shards() / 2;
}

Status EmbeddingTable::Demote(TableShard* sh, int64_t reserve, const std::vector<int64_t>& keep, bool* renumbered) {
  if (IndexCrowdsDram(*sh) && !index_warned_.exchange(true)) {
    // Straight to stderr, once a table: TensorFlow's C++ log follows TF_CPP_MIN_LOG_LEVEL, which
    // many jobs (ttf's train.py among them) set to hide TensorFlow's own lines.
    std::fprintf(stderr,
                 "ttf warning: the SSD tier's key index of a table shard takes %lld bytes of its %lld-byte share "
                 "of dram_budget, leaving DRAM %lld rows: more rows are read from disk. Raise dram_budget "
                 "(--dram-budget). tier_stats()['crowded_shards'] counts such shards.\n",
                 static_cast<long long>(sh->disk.index.bytes()),
                 static_cast<long long>(config_.dram_budget / num_shards()),
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
    TF_RETURN_IF_ERROR(sh->disk.Append(keys.size(), keys.data(), metas.data(), rows.data()));
    for (int64_t key : keys) sh->rows.Remove(key, HashKey(key));
    sh->rows_demoted += keys.size();
  }
  return OkStatus();
}
}  // namespace

Status EmbeddingTable::DemotePass(TableShard* sh, int64_t limit, const std::vector<int64_t>& keep,
                                  bool* renumbered) {
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
  sh->last_demoted = victims[drop - 1];  // the DRAM admission's bar (TouchKeys)
  TF_RETURN_IF_ERROR(MoveToDisk(sh, drop, [&](size_t i) { return std::make_pair(victims[i].key, victims[i].id); }));
  TF_RETURN_IF_ERROR(sh->disk.CompactIfStale());
  // The demoted rows' chunks go back to the system once half are free.
  if (CompactIfSparse(sh) && renumbered != nullptr) *renumbered = true;
  return OkStatus();
}

Status EmbeddingTable::TouchKeys(int s, std::unique_lock<std::shared_mutex>& lock, const int64_t* keys,
                               const uint64_t* hashes, int64_t n, int64_t now, uint32_t* ids) {
  TableShard& sh = *shards_[s];
  const int64_t dim = config_.dim;
  const int64_t min_count = config_.admission_min_count;
  const int64_t candidates_per_shard = std::max<int64_t>(1, config_.max_candidates / num_shards());
  int64_t missing = -1;  // keys without a DRAM row; -1: not probed yet (ids not valid)
  sh.write_back.clear();
  if (config_.tiered()) {
    // Make DRAM room for this update's missing keys first, so a failed write (a full disk)
    // returns before any key of this update changed. This update's own rows never leave.
    // Demotion moves only rows outside this update, so the ids probed here stay valid
    // unless it compacted the store (new ids): then the loop below probes again.
    missing = ProbeAll(sh.rows, keys, hashes, n, ids);
    if (sh.rows.index.size() > std::max<int64_t>(0, DramRowLimit(sh) - missing)) {
      const std::vector<int64_t> keep(keys, keys + n);
      bool renumbered = false;
      TF_RETURN_IF_ERROR(Demote(&sh, missing, keep, &renumbered));
      if (renumbered) missing = -1;
    }
  }
  while (true) {
    // Probe every key once, remembering its row id. Repeated after a ReserveRoom, which
    // releases the lock (other threads may insert or evict meanwhile).
    if (missing < 0) missing = ProbeAll(sh.rows, keys, hashes, n, ids);
    if (missing == 0) break;
    if (min_count > 0 && !sh.sketch.enabled() && !sh.candidates.HasRoom(missing)) {
      ReserveRoom(lock, &sh.candidates, missing);
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
  const int64_t stride = sh.rows.store.stride();
  const bool tiered = config_.tiered();
  const bool lfu = config_.evict_policy == EvictPolicy::kLfu;
  for (int64_t i = 0; i < n; ++i) {
    if (i + 4 < n && ids[i + 4] != KeyIndex::kNone) {
      __builtin_prefetch(&sh.rows.store.meta(ids[i + 4]), 1);
    } else if (tiered && i + 4 < n) {  // a promotion's index probe: a cache miss in a large index
      sh.disk.index.Prefetch(DiskIndex::Fingerprint(hashes[i + 4]));
    }
    if (ids[i] != KeyIndex::kNone) {
      RowMeta& m = sh.rows.store.meta(ids[i]);
      ++m.count;
      m.last_seen = now;
      continue;
    }
    if (tiered) {  // on disk: promote it (room is reserved; the DRAM row is filled from disk)
      // A record staged by this step's lookup is the key's live record when its slot is
      // still in the index under the key's fingerprint (same generation: records never
      // change in place); otherwise the record is read (and its key checked) here.
      uint32_t slot = DiskIndex::kNone;
      RowMeta meta;
      const char* record = nullptr;
      const auto staged = sh.staged.find(keys[i]);
      if (staged != sh.staged.end() && staged->second.generation == sh.disk.generation() &&
          sh.disk.index.Holds(DiskIndex::Fingerprint(hashes[i]), staged->second.slot)) {
        slot = staged->second.slot;
        record = sh.staged_bytes.data() + staged->second.offset;
      } else {
        thread_local std::vector<char> read;
        read.resize(sizeof(RowMeta) + stride * sizeof(float));
        TF_RETURN_IF_ERROR(sh.disk.Locate(keys[i], hashes[i], &slot, reinterpret_cast<RowMeta*>(read.data()),
                                          reinterpret_cast<float*>(read.data() + sizeof(RowMeta)), stride));
        record = read.data();
      }
      if (slot != DiskIndex::kNone) {
        const uint32_t id = sh.rows.Add(keys[i], hashes[i]);
        std::memcpy(&meta, record, sizeof(meta));
        std::memcpy(sh.rows.store.row(id), record + sizeof(meta), stride * sizeof(float));
        sh.disk.Drop(hashes[i], slot);
        // Ranked by its history, below the rows DRAM lets go: updated here, then written back.
        if (sh.last_demoted && !(*sh.last_demoted < Victim::Of(lfu, meta, keys[i])))
          sh.write_back.push_back(keys[i]);
        sh.rows.store.meta(id) = RowMeta{meta.count + 1, now};
        ++sh.rows_promoted;
        ids[i] = id;
        continue;
      }
    }
    int64_t count = 1;
    if (min_count > 0 && sh.sketch.enabled()) {
      count = sh.sketch.Add(hashes[i]);
      if (count < min_count) continue;  // not admitted yet: counted in the sketch only
    } else if (min_count > 0) {
      uint32_t cid = sh.candidates.index.Find(keys[i], hashes[i]);
      if (cid == KeyIndex::kNone) {
        if (sh.candidates.index.size() >= candidates_per_shard) DropOldestCandidates(&sh);
        cid = sh.candidates.Add(keys[i], hashes[i]);
        sh.candidates.store.meta(cid) = RowMeta{0, now};
      }
      RowMeta& cm = sh.candidates.store.meta(cid);
      count = ++cm.count;
      cm.last_seen = now;
      if (count < min_count) continue;  // ids[i] stays kNone: not admitted yet
      sh.candidates.Remove(keys[i], hashes[i]);
    }
    const uint32_t id = sh.rows.Add(keys[i], hashes[i]);
    float* row = sh.rows.store.row(id);
    config_.init.Fill(keys[i], row, dim);
    for (int64_t f = dim; f < stride; ++f) row[f] = slot_init_[f / dim - 1];
    sh.rows.store.meta(id) = RowMeta{count, now};
    ids[i] = id;
  }
  Status evicted = OkStatus();
  if (config_.capped() || config_.evict_policy == EvictPolicy::kTtl) evicted = EnforceCapacity(&sh, now);
  if (tiered) {
    sh.staged.clear();
    sh.staged_bytes.clear();
  }
  return evicted;
}

Status EmbeddingTable::WriteBack(int s) {
  TableShard& sh = *shards_[s];
  if (sh.write_back.empty()) return OkStatus();
  std::vector<std::pair<int64_t, uint32_t>> rows;  // {key, DRAM row id}
  for (int64_t key : sh.write_back) {
    const uint32_t id = sh.rows.index.Find(key, HashKey(key));
    if (id != KeyIndex::kNone) rows.emplace_back(key, id);  // else evicted by the capacity meanwhile
  }
  sh.write_back.clear();
  const int64_t demoted_before = sh.rows_demoted;
  const Status moved = MoveToDisk(&sh, rows.size(), [&](size_t i) { return rows[i]; });
  sh.rows_written_back += sh.rows_demoted - demoted_before;
  if (!moved.ok()) return OkStatus();  // the rows not written stay in DRAM (see the declaration)
  return sh.disk.CompactIfStale();
}

Status EmbeddingTable::EnforceCapacity(TableShard* sh, int64_t now) {
  std::vector<int64_t> doomed;
  if (config_.evict_policy == EvictPolicy::kTtl && now >= sh->next_ttl_sweep) {
    // Expired: not updated in the last ttl_steps steps. The sweep reads every row's metadata
    // (a tiered shard's disk rows in one sequential pass), so it runs every ttl_steps/16
    // steps: a row lives at most ttl_steps + ttl_steps/16 steps.
    const int64_t expired_before = now - config_.ttl_steps + 1;
    sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
      if (sh->rows.store.meta(id).last_seen < expired_before) doomed.push_back(key);
    });
    TF_RETURN_IF_ERROR(sh->disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) {
      if (m.last_seen < expired_before) doomed.push_back(key);
    }));
    TF_RETURN_IF_ERROR(RemoveKeys(sh, doomed, &sh->rows_evicted));
    doomed.clear();
    sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {
      if (sh->candidates.store.meta(id).last_seen < expired_before) doomed.push_back(key);
    });
    int64_t rows_removed = 0;  // none: candidates have no rows
    TF_RETURN_IF_ERROR(RemoveKeys(sh, doomed, &rows_removed));
    doomed.clear();
    sh->next_ttl_sweep = now + std::max<int64_t>(1, config_.ttl_steps / 16);
  }
  if (!config_.capped()) return OkStatus();
  const int64_t shard_capacity = CapacityRowLimit(*sh);
  const int64_t size = sh->rows.index.size() + sh->disk.index.size();  // both tiers count
  if (size <= shard_capacity) return OkStatus();
  // Over the capacity: evict down to 15/16 of it at once, so the scan below is paid once per
  // capacity/16 new rows, not at every update. Rows updated at `now` (this update's keys) stay.
  const int64_t target = shard_capacity - shard_capacity / 16;
  const bool lfu = config_.evict_policy == EvictPolicy::kLfu;
  std::vector<Victim> victims;
  victims.reserve(size);
  auto consider = [&](int64_t key, const RowMeta& m) {
    if (m.last_seen >= now) return;
    victims.push_back(Victim::Of(lfu, m, key));
  };
  sh->rows.index.ForEach([&](int64_t key, uint32_t id) { consider(key, sh->rows.store.meta(id)); });
  TF_RETURN_IF_ERROR(sh->disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) { consider(key, m); }));
  const size_t drop = std::min<size_t>(victims.size(), static_cast<size_t>(size - target));
  if (drop == 0) return OkStatus();
  std::nth_element(victims.begin(), victims.begin() + (drop - 1), victims.end());
  doomed.reserve(drop);
  for (size_t i = 0; i < drop; ++i) doomed.push_back(victims[i].key);
  return RemoveKeys(sh, doomed, &sh->rows_evicted);
}

namespace {
// Rebuilds `ks` densely when at most half of its allocated rows are live, or its index is 4x
// what they need, or (max_allocated > 0) it holds more than max_allocated rows: rows move to
// fresh, contiguous ids, the index shrinks to fit, and the old chunks are freed. Returns
// whether it did.
bool CompactStore(KeyedStore* ks, int64_t max_allocated = 0) {
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
}  // namespace

bool EmbeddingTable::CompactIfSparse(TableShard* sh) {
  // A tiered shard's DRAM limit falls as its disk index grows (the index counts inside the
  // budget): rows demoted below it leave free slots the budget no longer pays for, so the
  // store is compacted once it holds more than 5/4 of the limit (at 100M keys and a 2 GiB
  // budget, freed slots held ~0.8 GiB above the budget until half the store was free).
  const int64_t limit = config_.tiered() ? DramRowLimit(*sh) : 0;
  const bool rows_moved = CompactStore(&sh->rows, limit + limit / 4);
  CompactStore(&sh->candidates);
  return rows_moved;
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
      CopyRow(out + i * dim, sh.rows.store.row(ids[i]), dim);
    }
  }
  return WriteBack(s);
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

namespace {
// FindEach's two loops over a block, each a function of its own: inlined into FindEach's
// span loop, the compiler kept their pointers on the stack (a copy of the loop built
// outside the library ran 5-12% faster; docs/lookup_speed.md, session 10).
// rows[q] = the row of ids begin + q (q < m) of a span, or null; index slots prefetched kAhead
// ids ahead, each row at once.
template <int64_t kAhead>
__attribute__((noinline)) void ProbeBlock(const KeyedStore* const* stores, const int64_t* keys,
                                          const uint64_t* hashes, const int32_t* shard, int64_t begin, int64_t m,
                                          int64_t span, const float** rows) {
  for (int64_t q = 0; q < m; ++q) {
    const int64_t i = begin + q;
    if (i + kAhead < span) stores[shard[i + kAhead]]->index.Prefetch(hashes[i + kAhead]);
    const KeyedStore& ks = *stores[shard[i]];
    const uint32_t id = ks.index.Find(keys[i], hashes[i]);
    rows[q] = id == KeyIndex::kNone ? nullptr : ks.store.row(id);
    __builtin_prefetch(rows[q]);
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
}  // namespace

Status EmbeddingTable::FindEach(const int64_t* keys, int64_t n, float* out) const {
  const int64_t dim = config_.dim;
  const bool tiered = config_.tiered();
  std::vector<const KeyedStore*> stores;
  for (const auto& sh : shards_) stores.push_back(&sh->rows);
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
      for (int64_t begin = 0; begin < span; begin += kBlock) {
        const int64_t m = std::min(kBlock, span - begin);
        ProbeBlock<kAhead>(stores.data(), span_keys, hashes, shard, begin, m, span, rows);
        CopyBlock(rows, m, dim, config_.default_value, out + (locked + begin) * dim);
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
    if (dram_hits[s] > 0) shards_[s]->dram_hits.fetch_add(dram_hits[s], std::memory_order_relaxed);
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

std::vector<uint32_t>& ScratchIds(int64_t n) {
  thread_local std::vector<uint32_t> ids;  // reused across calls: no allocation per lookup
  if (static_cast<int64_t>(ids.size()) < n) ids.resize(n);
  return ids;
}

Status EmbeddingTable::Find(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, bool training,
                            float* out) const {
  const TableShard& sh = *shards_[s];
  const bool tiered = config_.tiered();
  int64_t disk_hits = 0, disk_waits = 0;
  // Training: whole disk records are read (one pread either way) and staged for the update.
  const int64_t stride = sh.rows.store.stride();
  const int64_t staged_record_bytes = sizeof(RowMeta) + stride * sizeof(float);
  thread_local std::vector<char> to_stage;
  thread_local std::vector<std::pair<int64_t, uint32_t>> staged_keys;  // (key, slot)
  to_stage.clear();
  staged_keys.clear();
  const int64_t dim = config_.dim;
  const int64_t min_count = config_.admission_min_count;
  std::shared_lock<std::shared_mutex> lock(sh.mu);
  std::vector<uint32_t>& ids = ScratchIds(n);
  ProbeAll(sh.rows, keys, hashes, n, ids.data());
  // The keys without a DRAM row are read from disk first, all at once (LocateMany): a
  // training lookup reads whole records (meta and stride floats: one pread either way) and
  // stages them for the update; an inference lookup reads the value only.
  thread_local std::vector<int64_t> disk_keys;
  thread_local std::vector<uint64_t> disk_hashes;
  thread_local std::vector<uint32_t> disk_slots;
  thread_local std::vector<RowMeta> disk_metas;
  thread_local std::vector<float> disk_rows;
  const int64_t disk_floats = training ? stride : dim;
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
    TF_RETURN_IF_ERROR(sh.disk.LocateMany(m, disk_keys.data(), disk_hashes.data(), disk_slots.data(),
                                          disk_metas.data(), disk_rows.data(), disk_floats, &disk_waits));
  }
  int64_t next_disk = 0;  // position in disk_keys of the next key without a DRAM row
  for (int64_t i = 0; i < n; ++i) {
    if (i + 8 < n && ids[i + 8] != KeyIndex::kNone) __builtin_prefetch(sh.rows.store.row(ids[i + 8]));
    const uint32_t id = ids[i];
    float* dst = out + i * dim;
    if (id != KeyIndex::kNone) {
      CopyRow(dst, sh.rows.store.row(id), dim);
      continue;
    }
    if (tiered) {  // read from disk above, not promoted: the apply promotes (TouchKeys)
      const int64_t j = next_disk++;
      if (disk_slots[j] != DiskIndex::kNone) {
        ++disk_hits;
        const float* row = disk_rows.data() + j * disk_floats;
        std::memcpy(dst, row, dim * sizeof(float));
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
    bool admitted_now = training;
    if (training && min_count > 0) {  // admitted by this step's update if this sighting reaches min_count
      int64_t seen = 0;
      if (sh.sketch.enabled()) {
        seen = sh.sketch.Estimate(hashes[i]);
      } else {
        const uint32_t cid = sh.candidates.index.Find(keys[i], hashes[i]);
        seen = cid == KeyIndex::kNone ? 0 : sh.candidates.store.meta(cid).count;
      }
      admitted_now = seen + 1 >= min_count;
    }
    if (admitted_now) {
      config_.init.Fill(keys[i], dst, dim);
    } else {
      FillDefault(dst);
    }
  }
  if (tiered) {
    int64_t dram_hits = 0;
    for (int64_t i = 0; i < n; ++i) dram_hits += ids[i] != KeyIndex::kNone;
    auto& mutable_sh = const_cast<TableShard&>(sh);  // counters (atomics) and the staging (its own lock)
    mutable_sh.dram_hits.fetch_add(dram_hits, std::memory_order_relaxed);
    mutable_sh.disk_hits.fetch_add(disk_hits, std::memory_order_relaxed);
    mutable_sh.disk_waits.fetch_add(disk_waits, std::memory_order_relaxed);
    if (!staged_keys.empty()) {
      std::lock_guard<std::mutex> staging(mutable_sh.staged_mu);
      const int64_t generation = sh.disk.generation();
      for (size_t j = 0; j < staged_keys.size() && mutable_sh.staged.size() < TableShard::kMaxStaged; ++j) {
        const size_t offset = mutable_sh.staged_bytes.size();
        mutable_sh.staged_bytes.insert(mutable_sh.staged_bytes.end(), to_stage.data() + j * staged_record_bytes,
                                       to_stage.data() + (j + 1) * staged_record_bytes);
        mutable_sh.staged[staged_keys[j].first] = {generation, staged_keys[j].second, offset};
      }
    }
  }
  return OkStatus();
}

void EmbeddingTable::FoldCandidatesIntoSketch(TableShard* sh) {
  if (!sh->sketch.enabled() || sh->candidates.index.size() == 0) return;
  sh->candidates.index.ForEach(
      [&](int64_t key, uint32_t id) { sh->sketch.Add(HashKey(key), sh->candidates.store.meta(id).count); });
  sh->candidates = KeyedStore(0);
}

void EmbeddingTable::DropOldestCandidates(TableShard* sh) {
  // Drop the least recently seen eighth of the shard's candidates at once (fewest sightings
  // first among equals), so the sort is paid once per many inserts. No growth: only frees.
  struct Seen {
    int64_t last_seen, count, key;
    bool operator<(const Seen& o) const { return last_seen != o.last_seen ? last_seen < o.last_seen : count < o.count; }
  };
  std::vector<Seen> seen;
  seen.reserve(sh->candidates.index.size());
  sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {
    const RowMeta& m = sh->candidates.store.meta(id);
    seen.push_back(Seen{m.last_seen, m.count, key});
  });
  const size_t drop = std::max<size_t>(1, seen.size() / 8);
  std::nth_element(seen.begin(), seen.begin() + (drop - 1), seen.end());
  for (size_t i = 0; i < drop && i < seen.size(); ++i) {
    sh->candidates.Remove(seen[i].key, HashKey(seen[i].key));
    RecordDeleted(sh, seen[i].key);
  }
  sh->candidates_dropped += static_cast<int64_t>(std::min(drop, seen.size()));
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
  const int64_t new_stride = config_.dim * (1 + static_cast<int64_t>(slot_init.size()));
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(config_, new_stride));
  // A one-time re-layout when the first optimizer step meets rows made by lookups alone
  // (disk tiers first: their rewrite can fail, and then nothing changed but those before).
  for (auto& sh : shards_) TF_RETURN_IF_ERROR(sh->disk.Rewrite(new_stride, slot_init, config_.dim));
  for (auto& sh : shards_) sh->rows.store.Widen(new_stride, slot_init, config_.dim);
  optimizer_ = optimizer;
  slot_init_ = slot_init;
  return OkStatus();
}

int64_t EmbeddingTable::Size() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->rows.index.size() + sh->disk.index.size();
  }
  return total;
}

int64_t EmbeddingTable::CandidateCount() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->candidates.index.size();
  }
  return total;
}

int64_t EmbeddingTable::CandidatesDropped() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->candidates_dropped;
  }
  return total;
}

int64_t EmbeddingTable::RowsEvicted() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->rows_evicted;
  }
  return total;
}

int64_t EmbeddingTable::MemoryBytes() const {
  int64_t total = sizeof(*this);
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sizeof(TableShard) + sh->rows.index.bytes() + sh->rows.store.bytes() + sh->candidates.index.bytes() +
             sh->candidates.store.bytes() + sh->sketch.bytes() +
             (sh->deleted_keys[0].capacity() + sh->deleted_keys[1].capacity()) * sizeof(int64_t) +
             sh->disk.index.bytes();
  }
  return total;
}

EmbeddingTable::TierStats EmbeddingTable::Tiers() const {
  TierStats t;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    t.dram_rows += sh->rows.index.size();
    t.disk_rows += sh->disk.index.size();
    t.dram_hits += sh->dram_hits.load(std::memory_order_relaxed);
    t.disk_hits += sh->disk_hits.load(std::memory_order_relaxed);
    t.disk_waits += sh->disk_waits.load(std::memory_order_relaxed);
    t.demoted += sh->rows_demoted;
    t.promoted += sh->rows_promoted;
    t.written_back += sh->rows_written_back;
    t.dram_bytes += sh->rows.index.bytes() + sh->rows.store.bytes();
    t.disk_index_bytes += sh->disk.index.bytes();
    t.disk_file_bytes += sh->disk.file_bytes();
    if (config_.tiered()) t.dram_row_limit += DramRowLimit(*sh);
    t.crowded_shards += IndexCrowdsDram(*sh);
  }
  return t;
}

Status EmbeddingTable::RemoveKeys(TableShard* sh, const std::vector<int64_t>& keys, int64_t* removed) {
  for (int64_t key : keys) {
    const uint64_t h = HashKey(key);
    bool on_disk = false;  // a key is in one tier: the disk is read only for a key not in DRAM
    const uint32_t row = sh->rows.index.Erase(key, h);
    if (row == KeyIndex::kNone) TF_RETURN_IF_ERROR(sh->disk.Remove(key, h, &on_disk));
    const uint32_t cand = sh->candidates.index.Erase(key, h);
    if (row != KeyIndex::kNone) sh->rows.store.Release(row);
    if (cand != KeyIndex::kNone) sh->candidates.store.Release(cand);
    *removed += row != KeyIndex::kNone || on_disk;
    if (row != KeyIndex::kNone || on_disk || cand != KeyIndex::kNone) RecordDeleted(sh, key);
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
    TF_RETURN_IF_ERROR(sh->disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) {
      if (expired(m)) doomed.push_back(key);
    }));
    TF_RETURN_IF_ERROR(RemoveKeys(sh.get(), doomed, evicted));
    doomed.clear();
    sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {  // candidates go by last-seen only
      if (sh->candidates.store.meta(id).last_seen < min_last_seen) doomed.push_back(key);
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

void EmbeddingTable::CollectDeleted(bool reset, std::vector<int64_t>* deleted, int record) {
  if (deleted != nullptr) {
    size_t total = 0;
    for (const auto& sh : shards_) total += sh->deleted_keys[record].size();
    deleted->clear();
    deleted->reserve(total);
    for (const auto& sh : shards_) {
      deleted->insert(deleted->end(), sh->deleted_keys[record].begin(), sh->deleted_keys[record].end());
      if (record == kCheckpointRecord)  // taken by saves not committed yet: still part of the record
        deleted->insert(deleted->end(), sh->deleted_in_save.begin(), sh->deleted_in_save.end());
    }
    std::sort(deleted->begin(), deleted->end());
    deleted->erase(std::unique(deleted->begin(), deleted->end()), deleted->end());
  }
  if (reset) {
    // Appends hold a shard lock exclusively and we hold every shard lock (at least shared),
    // so no append runs while the record is cleared.
    for (auto& sh : shards_) {
      std::vector<int64_t>().swap(sh->deleted_keys[record]);
      if (record == kCheckpointRecord) std::vector<int64_t>().swap(sh->deleted_in_save);
    }
    track_deleted_[record].store(true, std::memory_order_relaxed);
  }
}

void EmbeddingTable::DeletedKeys(bool reset, std::vector<int64_t>* deleted, int record) {
  std::lock_guard<std::mutex> record_lock(deleted_mu_);
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  CollectDeleted(reset, deleted, record);
}

Status EmbeddingTable::Export(int64_t since_step, const ExportAllocator& allocate, std::vector<int64_t>* deleted,
                              bool reset_deleted, int record) {
  std::unique_lock<std::mutex> record_lock(deleted_mu_, std::defer_lock);
  if (deleted != nullptr || reset_deleted) record_lock.lock();
  // Every shard locked shared for the whole export: one slot layout, exact counts, and the
  // rows written straight into the caller's buffers (no intermediate copy).
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  ExportLayout layout;
  layout.stride = config_.dim * (1 + static_cast<int64_t>(slot_init_.size()));
  layout.optimizer = optimizer_;
  layout.slot_init = slot_init_;
  layout.step = step();
  const bool all = since_step == std::numeric_limits<int64_t>::min();
  for (const auto& sh : shards_) {
    if (all) {
      layout.rows += sh->rows.index.size() + sh->disk.index.size();
      layout.candidates += sh->candidates.index.size();
      continue;
    }
    sh->rows.index.ForEach([&](int64_t, uint32_t id) { layout.rows += sh->rows.store.meta(id).last_seen > since_step; });
    TF_RETURN_IF_ERROR(
        sh->disk.ForEachLive([&](int64_t, const RowMeta& m, const float*) { layout.rows += m.last_seen > since_step; }));
    sh->candidates.index.ForEach(
        [&](int64_t, uint32_t id) { layout.candidates += sh->candidates.store.meta(id).last_seen > since_step; });
  }
  ExportBuffers out;
  TF_RETURN_IF_ERROR(allocate(layout, &out));
  const int64_t stride = layout.stride;
  int64_t r = 0, c = 0;
  auto add_row = [&](int64_t key, const RowMeta& m, const float* row) {
    if (m.last_seen <= since_step && !all) return;
    out.keys[r] = key;
    std::memcpy(out.values + r * stride, row, stride * sizeof(float));
    out.meta[2 * r] = m.count;
    out.meta[2 * r + 1] = m.last_seen;
    ++r;
  };
  for (const auto& sh : shards_) {
    if (sh->rows.store.stride() != stride)  // cannot happen: layouts change under every lock
      return errors::Internal("table shard has row stride ", sh->rows.store.stride(), ", expected ", stride);
    sh->rows.index.ForEach(
        [&](int64_t key, uint32_t id) { add_row(key, sh->rows.store.meta(id), sh->rows.store.row(id)); });
    // The disk tier's rows, read sequentially (same snapshot: writers wait).
    TF_RETURN_IF_ERROR(sh->disk.ForEachLive(add_row));
    sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {
      const RowMeta& m = sh->candidates.store.meta(id);
      if (m.last_seen <= since_step && !all) return;
      out.candidate_keys[c] = key;
      out.candidate_meta[2 * c] = m.count;
      out.candidate_meta[2 * c + 1] = m.last_seen;
      ++c;
    });
  }
  if (deleted != nullptr || reset_deleted) CollectDeleted(reset_deleted, deleted, record);
  return OkStatus();
}

Status EmbeddingTable::Save(int64_t since_step, const SaveAllocator& allocate, std::vector<int64_t>* deleted) {
  std::shared_lock<std::shared_mutex> relayout_lock(relayout_mu_);
  ExportLayout layout;
  {
    std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);  // optimizer_ and slot_init_ are read under a shard lock
    layout.stride = config_.dim * (1 + static_cast<int64_t>(slot_init_.size()));
    layout.optimizer = optimizer_;
    layout.slot_init = slot_init_;
  }
  // Before the first shard: an update landing after some shard's copy (its step above every
  // completed one) stamps its rows later than this, so the next delta holds them.
  layout.step = step();
  SavePiece piece;
  TF_RETURN_IF_ERROR(allocate(layout, &piece));
  if (piece.max_rows < 1 || piece.max_candidates < 1 || !piece.write)
    return errors::Internal("a save's piece needs room for a row and a candidate, and a writer");
  const bool all = since_step == std::numeric_limits<int64_t>::min();
  const int64_t stride = layout.stride;
  int64_t written = 0;
  auto write = [&]() -> Status {
    TF_RETURN_IF_ERROR(piece.write(piece));
    piece.rows = piece.candidates = 0;
    ++written;
    return OkStatus();
  };
  deleted->clear();
  for (auto& shard : shards_) {
    TableShard& sh = *shard;
    if (piece.rows > 0 || piece.candidates > 0) {
      // Write the piece with no lock held when this shard (at most all its rows) may not fit
      // in what is left of it but fits in an empty one.
      int64_t rows, candidates;
      {
        std::shared_lock<std::shared_mutex> lock(sh.mu);
        rows = sh.rows.index.size() + sh.disk.index.size();
        candidates = sh.candidates.index.size();
      }
      const bool fits_left = piece.rows + rows <= piece.max_rows && piece.candidates + candidates <= piece.max_candidates;
      if (!fits_left && rows <= piece.max_rows && candidates <= piece.max_candidates) TF_RETURN_IF_ERROR(write());
    }
    // The shard's copy and its deleted keys' move are one step: updates (which record
    // deletions, under the shard lock exclusive) wait; deleted_mu_ (taken first, the lock
    // order) keeps other readers of the record out.
    std::lock_guard<std::mutex> record_lock(deleted_mu_);
    std::shared_lock<std::shared_mutex> lock(sh.mu);
    if (sh.rows.store.stride() != stride)  // cannot happen: layouts change under relayout_mu_
      return errors::Internal("table shard has row stride ", sh.rows.store.stride(), ", expected ", stride);
    Status status = OkStatus();
    // A full piece inside a shard is written under its lock: the shard holds more than a piece.
    auto add_row = [&](int64_t key, const RowMeta& m, const float* row) {
      if (!status.ok() || (m.last_seen <= since_step && !all)) return;
      if (piece.rows == piece.max_rows && !(status = write()).ok()) return;
      const int64_t r = piece.rows++;
      piece.keys[r] = key;
      std::memcpy(piece.values + r * stride, row, stride * sizeof(float));
      piece.meta[2 * r] = m.count;
      piece.meta[2 * r + 1] = m.last_seen;
    };
    sh.rows.index.ForEach([&](int64_t key, uint32_t id) { add_row(key, sh.rows.store.meta(id), sh.rows.store.row(id)); });
    TF_RETURN_IF_ERROR(sh.disk.ForEachLive(add_row));  // sequential reads, same snapshot
    TF_RETURN_IF_ERROR(status);
    sh.candidates.index.ForEach([&](int64_t key, uint32_t id) {
      const RowMeta& m = sh.candidates.store.meta(id);
      if (!status.ok() || (m.last_seen <= since_step && !all)) return;
      if (piece.candidates == piece.max_candidates && !(status = write()).ok()) return;
      const int64_t c = piece.candidates++;
      piece.candidate_keys[c] = key;
      piece.candidate_meta[2 * c] = m.count;
      piece.candidate_meta[2 * c + 1] = m.last_seen;
    });
    TF_RETURN_IF_ERROR(status);
    std::vector<int64_t>& live = sh.deleted_keys[kCheckpointRecord];
    sh.deleted_in_save.insert(sh.deleted_in_save.end(), live.begin(), live.end());
    std::vector<int64_t>().swap(live);
    deleted->insert(deleted->end(), sh.deleted_in_save.begin(), sh.deleted_in_save.end());
  }
  if (piece.rows > 0 || piece.candidates > 0 || written == 0) TF_RETURN_IF_ERROR(write());  // at least one piece
  std::sort(deleted->begin(), deleted->end());
  deleted->erase(std::unique(deleted->begin(), deleted->end()), deleted->end());
  return OkStatus();
}

void EmbeddingTable::CommitSave() {
  std::lock_guard<std::mutex> record_lock(deleted_mu_);
  for (auto& sh : shards_) std::vector<int64_t>().swap(sh->deleted_in_save);  // changes under deleted_mu_ only
}

namespace {
// The positions of the imported keys (those of the partition) ordered by table shard:
// order[offsets[s] .. offsets[s+1]) are the input positions of shard s's keys.
struct ShardOrder {
  std::vector<int64_t> order, offsets;
};
ShardOrder OrderByShard(const EmbeddingTable& table, const int64_t* keys, int64_t n, int64_t num_partitions,
                        int64_t partition) {
  ShardOrder so;
  const int num_shards = table.num_shards();
  so.offsets.assign(num_shards + 1, 0);
  auto wanted = [&](int64_t key) { return num_partitions == 1 || PartitionOf(key, num_partitions) == partition; };
  for (int64_t i = 0; i < n; ++i)
    if (wanted(keys[i])) ++so.offsets[table.ShardOf(HashKey(keys[i])) + 1];
  for (int s = 0; s < num_shards; ++s) so.offsets[s + 1] += so.offsets[s];
  so.order.resize(so.offsets[num_shards]);
  std::vector<int64_t> cursor(so.offsets.begin(), so.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (wanted(keys[i])) so.order[cursor[table.ShardOf(HashKey(keys[i]))]++] = i;
  return so;
}

// An index of shard s's imported keys (id = position within the shard's slice of `so`),
// failing on a key given twice.
Status IndexShard(const int64_t* keys, const ShardOrder& so, int s, const char* name, KeyIndex* index) {
  const int64_t begin = so.offsets[s], n = so.offsets[s + 1] - begin;
  *index = KeyIndex(KeyIndex::CapacityFor(n));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t key = keys[so.order[begin + j]];
    const uint64_t h = HashKey(key);
    if (index->Find(key, h) != KeyIndex::kNone)
      return errors::InvalidArgument(name, " holds key ", key, " more than once (at position ", so.order[begin + j],
                                     ")");
    index->Insert(key, h, static_cast<uint32_t>(j));
  }
  return OkStatus();
}

// Makes room in `ks` for `extra` more keys (the caller holds the shard lock exclusively).
void GrowFor(KeyedStore* ks, int64_t extra) {
  if (!ks->index.HasRoom(extra)) {
    KeyIndex bigger(KeyIndex::CapacityFor(ks->index.size() + extra));
    ks->index.MoveAllInto(&bigger);
    std::swap(ks->index, bigger);
  }
  for (int64_t c = ks->store.ChunksNeeded(extra); c > 0; --c) ks->store.AddChunk(RowStore::NewChunk(ks->store.stride()));
}
}  // namespace

Status EmbeddingTable::Import(const ImportSource& src) {
  const int64_t slots = static_cast<int64_t>(src.slot_init.size());
  const int64_t stride = config_.dim * (1 + slots);
  // Validate everything before the table changes: an import either happens whole or not at all.
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(config_, stride));
  // A NaN/Inf value or slot would poison every step that reads its row: refuse it.
  int64_t non_finite = 0, first_bad = -1;
  for (int64_t i = 0; i < src.num_rows; ++i) {
    const float* row = src.values + i * stride;
    if (!std::all_of(row, row + stride, [](float x) { return std::isfinite(x); })) {
      if (first_bad < 0) first_bad = i;
      ++non_finite;
    }
  }
  if (non_finite > 0)
    return errors::InvalidArgument("values hold NaN or Inf in ", non_finite, " of ", src.num_rows,
                                   " row(s) (value or optimizer slot), the first at position ", first_bad, " (key ",
                                   src.keys[first_bad], "): imported rows must be finite");
  const ShardOrder rows = OrderByShard(*this, src.keys, src.num_rows, src.num_partitions, src.partition);
  const ShardOrder cands =
      OrderByShard(*this, src.candidate_keys, src.num_candidates, src.num_partitions, src.partition);
  std::vector<KeyIndex> row_index(shards_.size()), cand_index(shards_.size());
  for (int s = 0; s < num_shards(); ++s) {
    TF_RETURN_IF_ERROR(IndexShard(src.keys, rows, s, "keys", &row_index[s]));
    TF_RETURN_IF_ERROR(IndexShard(src.candidate_keys, cands, s, "candidate_keys", &cand_index[s]));
    const int64_t begin = cands.offsets[s];
    for (int64_t j = begin; j < cands.offsets[s + 1]; ++j) {
      const int64_t key = src.candidate_keys[cands.order[j]];
      if (row_index[s].Find(key, HashKey(key)) != KeyIndex::kNone)
        return errors::InvalidArgument("key ", key, " is in both keys and candidate_keys");
    }
  }

  std::unique_lock<std::shared_mutex> relayout_lock(relayout_mu_);  // waits for a save in progress
  std::unique_lock<std::mutex> record_lock(deleted_mu_);
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  // A failed demotion (a full disk) leaves its rows in DRAM, over the budget: the import still
  // completes, whole, and then reports the disk's error.
  Status tier_status = OkStatus();
  if (src.merge) {
    const bool same_layout = optimizer_ == src.optimizer && slot_init_.size() == src.slot_init.size();
    if (!same_layout && !(slot_init_.empty() && (optimizer_.empty() || optimizer_ == src.optimizer))) {
      return errors::InvalidArgument("cannot merge rows with ", slots, " slot(s) of '", src.optimizer,
                                     "' into a table holding ", slot_init_.size(), " slot(s) of '", optimizer_, "'");
    }
    if (!same_layout) {
      for (auto& sh : shards_) TF_RETURN_IF_ERROR(sh->disk.Rewrite(stride, src.slot_init, config_.dim));
      for (auto& sh : shards_) sh->rows.store.Widen(stride, src.slot_init, config_.dim);
      optimizer_ = src.optimizer;
      slot_init_ = src.slot_init;
    }
    for (int s = 0; s < num_shards(); ++s) {
      TableShard& sh = *shards_[s];
      GrowFor(&sh.rows, rows.offsets[s + 1] - rows.offsets[s]);
      GrowFor(&sh.candidates, cands.offsets[s + 1] - cands.offsets[s]);
      for (int64_t j = rows.offsets[s]; j < rows.offsets[s + 1]; ++j) {
        const int64_t i = rows.order[j], key = src.keys[i];
        const uint64_t h = HashKey(key);
        sh.candidates.Remove(key, h);
        uint32_t id = sh.rows.index.Find(key, h);
        if (id == KeyIndex::kNone) {
          // An upserted row comes to DRAM; Demote below sends the coldest back. A failed read
          // stops the import here, each key still in one tier.
          bool was_on_disk = false;
          TF_RETURN_IF_ERROR(sh.disk.Remove(key, h, &was_on_disk));
          id = sh.rows.Add(key, h);
        }
        std::memcpy(sh.rows.store.row(id), src.values + i * stride, stride * sizeof(float));
        sh.rows.store.meta(id) = RowMeta{src.meta[2 * i], src.meta[2 * i + 1]};
      }
      for (int64_t j = cands.offsets[s]; j < cands.offsets[s + 1]; ++j) {
        const int64_t i = cands.order[j], key = src.candidate_keys[i];
        const uint64_t h = HashKey(key);
        if (sh.rows.index.Find(key, h) != KeyIndex::kNone) continue;  // already admitted
        uint32_t id = sh.candidates.index.Find(key, h);
        if (id == KeyIndex::kNone) id = sh.candidates.Add(key, h);
        sh.candidates.store.meta(id) = RowMeta{src.candidate_meta[2 * i], src.candidate_meta[2 * i + 1]};
      }
      FoldCandidatesIntoSketch(&sh);
      if (config_.tiered()) tier_status.Update(Demote(&sh, 0, {}, nullptr));
    }
    AdvanceStep(src.step);
    return tier_status;
  }
  // Replace, one shard at a time: the old shard is freed as soon as its new content is in,
  // so the import needs the input plus about one shard, never a second whole table.
  for (int s = 0; s < num_shards(); ++s) {
    TableShard& sh = *shards_[s];
    sh.rows = KeyedStore(stride);  // frees the old rows first
    sh.candidates = KeyedStore(0);
    sh.disk.Clear();
    TF_RETURN_IF_ERROR(sh.disk.Rewrite(stride, src.slot_init, config_.dim));  // empty: sets the stride
    sh.rows.index = std::move(row_index[s]);
    sh.candidates.index = std::move(cand_index[s]);
    const int64_t n = rows.offsets[s + 1] - rows.offsets[s], m = cands.offsets[s + 1] - cands.offsets[s];
    for (int64_t c = sh.rows.store.ChunksNeeded(n); c > 0; --c) sh.rows.store.AddChunk(RowStore::NewChunk(stride));
    for (int64_t c = sh.candidates.store.ChunksNeeded(m); c > 0; --c) sh.candidates.store.AddChunk(RowStore::NewChunk(0));
    sh.rows.store.TakeFirst(n);
    sh.candidates.store.TakeFirst(m);
    for (int64_t j = 0; j < n; ++j) {  // id j is the shard's j-th imported key (IndexShard)
      const int64_t i = rows.order[rows.offsets[s] + j];
      std::memcpy(sh.rows.store.row(static_cast<uint32_t>(j)), src.values + i * stride, stride * sizeof(float));
      sh.rows.store.meta(static_cast<uint32_t>(j)) = RowMeta{src.meta[2 * i], src.meta[2 * i + 1]};
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t i = cands.order[cands.offsets[s] + j];
      sh.candidates.store.meta(static_cast<uint32_t>(j)) = RowMeta{src.candidate_meta[2 * i], src.candidate_meta[2 * i + 1]};
    }
    sh.candidates_dropped = 0;
    if (sh.sketch.enabled()) sh.sketch = AdmissionSketch(config_.admission_sketch_bytes / num_shards());
    FoldCandidatesIntoSketch(&sh);
    for (auto& record : sh.deleted_keys) std::vector<int64_t>().swap(record);  // a restored table starts a new history
    if (config_.tiered()) tier_status.Update(Demote(&sh, 0, {}, nullptr));
    ReleaseFreedMemory();
  }
  optimizer_ = src.optimizer;
  slot_init_ = src.slot_init;
  step_.store(src.step, std::memory_order_relaxed);
  return tier_status;
}

}  // namespace ttf
}  // namespace tensorflow
