// Eviction: which rows leave a table held to a capacity (rows or bytes, both tiers counted)
// or a TTL, after each update. The policy picks the keys (Eviction); the table removes them
// (EmbeddingTable::RemoveKeys), so a removal is recorded in the change log in one place.
#ifndef TTF_OPS_KERNELS_EVICTION_H_
#define TTF_OPS_KERNELS_EVICTION_H_

#include <cstdint>
#include <vector>

#include "row_store.h"
#include "table_config.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

struct TableShard;

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

// A shard's eviction counters, guarded by the shard lock.
struct ShardEviction {
  int64_t rows_evicted = 0;    // by the capacity and TTL (not by explicit Evict/Remove)
  int64_t next_ttl_sweep = 0;  // the step at which TTL next scans this shard
};

// The policy, shared by every shard of a table. All calls hold the shard lock exclusively.
class Eviction {
 public:
  explicit Eviction(const TableConfig& config) : config_(config) {}
  // Whether an update may evict at all (a capacity, or a TTL).
  bool active() const { return config_.capped() || config_.evict_policy == EvictPolicy::kTtl; }
  bool lfu() const { return config_.evict_policy == EvictPolicy::kLfu; }
  // TTL: whether the shard's sweep is due at step `now`; if so, the keys of its rows (both
  // tiers) and of its candidates not updated for ttl_steps steps. The sweep reads every row's
  // metadata (a tiered shard's disk rows in one sequential pass), so it runs every
  // ttl_steps/16 steps (Swept sets the next): a row lives at most ttl_steps + ttl_steps/16 steps.
  Status Expired(TableShard* sh, int64_t now, bool* due, std::vector<int64_t>* rows,
                 std::vector<int64_t>* candidates) const;
  void Swept(TableShard* sh, int64_t now) const;
  // Capacity: the keys to evict from a shard above its share of the capacity, down to 15/16
  // of it at once (so the scan is paid once per capacity/16 new rows, not at every update),
  // by evict_policy (Victim order), never a row updated at `now` (this update's keys).
  Status OverCapacity(const TableShard& sh, int64_t now, std::vector<int64_t>* doomed) const;
  // The most rows a shard of a capped table keeps (both tiers): its share of capacity, rounded
  // up, or of capacity_bytes over RowBytes at the current row width (lock held).
  int64_t RowLimit(const TableShard& sh) const;

 private:
  const TableConfig& config_;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_EVICTION_H_
