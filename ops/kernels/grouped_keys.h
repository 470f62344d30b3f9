// GroupedKeys, a batch's distinct keys grouped by table shard (GroupKeys, group_keys.h, makes
// them), and LastGrouping, the one a table keeps of its latest training lookup.
#ifndef TTF_OPS_KERNELS_GROUPED_KEYS_H_
#define TTF_OPS_KERNELS_GROUPED_KEYS_H_

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorflow {
namespace ttf {

// The distinct keys of a batch, ordered by shard: keys[offsets[s] .. offsets[s+1]) all
// live in shard s. inverse[p] is the position in `keys` of input key p.
struct GroupedKeys {
  std::vector<int64_t> keys;
  std::vector<uint64_t> hashes;
  std::vector<int64_t> offsets;  // num_shards + 1
  std::vector<int32_t> inverse;
  int64_t size() const { return static_cast<int64_t>(keys.size()); }
};

// The grouping of a table's latest training lookup, kept for the apply that follows it: the
// apply is handed that lookup's distinct keys (its unique_keys output, in its order), and
// grouping them again (hashing, a de-dup set, a sort by shard, a copy of the gradients) cost
// 7% of a training step (benchmarks/results/lookup.md). Matched by content, so an apply of
// any other keys (several lookups' concatenated, another worker's lookup in between) groups
// its own. One batch's keys.
class LastGrouping {
 public:
  static constexpr int64_t kMaxKeys = int64_t{1} << 20;  // larger batches are not kept: 16 MiB at most

  void Keep(GroupedKeys&& grouped) {
    if (grouped.size() > kMaxKeys) return;
    grouped.inverse = std::vector<int32_t>();  // the apply's keys are distinct: no inverse needed
    std::lock_guard<std::mutex> lock(mu_);
    kept_ = std::move(grouped);
  }

  // True when keys[0..n) are exactly the kept lookup's distinct keys, in its order: *out then
  // holds their grouping (inverse empty: position i is distinct key i), and nothing is kept.
  bool Take(const int64_t* keys, int64_t n, GroupedKeys* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_.offsets.empty() || kept_.size() != n || !std::equal(keys, keys + n, kept_.keys.begin())) return false;
    *out = std::move(kept_);
    kept_ = GroupedKeys();
    return true;
  }

 private:
  std::mutex mu_;
  GroupedKeys kept_;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_GROUPED_KEYS_H_
