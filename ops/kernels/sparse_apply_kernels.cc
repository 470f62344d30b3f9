// Kernels of the fused sparse optimizer updates (ops/sparse_apply_ops.cc). One kernel
// template does the shared work (validate, sum duplicate keys, group by shard, lock each
// shard once); each optimizer is a small row-update functor whose formulas follow tf_keras'
// optimizer of the same name, in float32 as Keras computes them.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compressed_updates.h"
#include "embedding_table.h"
#include "table_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace ttf {
namespace {

// Whether all n floats are finite, in one branch-free pass the compiler vectorizes with
// baseline SSE2 (a loop of std::isfinite with an early exit per element is scalar): adding 1
// to the exponent field carries into the sign bit only when the exponent is all ones.
bool AllFinite(const float* x, int64_t n) {
  typedef uint32_t __attribute__((may_alias)) FloatBits;  // reads the floats' bits, legally
  const FloatBits* bits = reinterpret_cast<const FloatBits*>(x);
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) non_finite |= (bits[i] & 0x7f800000u) + 0x00800000u;
  return (non_finite >> 31) == 0;
}

// Each functor: kName (the slot owner recorded in the table), kNumScalars (float inputs
// after grads), SlotInit (initial slot values), Check (the hyperparameters' ranges, as
// tf_keras' optimizer of the same name accepts them, narrowed where a value would turn
// rows into NaN/inf), a constructor from the scalars and the step, and
// Update(row, grad, dim) where row is [value | slots...], and Rowwise / MakeRowwise: the
// functor for int8 rows, whose state is row-wise (row_layout.h; the functor itself where
// no row-wise form is used).

// InvalidArgument unless `value` is finite and lies in the range the predicate accepts.
template <typename Pred>
Status CheckScalar(const char* name, float value, Pred ok, const char* range) {
  if (!std::isfinite(value) || !ok(value))
    return errors::InvalidArgument(name, " must be finite and ", range, ", got ", value);
  return OkStatus();
}
const auto kNonNegative = [](float v) { return v >= 0.0f; };
const auto kPositive = [](float v) { return v > 0.0f; };
const auto kUnitInterval = [](float v) { return v >= 0.0f && v < 1.0f; };

struct SgdUpdate {
  static constexpr const char* kName = "sgd";
  static constexpr int kNumScalars = 1;
  static std::vector<float> SlotInit(float) { return {}; }
  static Status Check(const float* s, float) { return CheckScalar("learning_rate", s[0], kNonNegative, ">= 0"); }
  float lr;
  SgdUpdate(const float* s, int64_t) : lr(s[0]) {}
  using Rowwise = SgdUpdate;
  static Rowwise MakeRowwise(const float* s, int64_t step) { return SgdUpdate(s, step); }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    for (int64_t j = 0; j < dim; ++j) row[j] -= lr * g[j];
  }
};

struct AdagradUpdate {
  static constexpr const char* kName = "adagrad";
  static constexpr int kNumScalars = 2;
  static std::vector<float> SlotInit(float initial_accumulator) { return {initial_accumulator}; }
  static Status Check(const float* s, float initial_accumulator) {
    TF_RETURN_IF_ERROR(CheckScalar("learning_rate", s[0], kNonNegative, ">= 0"));
    // With both zero, a zero gradient on a fresh row divides 0 by sqrt(0).
    if (initial_accumulator == 0.0f)
      return CheckScalar("epsilon", s[1], kPositive, "> 0 when initial_accumulator_value is 0");
    return CheckScalar("epsilon", s[1], kNonNegative, ">= 0");
  }
  float lr, epsilon;
  AdagradUpdate(const float* s, int64_t) : lr(s[0]), epsilon(s[1]) {}
  using Rowwise = RowwiseAdagradUpdate;
  static Rowwise MakeRowwise(const float* s, int64_t) { return RowwiseAdagradUpdate{s[0], s[1]}; }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    float* __restrict accum = row + dim;
    for (int64_t j = 0; j < dim; ++j) {
      accum[j] += g[j] * g[j];
      row[j] -= lr * g[j] / std::sqrt(accum[j] + epsilon);  // Keras: epsilon inside the root
    }
  }
};

