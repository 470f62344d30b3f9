// EmbeddingTable: a dynamic hash table from int64 keys to float32 rows (stored as fp32, bf16 or
// int8: row_layout.h), the resource behind every ttf embedding op.
//
// The table is an orchestrator of shards, locks and the step; each concern lives in files of
// its own, as concrete members (no virtual call per key):
//   table_hash.h     the key hash, shard and partition     page_memory.h     huge-page memory
//   row_store.h      key index and DRAM rows                table_config.h    config, initializer
//   admission.h      candidates, count-min sketch           eviction.h        capacity, LRU/LFU/TTL
//   disk_tier.h      disk index and file (disk_reads.h)     tiering.h         demote, promote, write-back
//   change_log.h     removed keys, per reader               table_snapshot.h  export, save, import
//   table_shard.h    one shard: its rows and each concern's state
//   group_keys.h     a batch's distinct keys by shard (grouped_keys.h: the latest training lookup's, kept)
// The table's own methods are defined by concern too: embedding_table.cc (updates, removal,
// stats), table_lookup.cc (Find, FindEach), table_snapshot.cc (Export, Save, Import, the
// change log's reads).
//
// Layout. The table is split into shards by key hash; each shard has its own lock, its own
// index and DRAM rows (row_store.h) and each concern's state for it (table_shard.h).
//
// Memory per key with dim 16 and Adam: 192 bytes of row, 16 bytes of metadata and 12 bytes
// per index slot at a load factor between 3/8 and 3/4 (16-32 bytes), i.e. 224-240 bytes
// against 200 raw bytes (8-byte key + 3 * 16 floats).
//
// Concurrency. A shard's lock guards its index, its stores, its rows and each concern's state
// for it (its change log included). Lookups (training and inference: neither changes the table) take it shared;
// optimizer updates (which insert, count, admit and evict by capacity) and explicit
// evictions take it exclusive. An operation holds one shard lock at a time, except the
// whole-table operations, which take all of them in shard order (so they cannot deadlock
// with each other): slot re-layout and Import take them exclusive (the slot layout and the
// content change for every shard at once: no reader ever sees two layouts), Export takes
// them shared (one consistent snapshot, one layout; writers wait, readers go on). A save
// (Save) takes one shard lock at a time, shared: each shard is a consistent snapshot and an
// update waits for one shard's copy at most; it holds relayout_mu_ shared throughout, so the
// slot layout stays one and no Import lands in the middle. Growth
// allocates with the lock released (ReserveRoom), then re-takes it to rehash, so a growing
// shard never blocks readers during the allocation itself.
#ifndef TTF_OPS_KERNELS_EMBEDDING_TABLE_H_
#define TTF_OPS_KERNELS_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "admission.h"
#include "change_log.h"
#include "disk_tier.h"
#include "eviction.h"
#include "grouped_keys.h"
#include "row_layout.h"
#include "row_store.h"
#include "table_config.h"
#include "table_hash.h"
#include "table_shard.h"
#include "table_snapshot.h"
#include "tiering.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

