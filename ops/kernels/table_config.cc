#include "table_config.h"

#include <cmath>

#include "row_layout.h"
#include "row_store.h"
#include "table_hash.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ttf {

Status ParseInitKind(const std::string& name, InitKind* kind) {
  if (name == "normal") *kind = InitKind::kNormal;
  else if (name == "truncated_normal") *kind = InitKind::kTruncatedNormal;
  else if (name == "uniform") *kind = InitKind::kUniform;
  else if (name == "zeros") *kind = InitKind::kZeros;
  else if (name == "constant") *kind = InitKind::kConstant;
  else
    return errors::InvalidArgument("initializer must be one of normal, truncated_normal, uniform, zeros, ",
                                   "constant; got '", name, "'");
  return OkStatus();
}

Status ParseEvictPolicy(const std::string& name, EvictPolicy* policy) {
  if (name == "lru") *policy = EvictPolicy::kLru;
  else if (name == "lfu") *policy = EvictPolicy::kLfu;
  else if (name == "ttl") *policy = EvictPolicy::kTtl;
  else return errors::InvalidArgument("evict_policy must be one of lru, lfu, ttl; got '", name, "'");
  return OkStatus();
}

bool TableConfig::operator==(const TableConfig& o) const {
  return dim == o.dim && init.kind == o.init.kind && init.a == o.init.a && init.b == o.init.b &&
         init.seed == o.init.seed && default_value == o.default_value &&
         admission_min_count == o.admission_min_count && max_candidates == o.max_candidates &&
         num_shards == o.num_shards && capacity == o.capacity && capacity_bytes == o.capacity_bytes &&
         evict_policy == o.evict_policy && ttl_steps == o.ttl_steps && dram_budget == o.dram_budget && ssd_dir == o.ssd_dir &&
         admission_sketch_bytes == o.admission_sketch_bytes && rows == o.rows;
}

std::string TableConfig::DebugString() const {
  static const char* kKinds[] = {"normal", "truncated_normal", "uniform", "zeros", "constant"};
  static const char* kPolicies[] = {"lru", "lfu", "ttl"};
  return strings::StrCat("dim=", dim, ", initializer=", kKinds[static_cast<int>(init.kind)], ", init_a=", init.a,
                         ", init_b=", init.b, ", seed=", init.seed, ", default_value=", default_value,
                         ", admission_min_count=", admission_min_count, ", max_candidates=", max_candidates,
                         ", num_shards=", num_shards, ", capacity=", capacity,
                         ", capacity_bytes=", capacity_bytes, ", evict_policy=",
                         kPolicies[static_cast<int>(evict_policy)], ", ttl_steps=", ttl_steps,
                         ", dram_budget=", dram_budget, ", ssd_dir='", ssd_dir,
                         "', admission_sketch_bytes=", admission_sketch_bytes, ", rows=", RowFormatName(rows));
}