struct AdamUpdate {
  static constexpr const char* kName = "adam";
  static constexpr int kNumScalars = 4;
  static std::vector<float> SlotInit(float) { return {0.0f, 0.0f}; }
  static Status Check(const float* s, float) {
    TF_RETURN_IF_ERROR(CheckScalar("learning_rate", s[0], kNonNegative, ">= 0"));
    TF_RETURN_IF_ERROR(CheckScalar("beta_1", s[1], kUnitInterval, "in [0, 1)"));
    TF_RETURN_IF_ERROR(CheckScalar("beta_2", s[2], kUnitInterval, "in [0, 1)"));
    // epsilon 0 makes a touched row with m = v = 0 (a zero gradient) 0 / 0.
    return CheckScalar("epsilon", s[3], kPositive, "> 0");
  }
  float beta_1, beta_2, epsilon, alpha;
  AdamUpdate(const float* s, int64_t step) : beta_1(s[1]), beta_2(s[2]), epsilon(s[3]) {
    const float t = static_cast<float>(step);
    alpha = s[0] * std::sqrt(1.0f - std::pow(beta_2, t)) / (1.0f - std::pow(beta_1, t));
  }
  using Rowwise = PartialRowwiseAdamUpdate;
  static Rowwise MakeRowwise(const float* s, int64_t step) { return Rowwise(s[0], s[1], s[2], s[3], step); }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    float* __restrict m = row + dim;
    float* __restrict v = row + 2 * dim;
    for (int64_t j = 0; j < dim; ++j) {
      m[j] += (g[j] - m[j]) * (1.0f - beta_1);
      v[j] += (g[j] * g[j] - v[j]) * (1.0f - beta_2);
      row[j] -= (m[j] * alpha) / (std::sqrt(v[j]) + epsilon);
    }
  }
};

struct FtrlUpdate {
  static constexpr const char* kName = "ftrl";
  static constexpr int kNumScalars = 6;
  static std::vector<float> SlotInit(float initial_accumulator) { return {initial_accumulator, 0.0f}; }
  static Status Check(const float* s, float initial_accumulator) {
    TF_RETURN_IF_ERROR(CheckScalar("learning_rate", s[0], kPositive, "> 0 (FTRL divides by it)"));
    TF_RETURN_IF_ERROR(CheckScalar("learning_rate_power", s[1], [](float v) { return v <= 0.0f; }, "<= 0"));
    TF_RETURN_IF_ERROR(CheckScalar("l1", s[2], kNonNegative, ">= 0"));
    TF_RETURN_IF_ERROR(CheckScalar("l2", s[3], kNonNegative, ">= 0"));
    TF_RETURN_IF_ERROR(CheckScalar("l2_shrinkage", s[4], kNonNegative, ">= 0"));
    TF_RETURN_IF_ERROR(CheckScalar("beta", s[5], kNonNegative, ">= 0"));
    // The quadratic term is accum^-power / lr + 2 (l2 + beta / (2 lr)): zero for a fresh
    // row with a zero gradient unless one of these is positive.
    if (initial_accumulator == 0.0f && s[3] == 0.0f && s[5] == 0.0f)
      return errors::InvalidArgument("ftrl needs initial_accumulator_value > 0, l2 > 0 or beta > 0 (else a zero "
                                     "gradient divides 0 by 0); all three are 0");
    return OkStatus();
  }
  float lr, lr_power, l1, l2_reg, l2_shrinkage;
  FtrlUpdate(const float* s, int64_t)
      : lr(s[0]), lr_power(s[1]), l1(s[2]), l2_reg(s[3] + s[5] / (2.0f * s[0])), l2_shrinkage(s[4]) {}
  float Power(float x) const { return lr_power == -0.5f ? std::sqrt(x) : std::pow(x, -lr_power); }
  using Rowwise = FtrlUpdate;
  static Rowwise MakeRowwise(const float* s, int64_t step) { return FtrlUpdate(s, step); }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    float* __restrict accum = row + dim;
    float* __restrict linear = row + 2 * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float w = row[j];
      const float grad_to_use = g[j] + 2.0f * l2_shrinkage * w;
      const float new_accum = accum[j] + g[j] * g[j];
      const float new_power = Power(new_accum);
      linear[j] += grad_to_use - (new_power - Power(accum[j])) / lr * w;
      const float quadratic = new_power / lr + 2.0f * l2_reg;
      const float clipped = std::min(std::max(linear[j], -l1), l1);
      row[j] = (clipped - linear[j]) / quadratic;
      accum[j] = new_accum;
    }
  }
};

