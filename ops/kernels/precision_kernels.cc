// Kernels of the precision switch (registrations and the rule: ops/precision_ops.cc).
#include <algorithm>
#include <cmath>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"

namespace tensorflow {
namespace ttf {

struct SwitchConfig {
  int64_t warmup_steps = 100;
  double decay = 0.98;
  double spike_k = 4.0;
  double calm_k = 2.0;
  int64_t calm_steps = 10;
  int64_t hold_steps = 100;
  double min_relative_deviation = 0.01;
};

struct SwitchDecision {
  bool use_low_precision;
  bool skip_update;
};

// Layout of TtfPrecisionSwitchExport's `counters`; bump kFormatVersion on any change.
enum Counter {
  kVersion = 0,
  kObserved,
  kUseLow,
  kHoldUntil,
  kCalmRun,
  kLastStep,
  kSpikes,
  kNonFinite,
  kHolding,
  kNumCounters
};
constexpr int64_t kFormatVersion = 1;

class PrecisionSwitch : public ResourceBase {
 public:
  explicit PrecisionSwitch(const SwitchConfig& config) : config_(config) {}

  std::string DebugString() const override {
    mutex_lock lock(mu_);
    return strings::StrCat("TtfPrecisionSwitch(observed=", observed_, ", mean=", mean_,
                           ", deviation=", std::sqrt(variance_), ", low=", use_low_, ")");
  }

  SwitchDecision Observe(double loss, int64_t step) {
    mutex_lock lock(mu_);
    last_step_ = step;
    if (!std::isfinite(loss)) {
      // A NaN/Inf loss says nothing about the loss level: keep it out of the statistics.
      ++non_finite_;
      EnterHold(step);
      return {false, true};
    }
    if (observed_ < std::max<int64_t>(config_.warmup_steps, 1)) {
      Fold(loss);
      return {false, false};
    }
    // Judge the loss against the statistics of the steps before it, then fold it in so a
    // lasting level change becomes the new normal instead of a spike every step.
    const double deviation =
        std::max(std::sqrt(variance_), config_.min_relative_deviation * std::fabs(mean_));
    const bool spike = loss > mean_ + config_.spike_k * deviation;
    const bool calm = loss <= mean_ + config_.calm_k * deviation;
    Fold(loss);
    if (spike) {
      ++spikes_;
      EnterHold(step);
    } else if (calm) {
      ++calm_run_;
    } else {
      calm_run_ = 0;  // between the thresholds: keep the mode, restart the calm count
    }
    if (!use_low_ && step + 1 >= hold_until_ && calm_run_ >= config_.calm_steps) {
      use_low_ = true;
      holding_ = false;
    }
    return {use_low_, false};
  }

  // use_low_precision: the last decision. holding: float32 because of a spike or a
  // non-finite loss (as opposed to warm-up), until low precision is chosen again.
  SwitchDecision Read(bool* holding) const {
    mutex_lock lock(mu_);
    *holding = holding_;
    return {use_low_, false};
  }

  void Export(Tensor* stats, Tensor* counters) const {
    mutex_lock lock(mu_);
    auto s = stats->vec<double>();
    s(0) = mean_;
    s(1) = variance_;
    auto c = counters->vec<int64_t>();
    c(kVersion) = kFormatVersion;
    c(kObserved) = observed_;
    c(kUseLow) = use_low_ ? 1 : 0;
    c(kHoldUntil) = hold_until_;
    c(kCalmRun) = calm_run_;
    c(kLastStep) = last_step_;
    c(kSpikes) = spikes_;
    c(kNonFinite) = non_finite_;
    c(kHolding) = holding_ ? 1 : 0;
  }

  // The caller validated the values (ImportOp::Compute).
  void Import(const Tensor& stats, const Tensor& counters) {
    mutex_lock lock(mu_);
    auto s = stats.vec<double>();
    mean_ = s(0);
    variance_ = s(1);
    auto c = counters.vec<int64_t>();
    observed_ = c(kObserved);
    use_low_ = c(kUseLow) != 0;
    hold_until_ = c(kHoldUntil);
    calm_run_ = c(kCalmRun);
    last_step_ = c(kLastStep);
    spikes_ = c(kSpikes);
    non_finite_ = c(kNonFinite);
    holding_ = c(kHolding) != 0;
  }

