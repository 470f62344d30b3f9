// Admission: a key gets a row only once seen in admission_min_count updates. Until then it is
// a candidate: counted in a row-less store of its own (max_candidates kept, the oldest
// dropped) or, with admission_sketch_bytes, in a count-min sketch of fixed size (no key kept).
#ifndef TTF_OPS_KERNELS_ADMISSION_H_
#define TTF_OPS_KERNELS_ADMISSION_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "change_log.h"
#include "row_store.h"
#include "table_config.h"
#include "table_hash.h"

namespace tensorflow {
namespace ttf {

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

// A shard's admission state, guarded by the shard lock.
struct ShardAdmission {
  ShardAdmission() : candidates(0) {}
  KeyedStore candidates;            // keys seen, not yet admitted (stride 0: no rows)
  AdmissionSketch sketch;           // admission_sketch_bytes > 0: sightings of keys without a row
  int64_t candidates_dropped = 0;   // by the max_candidates bound
};

// The policy, shared by every shard of a table (no state of its own).
class Admission {
 public:
  explicit Admission(const TableConfig& config)
      : min_count_(config.admission_min_count),
        candidates_per_shard_(std::max<int64_t>(1, config.max_candidates / config.num_shards)),
        sketch_bytes_per_shard_(config.admission_sketch_bytes / config.num_shards) {}
  // A fresh shard's state (an empty store, or an empty sketch).
  ShardAdmission NewShard() const;
  // Whether a key without a row takes a slot in the candidate store (room reserved first).
  bool UsesCandidates(const ShardAdmission& a) const { return min_count_ > 0 && !a.sketch.enabled(); }
  // Counts one sighting at step `now` of a key without a row (the shard lock held exclusively,
  // room reserved for a candidate). Returns its sightings, this one included, when it is
  // admitted now (the candidate is gone), else 0. Without admission every key is admitted at
  // its first sighting (1). Candidates dropped to make room are recorded in the change log.
  int64_t Sight(ShardAdmission* a, int64_t key, uint64_t hash, int64_t now, const ChangeLog& log,
                ShardChangeLog* shard_log) const {
    if (min_count_ == 0) return 1;
    int64_t count;
    if (a->sketch.enabled()) {
      count = a->sketch.Add(hash);
    } else {
      uint32_t cid = a->candidates.index.Find(key, hash);
      if (cid == KeyIndex::kNone) {
        if (a->candidates.index.size() >= candidates_per_shard_) DropOldest(a, log, shard_log);
        cid = a->candidates.Add(key, hash);
        a->candidates.store.meta(cid) = RowMeta{0, now};
      }
      RowMeta& cm = a->candidates.store.meta(cid);
      count = ++cm.count;
      cm.last_seen = now;
      if (count >= min_count_) a->candidates.Remove(key, hash);
    }
    return count >= min_count_ ? count : 0;
  }
  // Whether a key without a row would be admitted by one more sighting (a training lookup's
  // answer: the row this step's update would give it). Shard lock held at least shared.
  bool AdmitsNext(const ShardAdmission& a, int64_t key, uint64_t hash) const {
    if (min_count_ == 0) return true;
    int64_t seen = 0;
    if (a.sketch.enabled()) {
      seen = a.sketch.Estimate(hash);
    } else {
      const uint32_t cid = a.candidates.index.Find(key, hash);
      seen = cid == KeyIndex::kNone ? 0 : a.candidates.store.meta(cid).count;
    }
    return seen + 1 >= min_count_;
  }
  // Sketch tables: imported candidates count as their sightings in the sketch (lock held).
  void FoldCandidatesIntoSketch(ShardAdmission* a) const;

 private:
  // Drops the least recently seen eighth of the shard's candidates at once (fewest sightings
  // first among equals), so the sort is paid once per many inserts. No growth: only frees.
  void DropOldest(ShardAdmission* a, const ChangeLog& log, ShardChangeLog* shard_log) const;

  int64_t min_count_;
  int64_t candidates_per_shard_;
  int64_t sketch_bytes_per_shard_;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_ADMISSION_H_