// Updates the admitted rows ids[i] (kNone: skipped) of one shard with grads row i (weight
// decay first, as Keras); returns how many. fp32 rows in place; compressed rows decoded to
// fp32, updated, and written back with stochastic rounding drawn from (seed, key, step).
template <typename F>
int64_t UpdateRows(const F& update, const RowLayout& layout, uint64_t seed, int64_t step, float weight_decay,
                   float lr, const int64_t* keys, const uint32_t* ids, int64_t n, const float* grads, RowStore* store) {
  const int64_t dim = layout.dim(), row_bytes = layout.words() * 4;
  thread_local std::vector<float> work;
  work.resize(layout.work_floats());
  int64_t done = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + 8 < n && ids[i + 8] != KeyIndex::kNone) {  // the whole row: value and slots
      const char* ahead = reinterpret_cast<const char*>(store->row(ids[i + 8]));
      for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b, 1);
      // A compressed row is not a whole number of lines (int8 Adam at dim 32: 112 bytes), so
      // it can end on a line the loop above does not reach.
      if (row_bytes % 64 != 0) __builtin_prefetch(ahead + row_bytes - 1, 1);
    }
    if (ids[i] == KeyIndex::kNone) continue;  // not admitted yet: counted, gradient dropped
    float* stored = store->row(ids[i]);
    float* row = layout.fp32() ? stored : work.data();
    if (!layout.fp32()) layout.Decode(stored, row);
    if (weight_decay * lr != 0.0f) {  // Keras: variable - variable * weight_decay * learning_rate, then the update
      for (int64_t j = 0; j < dim; ++j) row[j] -= row[j] * weight_decay * lr;
    }
    update.Update(row, grads + i * dim, dim);
    if (!layout.fp32()) {
      const RoundingDraws draws(seed, keys[i], step);
      layout.Encode(row, &draws, stored);
    }
    ++done;
  }
  return done;
}