 private:
  // Exponentially weighted mean and variance (Finch 2009, "Incremental calculation of
  // weighted mean and variance", eq. 143): alpha = 1 - decay.
  void Fold(double loss) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (observed_ == 0) {
      mean_ = loss;
      variance_ = 0.0;
    } else {
      const double alpha = 1.0 - config_.decay;
      const double diff = loss - mean_;
      const double increment = alpha * diff;
      mean_ += increment;
      variance_ = (1.0 - alpha) * (variance_ + diff * increment);
    }
    ++observed_;
  }

  // Float32 for steps step+1 .. step+hold_steps, and a fresh calm run before going low.
  void EnterHold(int64_t step) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    use_low_ = false;
    holding_ = true;
    calm_run_ = 0;
    hold_until_ = std::max(hold_until_, step + config_.hold_steps + 1);
  }

  const SwitchConfig config_;
  mutable mutex mu_;  // guards every field below: Update can run from several steps at once
  double mean_ TF_GUARDED_BY(mu_) = 0.0;
  double variance_ TF_GUARDED_BY(mu_) = 0.0;
  int64_t observed_ TF_GUARDED_BY(mu_) = 0;
  bool use_low_ TF_GUARDED_BY(mu_) = false;
  int64_t hold_until_ TF_GUARDED_BY(mu_) = 0;
  int64_t calm_run_ TF_GUARDED_BY(mu_) = 0;
  int64_t last_step_ TF_GUARDED_BY(mu_) = -1;
  int64_t spikes_ TF_GUARDED_BY(mu_) = 0;
  int64_t non_finite_ TF_GUARDED_BY(mu_) = 0;
  bool holding_ TF_GUARDED_BY(mu_) = false;
};

class PrecisionSwitchHandleOp : public ResourceOpKernel<PrecisionSwitch> {
 public:
  explicit PrecisionSwitchHandleOp(OpKernelConstruction* ctx)
      : ResourceOpKernel<PrecisionSwitch>(ctx) {
    // Integer ranges are enforced by the registration (int >= 0); floats are checked here.
    float decay, spike_k, calm_k, min_relative_deviation;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("warmup_steps", &config_.warmup_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("decay", &decay));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spike_k", &spike_k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("calm_k", &calm_k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("calm_steps", &config_.calm_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hold_steps", &config_.hold_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_relative_deviation", &min_relative_deviation));
    OP_REQUIRES(ctx, decay > 0.0f && decay < 1.0f,
                errors::InvalidArgument("decay must be in (0, 1), got ", decay));
    OP_REQUIRES(ctx, std::isfinite(spike_k) && spike_k > 0.0f,
                errors::InvalidArgument("spike_k must be finite and > 0, got ", spike_k));
    OP_REQUIRES(ctx, calm_k >= 0.0f && calm_k <= spike_k,
                errors::InvalidArgument("calm_k must be in [0, spike_k=", spike_k, "], got ",
                                        calm_k));
    OP_REQUIRES(ctx, std::isfinite(min_relative_deviation) && min_relative_deviation >= 0.0f,
                errors::InvalidArgument("min_relative_deviation must be finite and >= 0, got ",
                                        min_relative_deviation));
    config_.decay = decay;
    config_.spike_k = spike_k;
    config_.calm_k = calm_k;
    config_.min_relative_deviation = min_relative_deviation;
  }

 private:
  Status CreateResource(PrecisionSwitch** resource) override TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    *resource = new PrecisionSwitch(config_);
    return OkStatus();
  }

  SwitchConfig config_;
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitch").Device(DEVICE_CPU), PrecisionSwitchHandleOp);

namespace {

Status CheckScalar(const Tensor& t, const char* name) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(name, " must be a scalar, got shape ", t.shape().DebugString());
  }
  return OkStatus();
}

}  // namespace

