#include "disk_tier.h"

#include <cerrno>
#include <cstdlib>
#include <utility>
#include <fcntl.h>
#include <unistd.h>

#include "disk_reads.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ttf {

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
                                     "Free space there, point ssd_dir= at a larger disk, or raise dram_budget=.");
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
  return Rewrite(stride_, nullptr);
}

Status DiskTier::Rewrite(int64_t new_stride, const std::function<void(float* row)>& init_slots) {
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
    if (new_stride > stride_) init_slots(row);
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

}  // namespace ttf
}  // namespace tensorflow
