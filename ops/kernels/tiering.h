// Tiering: a table with dram_budget keeps at most its budget of rows in DRAM and the rest in
// its shards' disk tiers (disk_tier.h). An update promotes the disk rows it touches; before
// that, when it would take DRAM past the budget, the rows ranked lowest by evict_policy (Victim
// order) are demoted. DRAM admission: a promoted row that ranks below the last row demoted is
// updated in DRAM and written straight back (WriteBack), so ids seen once in a long while do
// not push rows trained often out of DRAM. A training lookup stages the disk records it reads,
// so the update promotes them without a second read.
#ifndef TTF_OPS_KERNELS_TIERING_H_
#define TTF_OPS_KERNELS_TIERING_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "disk_tier.h"
#include "eviction.h"
#include "table_config.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

struct TableShard;

// A shard's tier state. Guarded by the shard lock, except the hit counters (atomics: lookups
// hold the lock shared) and the staging (staged_mu, for the same reason).
struct ShardTier {
  DiskTier disk;  // cold rows (tiered tables only)
  int64_t rows_demoted = 0, rows_promoted = 0;
  int64_t rows_written_back = 0;  // of rows_demoted
  // DRAM admission: the last row a demotion moved to disk. A disk row an update reads comes
  // back to DRAM only if, before that update, it ranks above this row (Victim order):
  // otherwise it is written back after the update. Before the first demotion (none yet)
  // every row comes back.
  std::optional<Victim> last_demoted;
  std::vector<int64_t> write_back;  // this update's keys to write back (exclusive lock)
  // Lookups of keys with a row, by tier.
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

// The policy, shared by every shard of a table. Unless said otherwise a call holds the shard
// lock exclusively.
class Tiering {
 public:
  explicit Tiering(const TableConfig& config) : config_(config) {}
  bool enabled() const { return config_.tiered(); }
  // Creates the shard's disk file (before first use).
  Status Open(TableShard* sh) const;
  // The most DRAM rows a shard keeps: its share of the budget, less its disk tier's key
  // index, over the bytes of a DRAM row (lock held at least shared).
  int64_t DramRowLimit(const TableShard& sh) const;
  // Whether the shard's disk index takes over half its share of dram_budget.
  bool IndexCrowdsDram(const TableShard& sh) const;
  // An update's first step: probes its n keys (ids, *missing: those without a DRAM row) and,
  // when their rows would take DRAM past its limit, demotes rows not among them. A failed
  // write (a full disk) returns before any key of the update changed. *missing is -1 when the
  // demotion renumbered the rows (the ids are stale: probe again).
  Status MakeRoom(TableShard* sh, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids,
                  int64_t* missing);
  // Moves rows ranked lowest to disk until the shard holds at most DramRowLimit - `reserve`
  // DRAM rows, never one whose key is in `keep`. Sets *renumbered (if non-null) when the rows
  // left moved to new ids (the store was compacted).
  Status Demote(TableShard* sh, int64_t reserve, const std::vector<int64_t>& keep, bool* renumbered);
  // Promotes the key's disk row, if it has one, counted as an update at step `now` (room is
  // reserved): *id is its new DRAM row, KeyIndex::kNone when the key is not on disk. A row
  // ranked below the last one demoted is marked for WriteBack. Returns a disk read's error.
  Status Promote(TableShard* sh, int64_t key, uint64_t hash, int64_t now, uint32_t* id);
  // After the update of its rows: writes the rows Promote marked back to disk and drops them
  // from DRAM. A failed write keeps them in DRAM (the shard stays consistent, over its DRAM
  // limit by at most this update's rows; the next update's demotion meets the same disk and
  // reports it); a failed compaction is returned.
  Status WriteBack(TableShard* sh) const;
  // An update's end: the records lookups staged for it are spent.
  void EndUpdate(TableShard* sh) const;
  // A training lookup's disk records (`records`: n of [RowMeta | stride floats], keys[j] at
  // slots[j]), staged for the update. Shard lock held shared.
  void Stage(const TableShard& sh, size_t n, const std::pair<int64_t, uint32_t>* keys_and_slots,
             const char* records, int64_t record_bytes) const;

 private:
  // One pass of Demote: down to 7/8 of `limit` rows.
  Status DemotePass(TableShard* sh, int64_t limit, const std::vector<int64_t>& keep, bool* renumbered);
  const TableConfig& config_;
  std::atomic<bool> index_warned_{false};  // the disk index took over half a shard's budget (said once)
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TIERING_H_