template <typename U>
class TableApplyOp : public TableOpKernel {
 public:
  explicit TableApplyOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    float initial_accumulator = 0.0f;
    if (HasNodeAttr(ctx->def(), "initial_accumulator_value")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &initial_accumulator));
      OP_REQUIRES(ctx, std::isfinite(initial_accumulator) && initial_accumulator >= 0.0f,
                  errors::InvalidArgument("initial_accumulator_value must be finite and >= 0, got ",
                                          initial_accumulator));
    }
    initial_accumulator_ = initial_accumulator;
    slot_init_ = U::SlotInit(initial_accumulator);
    if (HasNodeAttr(ctx->def(), "weight_decay")) {  // graphs written before it have none: 0
      OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay", &weight_decay_));
      OP_REQUIRES(ctx, std::isfinite(weight_decay_) && weight_decay_ >= 0.0f,
                  errors::InvalidArgument("weight_decay must be finite and >= 0, got ", weight_decay_));
    }
  }

  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    const int64_t dim = table->dim();
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be rank 1, got shape ", keys.shape().DebugString()));
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(0) == keys.dim_size(0) && grads.dim_size(1) == dim,
                errors::InvalidArgument("grads must have shape [", keys.dim_size(0), ", ", dim,
                                        "] (one row of the table's dim per key), got ", grads.shape().DebugString()));
    float scalars[U::kNumScalars];
    for (int i = 0; i < U::kNumScalars; ++i) {
      const Tensor& t = ctx->input(3 + i);
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(t.shape()),
                  errors::InvalidArgument("hyperparameter input ", 3 + i, " (", def().input(3 + i),
                                          ") must be a scalar, got shape ", t.shape().DebugString()));
      scalars[i] = t.scalar<float>()();
    }
    OP_REQUIRES_OK(ctx, U::Check(scalars, initial_accumulator_));
    const Tensor& step_t = ctx->input(3 + U::kNumScalars);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step_t.shape()),
                errors::InvalidArgument("step must be a scalar, got shape ", step_t.shape().DebugString()));
    const int64_t step = step_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, step >= 1, errors::InvalidArgument("step must be >= 1 (the 1-based global step), got ", step));
    OP_REQUIRES(ctx, keys.NumElements() <= (int64_t{1} << 31) - 1,
                errors::InvalidArgument("at most 2^31 - 1 keys per call, got ", keys.NumElements()));

    const int64_t n = keys.dim_size(0);
    const float* g = grads.flat<float>().data();
    if (!AllFinite(g, n * dim)) {
      const int64_t i = std::find_if(g, g + n * dim, [](float x) { return !std::isfinite(x); }) - g;
      ctx->CtxFailure(errors::InvalidArgument("grads holds a non-finite value (", g[i], ") in row ", i / dim,
                                              " (key ", keys.flat<int64_t>()(i / dim), "); no row was updated"));
      return;
    }
    OP_REQUIRES_OK(ctx, table->EnsureSlots(U::kName, slot_init_));

    GroupedKeys grouped;
    const float* grouped_grads = g;  // one row per distinct key, in grouped order
    if (!table->last_grouping().Take(keys.flat<int64_t>().data(), n, &grouped)) {
      GroupKeys(keys.flat<int64_t>().data(), n, *table, &grouped);
      // Sum the gradients of duplicate keys (in grouped order) before any row moves.
      std::vector<float>& summed = ScratchRows();
      summed.resize(grouped.size() * dim);
      SumRowsByIndex(g, grouped.inverse.data(), n, grouped.size(), dim, summed.data());
      grouped_grads = summed.data();
    }
    const U update(scalars, step);
    const typename U::Rowwise rowwise_update = U::MakeRowwise(scalars, step);
    const float lr = scalars[0];  // every optimizer's learning rate
    // The layout the rows have with this optimizer's slots: a concurrent import to another
    // changes their stride.
    const RowLayout layout(table->config().rows, dim, U::kName, static_cast<int64_t>(slot_init_.size()));
    const int64_t stride = layout.words();
    const uint64_t seed = static_cast<uint64_t>(table->config().init.seed);
    std::atomic<int64_t> updated{0};
    std::atomic<bool> relaid{false};
    std::vector<Status> shard_status(table->num_shards());
    ForEachShard(ctx, grouped, *table, [&](int s) {
      TableShard& sh = table->shard(s);
      std::unique_lock<std::shared_mutex> lock(sh.mu);
      if (sh.rows.store.stride() != stride) {  // a concurrent import changed the slot layout
        relaid = true;
        return;
      }
      const int64_t begin = grouped.offsets[s], n = grouped.offsets[s + 1] - begin;
      std::vector<uint32_t>& ids = ScratchIds(n);
      // Insertion, counts, last-seen steps and admission happen here, for the keys this
      // step updates: a forward lookup never changes the table.
      shard_status[s] = table->TouchKeys(s, lock, &grouped.keys[begin], &grouped.hashes[begin], n, step, ids.data());
      if (!shard_status[s].ok()) return;  // a tiered table's full disk: this shard's rows unchanged
      if (sh.rows.store.stride() != stride) {  // re-checked: TouchKeys may release the lock to grow
        relaid = true;
        return;
      }
      const int64_t* shard_keys = &grouped.keys[begin];
      const float* shard_grads = grouped_grads + begin * dim;
      const uint32_t* shard_ids = ids.data();
      RowStore* store = &sh.rows.store;
      updated += layout.rowwise()
                     ? UpdateRows(rowwise_update, layout, seed, step, weight_decay_, lr, shard_keys, shard_ids, n,
                                  shard_grads, store)
                     : UpdateRows(update, layout, seed, step, weight_decay_, lr, shard_keys, shard_ids, n, shard_grads,
                                  store);
      shard_status[s] = table->WriteBack(s);  // tiered: updated disk rows DRAM does not keep
    });
    for (const Status& status : shard_status) OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES(ctx, !relaid, errors::Aborted("the table was re-imported with another optimizer during this "
                                              "update; some rows were not updated"));
    table->AdvanceStep(step);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = updated.load();
  }

 private:
  float initial_accumulator_;
  float weight_decay_ = 0.0f;
  std::vector<float> slot_init_;
};

REGISTER_KERNEL_BUILDER(Name("TtfTableApplySgd").Device(DEVICE_CPU), TableApplyOp<SgdUpdate>);
REGISTER_KERNEL_BUILDER(Name("TtfTableApplyAdagrad").Device(DEVICE_CPU), TableApplyOp<AdagradUpdate>);
REGISTER_KERNEL_BUILDER(Name("TtfTableApplyAdam").Device(DEVICE_CPU), TableApplyOp<AdamUpdate>);
REGISTER_KERNEL_BUILDER(Name("TtfTableApplyFtrl").Device(DEVICE_CPU), TableApplyOp<FtrlUpdate>);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
