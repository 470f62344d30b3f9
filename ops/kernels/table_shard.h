// One lock shard of a table: its DRAM rows and the state each of the table's concerns keeps
// for it (admission, eviction, tier, change log), all guarded by `mu` (see embedding_table.h).
#ifndef TTF_OPS_KERNELS_TABLE_SHARD_H_
#define TTF_OPS_KERNELS_TABLE_SHARD_H_

#include <cstdint>
#include <shared_mutex>
#include <utility>

#include "admission.h"
#include "change_log.h"
#include "eviction.h"
#include "row_store.h"
#include "tiering.h"

namespace tensorflow {
namespace ttf {

struct TableShard {
  TableShard(int64_t stride, ShardAdmission fresh_admission) : rows(stride), admission(std::move(fresh_admission)) {}
  mutable std::shared_mutex mu;
  KeyedStore rows;  // the admitted rows in DRAM
  ShardAdmission admission;
  ShardEviction eviction;
  ShardTier tier;
  ShardChangeLog log;
};

// Rebuilds a shard's stores densely when at most half their allocated rows are live (or, with
// dram_row_limit > 0, the rows hold more than 5/4 of it), so the freed chunks (and a too-large
// index) go back to the system. Lock held exclusively. Returns whether the rows moved to new ids.
bool CompactShard(TableShard* sh, int64_t dram_row_limit);

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TABLE_SHARD_H_
