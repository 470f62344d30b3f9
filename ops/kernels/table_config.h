// A table's configuration (TableConfig, checked once by ValidateConfig when the table is
// created) and the function that fills a new key's row (RowInitializer).
#ifndef TTF_OPS_KERNELS_TABLE_CONFIG_H_
#define TTF_OPS_KERNELS_TABLE_CONFIG_H_

#include <cstdint>
#include <string>

#include "row_codec.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

enum class InitKind { kNormal, kTruncatedNormal, kUniform, kZeros, kConstant };
Status ParseInitKind(const std::string& name, InitKind* kind);

// How a new key's row is filled: a pure function of (seed, key), so values never depend on
// arrival order, on threads, or on how the table is sharded.
struct RowInitializer {
  InitKind kind = InitKind::kUniform;
  float a = -0.05f;  // normal/truncated_normal: mean; uniform: minval; constant: value
  float b = 0.05f;   // normal/truncated_normal: stddev; uniform: maxval
  int64_t seed = 0;
  void Fill(int64_t key, float* row, int64_t dim) const;
};

// Bounds on a table's size attributes: rows of more than kMaxDim floats, or more than
// kMaxShards shards, are refused when the table is created (a chunk of kChunkRows rows
// must stay a sane allocation, and sizes must never overflow).
constexpr int64_t kMaxDim = 4096;
constexpr int64_t kMaxShards = 4096;
constexpr int64_t kMaxCandidates = int64_t{1} << 31;

// Which rows go first when a table holds more than its capacity: least recently updated
// (LRU, by last-seen step), least often updated (LFU, by count), or, for TTL, every row not
// updated for ttl_steps steps (and LRU order above the capacity, if one is set).
enum class EvictPolicy { kLru, kLfu, kTtl };
Status ParseEvictPolicy(const std::string& name, EvictPolicy* policy);

struct TableConfig {
  int64_t dim = 0;
  RowInitializer init;
  float default_value = 0.0f;         // the row a missing (or not yet admitted) key reads
  int64_t admission_min_count = 0;    // a key gets a row once seen in this many updates
  int64_t max_candidates = int64_t{1} << 22;  // admission candidates kept (oldest dropped)
  // > 0: sightings counted in a count-min sketch of this many bytes (AdmissionSketch), no
  // candidates stored.
  int64_t admission_sketch_bytes = 0;
  int num_shards = 16;
  // Bounded size: at most `capacity` rows (0: unbounded) after each update, plus that
  // update's own new keys; rows beyond it go by `evict_policy` (ttl: also every row not
  // updated for ttl_steps steps).
  int64_t capacity = 0;
  // Bounded size in bytes instead (0: none; not with `capacity`, not tiered): each shard keeps
  // at most capacity_bytes / num_shards bytes of rows, RowBytes each at the current width.
  int64_t capacity_bytes = 0;
  EvictPolicy evict_policy = EvictPolicy::kLru;
  int64_t ttl_steps = 0;
  // DRAM + SSD tier (both set, or neither): rows beyond `dram_budget` bytes of DRAM rows
  // (value, slots, metadata and their index entry) live in files under `ssd_dir`.
  int64_t dram_budget = 0;
  std::string ssd_dir;
  // How rows are stored (row_layout.h): fp32, or bf16 / row-wise int8 written back with
  // seeded stochastic rounding. Not with the DRAM + SSD tier yet.
  RowFormat rows = RowFormat::kFp32;
  bool tiered() const { return dram_budget > 0; }
  // A capacity (rows or bytes) bounds the rows after each update.
  bool capped() const { return capacity > 0 || capacity_bytes > 0; }
  bool operator==(const TableConfig& o) const;
  std::string DebugString() const;
};
// Checks every field of a config for a table's creation (InvalidArgument naming the attr).
Status ValidateConfig(const TableConfig& config);
// InvalidArgument unless a capacity_bytes config gives each shard room for one row of
// `words` 4-byte words (the row width grows when an optimizer adds its num_slots slots).
Status CheckCapacityBytesHoldARow(const TableConfig& config, int64_t words, int64_t num_slots);

// The slot count each optimizer's apply op keeps per row ("" = rows without slots).
// Returns false for a name no apply op uses.
bool SlotsOfOptimizer(const std::string& optimizer, int64_t* num_slots);

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TABLE_CONFIG_H_
