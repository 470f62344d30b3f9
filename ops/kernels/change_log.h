// The table's change log: the keys removed from it (evicted, dropped candidates, removed),
// kept for each of its readers apart. A reader is a number in [0, kNumChangeLogReaders): the
// table knows nothing of who reads (the Python layer gives its delta checkpoints and its
// serving publication a reader each), and a reader's resets never disturb another's chain.
// A reader's record is off until its first reset (nobody reads it before), so a table that
// never makes deltas does not grow it.
#ifndef TTF_OPS_KERNELS_CHANGE_LOG_H_
#define TTF_OPS_KERNELS_CHANGE_LOG_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tensorflow {
namespace ttf {

constexpr int kNumChangeLogReaders = 2;

// A shard's part of the log, guarded by the shard lock: appends hold it exclusively, reads
// at least shared.
struct ShardChangeLog {
  // Keys removed since the reader's last reset, while it records.
  std::vector<int64_t> removed[kNumChangeLogReaders];
  // Keys a streamed save took with this shard's rows (TakeForSave) that no save committed yet
  // (Commit): the next save takes them again, so a failed save loses none. A reader's record
  // reads as removed[r] plus taken[r].
  std::vector<int64_t> taken[kNumChangeLogReaders];

  // Appends reader r's record (both parts) to `out`.
  void AppendTo(int r, std::vector<int64_t>* out) const {
    out->insert(out->end(), removed[r].begin(), removed[r].end());
    out->insert(out->end(), taken[r].begin(), taken[r].end());
  }
  size_t size(int r) const { return removed[r].size() + taken[r].size(); }
  void Clear(int r) {
    std::vector<int64_t>().swap(removed[r]);
    std::vector<int64_t>().swap(taken[r]);
  }
  // A restored table starts a new history: every reader's new removals go (a save's taken
  // keys stay until it commits).
  void ClearRemoved() {
    for (auto& keys : removed) std::vector<int64_t>().swap(keys);
  }
  // A save's copy of this shard takes reader r's new removals with it.
  void TakeForSave(int r) {
    taken[r].insert(taken[r].end(), removed[r].begin(), removed[r].end());
    std::vector<int64_t>().swap(removed[r]);
  }
  int64_t bytes() const {
    size_t words = 0;
    for (int r = 0; r < kNumChangeLogReaders; ++r) words += removed[r].capacity() + taken[r].capacity();
    return static_cast<int64_t>(words * sizeof(int64_t));
  }
};

// The table's part: which readers record, and the lock that serialises the readers' reads
// and resets (taken before any shard lock).
class ChangeLog {
 public:
  static bool ValidReader(int64_t r) { return r >= 0 && r < kNumChangeLogReaders; }
  // Records a removed key for every reader that records (the shard lock held exclusively).
  void Record(ShardChangeLog* log, int64_t key) const {
    for (int r = 0; r < kNumChangeLogReaders; ++r)
      if (recording_[r].load(std::memory_order_relaxed)) log->removed[r].push_back(key);
  }
  void Start(int r) { recording_[r].store(true, std::memory_order_relaxed); }
  std::mutex& mu() { return mu_; }

  static void SortDistinct(std::vector<int64_t>* keys) {
    std::sort(keys->begin(), keys->end());
    keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  }

 private:
  std::atomic<bool> recording_[kNumChangeLogReaders] = {{false}, {false}};
  std::mutex mu_;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_CHANGE_LOG_H_