class EmbeddingTable : public ResourceBase {
 public:
  explicit EmbeddingTable(const TableConfig& config);

  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return MemoryBytes(); }

  const TableConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  // How rows are stored now (format and optimizer slots); read under any shard lock (it
  // changes with the slot layout, under every one).
  const RowLayout& layout() const { return layout_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  // A 32-bit division (24 bits of hash by at most 4,096 shards: the same result), where a
  // 64-bit one took ~4% of the samples of an inference lookup, which shards every id.
  int ShardOf(uint64_t hash) const {
    return static_cast<int>(static_cast<uint32_t>(hash >> 40) % static_cast<uint32_t>(shards_.size()));
  }
  TableShard& shard(int i) { return *shards_[i]; }
  // The grouping of the latest training lookup, for the apply handed its distinct keys.
  LastGrouping& last_grouping() { return last_grouping_; }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  void AdvanceStep(int64_t step);

  // Lookup of distinct keys (all in shard `s`), read-only (shared lock): copies each key's
  // value into `out` (rows of dim). A missing key reads the row it would get if this step's
  // update inserted it: with `training`, the initializer's row when the key would be admitted
  // at this sighting (always without admission), else the default row; without `training`
  // (inference), always the default row. Nothing is inserted or counted: a step that never
  // reaches its update (a skipped, non-finite step) leaves the table as it was.
  // A key whose row is on the disk tier reads it from there (promotion happens at apply).
  Status Find(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, bool training, float* out) const;
  // Inference lookup of n ids as they come, duplicates and all (no de-dup, no grouping by
  // shard): out[i] = the value of keys[i], or the default row for a missing key. Every shard
  // lock is held shared, 4096 ids at a time. Tiered: the ids of those 4096 without a DRAM row
  // then go to Find (FindMissing), which reads them from disk, batched per shard; dram_hits
  // count ids, disk_hits a span's distinct keys. Returns Find's disk read error.
  Status FindEach(const int64_t* keys, int64_t n, float* out) const;
  static constexpr int64_t kFindEachSpan = 4096;  // ids FindEach probes under one set of shard locks
  // Counts one sighting at step `now` of each of n distinct keys of shard `s`, whose lock the
  // caller holds exclusively in `lock` (released and re-taken to grow the shard): a key with a
  // row gets count + 1 and last_seen = now; a missing key gets a row (initializer, then the
  // slots' initial values) or, under admission, counts as a candidate until admitted. ids[i]
  // is the key's row id, KeyIndex::kNone for a key not (yet) admitted. The optimizer apply
  // ops call it for the keys they update, so insertion happens at apply, never in forward.
  // Tiered: a key on disk is promoted (read back into DRAM, meta and all), and first, when
  // this update would take DRAM past its budget, the least recently updated rows not in this
  // update are demoted to disk. A failed disk read or write (a full disk) returns the error
  // with the shard consistent: every row is in exactly one tier, none changed by this call
  // unless the error comes from a read of a promotion (keys before it are then counted).
  // A promoted row whose history ranks below the last row demoted (ShardTier::last_demoted)
  // is marked for WriteBack, which the caller runs once it has updated the rows.
  Status TouchKeys(int s, std::unique_lock<std::shared_mutex>& lock, const int64_t* keys, const uint64_t* hashes,
                 int64_t n, int64_t now, uint32_t* ids);
  // After TouchKeys and the update of its rows (same exclusive lock): writes the rows TouchKeys
  // marked back to disk and drops them from DRAM. A failed write keeps them in DRAM (the
  // shard stays consistent, over its DRAM limit by at most this update's rows; the next
  // update's demotion meets the same disk and reports it); a failed compaction is returned.
  Status WriteBack(int s);
  // TouchKeys at the table step, then copies each key's value into `out` (the default row for
  // a key not yet admitted): fills a table outside training (TtfTableFindOrInsert).
  Status FindOrInsert(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, float* out);

  // Makes rows hold `slot_init.size()` optimizer slots for `optimizer`, widening every row
  // (slot j filled with slot_init[j]) the first time. Fails if another optimizer's slots
  // are already there.
  Status EnsureSlots(const std::string& optimizer, const std::vector<float>& slot_init);

  int64_t Size() const;
  int64_t CandidateCount() const;
  int64_t CandidatesDropped() const;
  int64_t RowsEvicted() const;  // by the capacity and TTL policy
  // Creates the disk tier's files (tiered tables; before first use).
  Status OpenTier();
  struct TierStats {
    int64_t dram_rows = 0, disk_rows = 0, dram_hits = 0, disk_hits = 0, demoted = 0, promoted = 0;
    int64_t written_back = 0;  // of demoted: disk rows an update read and wrote straight back
    int64_t dram_bytes = 0, disk_index_bytes = 0, disk_file_bytes = 0, dram_row_limit = 0;
    int64_t disk_waits = 0;  // lookups' disk reads that missed the page cache
    int64_t crowded_shards = 0;  // shards whose disk index takes over half their share of dram_budget
  };
  TierStats Tiers() const;
  int64_t MemoryBytes() const;
  // Removes keys whose last-seen step is below min_last_seen or whose count is below
  // min_count, from both tiers; candidates go by last-seen only. Sets the number of rows
  // removed. A disk tier that cannot be read fails it (Internal, naming ssd_dir).
  Status Evict(int64_t min_last_seen, int64_t min_count, int64_t* evicted);
  // Removes these keys' rows and candidates; sets the number of rows removed. A disk tier
  // that cannot be read fails it (Internal, naming ssd_dir; the keys reached before the
  // failing read are removed, every key still in one tier or gone).
  Status Remove(const int64_t* keys, int64_t n, int64_t* removed);

  // One consistent snapshot under every shard lock (shared): the rows and candidates whose
  // last-seen step is > since_step (INT64_MIN: all), written straight into the buffers
  // `allocate` returns. With `deleted` non-null, also the keys the change log holds for
  // `reader` (removed since that reader's last reset; sorted, distinct); reset_deleted clears
  // the reader's record in the same snapshot and starts it if it was off. stored_values: each
  // row's value part as the row store holds it (layout().value_words() words: int8 codes with
  // their scale and bias, bf16 pairs, or the floats), no slots, instead of the full layout.
  Status Export(int64_t since_step, const ExportAllocator& allocate, std::vector<int64_t>* deleted,
                bool reset_deleted, int reader, bool stored_values = false);
  // A streamed save (TtfTableSave): the rows and candidates last seen after since_step
  // (INT64_MIN: all) into the piece `allocate` sets up, written out each time it is full.
  // One lock shard at a time, held shared while its rows (DRAM, then its disk tier's, read
  // sequentially) and candidates are copied: each shard is a consistent snapshot, and an
  // update waits for one shard's copy (plus a piece's write when a shard holds more than a
  // piece). A piece is written with no lock held when the next shard would not fit in it.
  // In the same step as a shard's copy, the change log's new removals for `reader` are taken
  // with it (ShardChangeLog::TakeForSave); `deleted` gets every shard's taken keys (sorted,
  // distinct): the keys removed since the reader's last committed save. layout.step is read
  // before the first shard: a row changed after its shard's copy is stamped with a later step
  // by its update.
  Status Save(int64_t since_step, const SaveAllocator& allocate, std::vector<int64_t>* deleted, int reader);
  // A save is durable (TtfTableCommitSave): forgets the removed keys saves took for `reader`;
  // removals recorded after each shard's copy stay for the next delta.
  void CommitSave(int reader);
  // Returns (and with reset, clears and starts) the change log's record for `reader`.
  void DeletedKeys(bool reset, std::vector<int64_t>* deleted, int reader);
  // Replaces the content (or upserts into it, src.merge) from an export; validates `src`
  // completely before anything changes.
  Status Import(const ImportSource& src);

 private:
  // FindEach's ids without a DRAM row (n <= kFindEachSpan positions in `keys`): Find of each
  // shard's distinct keys among them, each row copied to out + position * dim.
  Status FindMissing(const int64_t* keys, const int32_t* positions, int64_t n, float* out) const;
  // After an update at step `now` (shard lock held exclusively): TTL sweep, then eviction
  // down to the shard's share of the capacity by policy, never touching rows updated at `now`.
  // Tiered: the capacity counts both tiers' rows, and rows leave either tier by the policy.
  Status EnforceCapacity(TableShard* sh, int64_t now);
  // Removes each key's row (DRAM or disk) and candidate and records it in the change log;
  // adds the rows removed to *removed. Lock held exclusively. A failed disk read stops it there.
  Status RemoveKeys(TableShard* sh, const std::vector<int64_t>& keys, int64_t* removed);
  // CompactShard at the shard's DRAM limit (tiered) or without one. Returns whether the rows moved.
  bool CompactIfSparse(TableShard* sh);
  void CollectDeleted(bool reset, std::vector<int64_t>* deleted, int reader);  // all shard locks held
  // With `lock` held exclusively on shard `s`, makes room for `extra` more keys in `ks`.
  // Allocation happens with the lock released; returns with it held again. The caller
  // must re-probe afterwards: other threads may have changed the shard meanwhile.
  void ReserveRoom(std::unique_lock<std::shared_mutex>& lock, KeyedStore* ks, int64_t extra);
  void FillDefault(float* out) const;
  // Rebuilds every shard's rows (both tiers) with `slot_init.size()` slots (every shard lock
  // held exclusively, and relayout_mu_). Disk tiers first: their rewrite can fail, and then
  // nothing changed but those before.
  Status Relayout(const std::string& optimizer, const std::vector<float>& slot_init);

  const TableConfig config_;
  // The concerns' policies (their per-shard state is in TableShard), built from config_.
  const Admission admission_;
  const Eviction eviction_;
  Tiering tiering_;
  ChangeLog change_log_;
  std::vector<std::unique_ptr<TableShard>> shards_;
  std::atomic<int64_t> step_{0};
  // Set once by EnsureSlots/Import under every shard lock; read under any shard lock.
  std::string optimizer_;
  std::vector<float> slot_init_;
  RowLayout layout_;  // of config_.rows, optimizer_ and slot_init_
  // Held shared by Save for its whole span, exclusively by the slot re-layout and Import,
  // before any other lock: a save copies its shards under one layout and one content. The
  // change log's lock (change_log_.mu()) comes next, then the shard locks in shard order.
  std::shared_mutex relayout_mu_;
  LastGrouping last_grouping_;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_EMBEDDING_TABLE_H_