Status ValidateConfig(const TableConfig& c) {
  if (c.dim < 1 || c.dim > kMaxDim)
    return errors::InvalidArgument("dim must be in [1, ", kMaxDim, "], got ", c.dim);
  if (c.num_shards < 1 || c.num_shards > kMaxShards)
    return errors::InvalidArgument("num_shards must be in [1, ", kMaxShards, "], got ", c.num_shards);
  if (c.admission_min_count < 0)
    return errors::InvalidArgument("admission_min_count must be >= 0, got ", c.admission_min_count);
  if (c.max_candidates < 1 || c.max_candidates > kMaxCandidates)
    return errors::InvalidArgument("max_candidates must be in [1, ", kMaxCandidates, "], got ", c.max_candidates);
  if (c.admission_sketch_bytes < 0 || c.admission_sketch_bytes > (int64_t{1} << 40))
    return errors::InvalidArgument("admission_sketch_bytes must be in [0, 2^40], got ", c.admission_sketch_bytes);
  if (c.admission_sketch_bytes > 0 && c.admission_min_count == 0)
    return errors::InvalidArgument("admission_sketch_bytes (", c.admission_sketch_bytes,
                                   ") counts admission sightings: set admission_min_count > 0 too, or leave it 0");
  if (c.admission_sketch_bytes > 0 && c.admission_sketch_bytes / c.num_shards < 512)
    return errors::InvalidArgument("admission_sketch_bytes (", c.admission_sketch_bytes, ") must give each of the ",
                                   c.num_shards, " shards at least 512 bytes");
  if (c.capacity < 0) return errors::InvalidArgument("capacity must be >= 0 (0: unbounded), got ", c.capacity);
  if (c.capacity_bytes < 0)
    return errors::InvalidArgument("capacity_bytes must be >= 0 (0: no byte capacity), got ", c.capacity_bytes);
  if (c.capacity > 0 && c.capacity_bytes > 0)
    return errors::InvalidArgument("capacity (", c.capacity, " rows) and capacity_bytes (", c.capacity_bytes,
                                   ") both set: give the capacity in rows or in bytes, not both");
  if (c.capacity_bytes > 0 && c.dram_budget > 0)
    return errors::InvalidArgument("capacity_bytes (", c.capacity_bytes, ") with dram_budget (", c.dram_budget,
                                   "): a tiered table's RAM is already bounded by dram_budget; use capacity (rows) "
                                   "to bound both tiers");
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(c, RowLayout(c.rows, c.dim, "", 0).words(), 0));
  if (c.ttl_steps < 0) return errors::InvalidArgument("ttl_steps must be >= 0, got ", c.ttl_steps);
  if (c.dram_budget < 0) return errors::InvalidArgument("dram_budget must be >= 0 bytes (0: no SSD tier), got ", c.dram_budget);
  if (c.tiered() == c.ssd_dir.empty())
    return errors::InvalidArgument("dram_budget (", c.dram_budget, ") and ssd_dir ('", c.ssd_dir,
                                   "') go together: set both for a DRAM + SSD tier, or neither");
  if ((c.evict_policy == EvictPolicy::kTtl) != (c.ttl_steps > 0))
    return errors::InvalidArgument("ttl_steps (", c.ttl_steps, ") must be > 0 exactly when evict_policy is 'ttl'");
  if (!std::isfinite(c.init.a) || !std::isfinite(c.init.b))
    return errors::InvalidArgument("init_a and init_b must be finite, got ", c.init.a, " and ", c.init.b);
  if (!std::isfinite(c.default_value))
    return errors::InvalidArgument("default_value must be finite, got ", c.default_value);
  const InitKind kind = c.init.kind;
  if ((kind == InitKind::kNormal || kind == InitKind::kTruncatedNormal) && !(c.init.b > 0))
    return errors::InvalidArgument("initializer '", kind == InitKind::kNormal ? "normal" : "truncated_normal",
                                   "' needs a stddev (init_b) > 0, got ", c.init.b);
  if (kind == InitKind::kUniform && !(c.init.a < c.init.b))
    return errors::InvalidArgument("uniform initializer needs minval (init_a) < maxval (init_b), got ", c.init.a,
                                   " and ", c.init.b);
  return OkStatus();
}

Status CheckCapacityBytesHoldARow(const TableConfig& c, int64_t stride, int64_t num_slots) {
  if (c.capacity_bytes == 0 || c.capacity_bytes / c.num_shards >= RowBytes(stride)) return OkStatus();
  return errors::InvalidArgument("capacity_bytes (", c.capacity_bytes, ") gives each of the ", c.num_shards,
                                 " shards ", c.capacity_bytes / c.num_shards, " bytes, below one row of ",
                                 RowBytes(stride), " bytes (", num_slots,
                                 " optimizer slot(s) at dim ", c.dim, "): raise it to at least ",
                                 RowBytes(stride) * c.num_shards, " or use fewer num_shards");
}

bool SlotsOfOptimizer(const std::string& optimizer, int64_t* num_slots) {
  if (optimizer.empty() || optimizer == "sgd") *num_slots = 0;
  else if (optimizer == "adagrad") *num_slots = 1;
  else if (optimizer == "adam" || optimizer == "ftrl") *num_slots = 2;
  else return false;
  return true;
}

namespace {
// Uniform in (0, 1) from counter `c` of the key's stream: 53 random bits, never 0 or 1.
inline double Uniform01(uint64_t stream, uint64_t c) {
  return (static_cast<double>(Mix64(stream + c) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
// Standard normal by Box-Muller from two uniforms of the stream.
inline double Normal(uint64_t stream, uint64_t c) {
  const double u1 = Uniform01(stream, c), u2 = Uniform01(stream, c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

void RowInitializer::Fill(int64_t key, float* row, int64_t dim) const {
  // Each element j draws from its own counter range (j << 8), so element values do not
  // depend on dim, and truncated-normal redraws (up to 127) never overlap the next element.
  const uint64_t stream = Mix64(static_cast<uint64_t>(seed) ^ Mix64(static_cast<uint64_t>(key)));
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t c = static_cast<uint64_t>(j) << 8;
    double v = 0.0;
    switch (kind) {
      case InitKind::kZeros: v = 0.0; break;
      case InitKind::kConstant: v = a; break;
      case InitKind::kUniform: v = a + (b - a) * Uniform01(stream, c); break;
      case InitKind::kNormal: v = a + b * Normal(stream, c); break;
      case InitKind::kTruncatedNormal: {
        double z = Normal(stream, c);
        for (uint64_t t = 1; std::fabs(z) > 2.0 && t < 127; ++t) z = Normal(stream, c + 2 * t);
        if (std::fabs(z) > 2.0) z = 0.0;  // probability ~1e-170: keep the bound exact
        v = a + b * z;
        break;
      }
    }
    row[j] = static_cast<float>(v);
  }
}

}  // namespace ttf
}  // namespace tensorflow