template <typename T>
class PrecisionSwitchUpdateOp : public OpKernel {
 public:
  explicit PrecisionSwitchUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& loss = ctx->input(1);
    const Tensor& step = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(0), "handle"));
    OP_REQUIRES_OK(ctx, CheckScalar(loss, "loss"));
    OP_REQUIRES_OK(ctx, CheckScalar(step, "step"));
    const int64_t step_value = step.scalar<int64_t>()();
    OP_REQUIRES(ctx, step_value >= 0,
                errors::InvalidArgument("step must be >= 0, got ", step_value));
    core::RefCountPtr<PrecisionSwitch> resource;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &resource));

    const SwitchDecision decision =
        resource->Observe(static_cast<double>(loss.scalar<T>()()), step_value);
    Tensor* use_low = nullptr;
    Tensor* skip = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &use_low));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &skip));
    use_low->scalar<bool>()() = decision.use_low_precision;
    skip->scalar<bool>()() = decision.skip_update;
  }
};

#define TTF_REGISTER_UPDATE(T)                                                          \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("TtfPrecisionSwitchUpdate").Device(DEVICE_CPU).TypeConstraint<T>("T"),       \
      PrecisionSwitchUpdateOp<T>);
TTF_REGISTER_UPDATE(bfloat16);
TTF_REGISTER_UPDATE(Eigen::half);
TTF_REGISTER_UPDATE(float);
TTF_REGISTER_UPDATE(double);
#undef TTF_REGISTER_UPDATE

class PrecisionSwitchReadOp : public OpKernel {
 public:
  explicit PrecisionSwitchReadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(0), "handle"));
    core::RefCountPtr<PrecisionSwitch> resource;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &resource));
    bool holding = false;
    const SwitchDecision decision = resource->Read(&holding);
    Tensor* use_low = nullptr;
    Tensor* holding_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &use_low));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &holding_out));
    use_low->scalar<bool>()() = decision.use_low_precision;
    holding_out->scalar<bool>()() = holding;
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchRead").Device(DEVICE_CPU), PrecisionSwitchReadOp);

class PrecisionSwitchExportOp : public OpKernel {
 public:
  explicit PrecisionSwitchExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(0), "handle"));
    core::RefCountPtr<PrecisionSwitch> resource;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &resource));
    Tensor* stats = nullptr;
    Tensor* counters = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &stats));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({kNumCounters}), &counters));
    resource->Export(stats, counters);
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchExport").Device(DEVICE_CPU),
                        PrecisionSwitchExportOp);

class PrecisionSwitchImportOp : public OpKernel {
 public:
  explicit PrecisionSwitchImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& stats = ctx->input(1);
    const Tensor& counters = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(0), "handle"));
    OP_REQUIRES(ctx, stats.shape() == TensorShape({2}),
                errors::InvalidArgument("stats must have shape [2] (mean, variance), got ",
                                        stats.shape().DebugString()));
    OP_REQUIRES(ctx, counters.shape() == TensorShape({kNumCounters}),
                errors::InvalidArgument("counters must have shape [", kNumCounters, "], got ",
                                        counters.shape().DebugString()));
    auto s = stats.vec<double>();
    auto c = counters.vec<int64_t>();
    OP_REQUIRES(ctx, c(kVersion) == kFormatVersion,
                errors::InvalidArgument("counters[0] (format version) must be ", kFormatVersion,
                                        ", got ", c(kVersion)));
    OP_REQUIRES(ctx, std::isfinite(s(0)) && std::isfinite(s(1)) && s(1) >= 0.0,
                errors::InvalidArgument("stats must be a finite mean and a finite variance >= 0, "
                                        "got [", s(0), ", ", s(1), "]"));
    OP_REQUIRES(ctx,
                c(kObserved) >= 0 && (c(kUseLow) == 0 || c(kUseLow) == 1) && (c(kHolding) == 0 || c(kHolding) == 1) &&
                    c(kCalmRun) >= 0 &&
                    c(kSpikes) >= 0 && c(kNonFinite) >= 0,
                errors::InvalidArgument("counters hold a negative count or a use_low_precision/"
                                        "holding flag other than 0/1: ",
                                        counters.DebugString()));
    core::RefCountPtr<PrecisionSwitch> resource;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &resource));
    resource->Import(stats, counters);
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchImport").Device(DEVICE_CPU),
                        PrecisionSwitchImportOp);

}  // namespace ttf
}  // namespace tensorflow
