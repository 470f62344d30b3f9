#include "table_shard.h"

namespace tensorflow {
namespace ttf {

bool CompactShard(TableShard* sh, int64_t dram_row_limit) {
  // A tiered shard's DRAM limit falls as its disk index grows (the index counts inside the
  // budget): rows demoted below it leave free slots the budget no longer pays for, so the
  // store is compacted once it holds more than 5/4 of the limit (at 100M keys and a 2 GiB
  // budget, freed slots held ~0.8 GiB above the budget until half the store was free).
  const bool rows_moved = CompactStore(&sh->rows, dram_row_limit + dram_row_limit / 4);
  CompactStore(&sh->admission.candidates);
  return rows_moved;
}

}  // namespace ttf
}  // namespace tensorflow
