// Kernels of the precision switch (ops/precision_ops.cc).
#include <cmath>
#include <mutex>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace ttf {
namespace {

struct SwitchConfig {
  int64_t warmup_steps, hold_steps, calm_steps;
  float ema_decay, spike_k;
};

class PrecisionSwitch : public ResourceBase {
 public:
  explicit PrecisionSwitch(const SwitchConfig& config) : config_(config) {}
  std::string DebugString() const override { return "ttf.PrecisionSwitch"; }

  // Returns {use_low_precision, skip_update} for one step's loss.
  std::pair<bool, bool> Update(float loss) {
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    if (!std::isfinite(loss)) {  // skip the update, keep the statistics clean, go fp32
      hold_remaining_ = config_.hold_steps;
      calm_count_ = 0;
      low_ = false;
      return {false, true};
    }
    if (seen_ == 0) {
      mean_ = loss;
      variance_ = 0.0;
    }
    // The moving variance starts at 0: divide by (1 - decay^n) so early estimates are not
    // biased low (which would make ordinary noise look like spikes).
    const double correction = seen_ > 0 ? 1.0 - std::pow(static_cast<double>(config_.ema_decay), seen_) : 1.0;
    const double deviation = std::sqrt(variance_ / correction);
    const bool spike = seen_ >= config_.warmup_steps && loss > mean_ + config_.spike_k * deviation && deviation > 0;
    if (spike) {
      hold_remaining_ = config_.hold_steps;
      calm_count_ = 0;
    } else {
      ++calm_count_;
      if (hold_remaining_ > 0) --hold_remaining_;
    }
    // A spike enters the statistics clipped to the threshold, so one outlier does not
    // blind the detector to the next.
    const double x = spike ? mean_ + config_.spike_k * deviation : loss;
    const double d = config_.ema_decay, delta = x - mean_;
    mean_ += (1.0 - d) * delta;
    variance_ = d * (variance_ + (1.0 - d) * delta * delta);
    ++seen_;
    low_ = seen_ > config_.warmup_steps && hold_remaining_ == 0 && calm_count_ >= config_.calm_steps;
    return {low_, false};
  }

  void Export(int64_t* counters, double* stats) {
    std::lock_guard<std::mutex> lock(mu_);
    counters[0] = steps_;
    counters[1] = hold_remaining_;
    counters[2] = calm_count_;
    counters[3] = (low_ ? 1 : 0) | (seen_ << 1);
    stats[0] = mean_;
    stats[1] = variance_;
  }
  void Import(const int64_t* counters, const double* stats) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_ = counters[0];
    hold_remaining_ = counters[1];
    calm_count_ = counters[2];
    low_ = counters[3] & 1;
    seen_ = counters[3] >> 1;
    mean_ = stats[0];
    variance_ = stats[1];
  }

 private:
  const SwitchConfig config_;
  std::mutex mu_;
  int64_t steps_ = 0, seen_ = 0, hold_remaining_ = 0, calm_count_ = 0;
  bool low_ = false;
  double mean_ = 0.0, variance_ = 0.0;
};

class PrecisionSwitchOp : public OpKernel {
 public:
  explicit PrecisionSwitchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("warmup_steps", &config_.warmup_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hold_steps", &config_.hold_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("calm_steps", &config_.calm_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ema_decay", &config_.ema_decay));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spike_k", &config_.spike_k));
    OP_REQUIRES(ctx, config_.ema_decay > 0.0f && config_.ema_decay < 1.0f,
                errors::InvalidArgument("ema_decay must be in (0, 1), got ", config_.ema_decay));
    OP_REQUIRES(ctx, config_.spike_k > 0.0f, errors::InvalidArgument("spike_k must be > 0, got ", config_.spike_k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES(ctx, !shared_name_.empty(), errors::InvalidArgument("shared_name must name the switch"));
  }
  void Compute(OpKernelContext* ctx) override {
    const std::string container = container_.empty() ? ctx->resource_manager()->default_container() : container_;
    ResourceHandle handle = MakeResourceHandle<PrecisionSwitch>(ctx, container, shared_name_);
    PrecisionSwitch* sw = nullptr;
    OP_REQUIRES_OK(ctx, LookupOrCreateResource<PrecisionSwitch>(ctx, handle, &sw, [this](PrecisionSwitch** s) {
      *s = new PrecisionSwitch(config_);
      return OkStatus();
    }));
    sw->Unref();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = handle;
  }

 private:
  SwitchConfig config_;
  std::string container_, shared_name_;
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitch").Device(DEVICE_CPU), PrecisionSwitchOp);

class PrecisionSwitchUpdateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    PrecisionSwitch* sw = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &sw));
    core::ScopedUnref unref(sw);
    const Tensor& loss = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(loss.shape()),
                errors::InvalidArgument("loss must be a scalar, got shape ", loss.shape().DebugString()));
    const auto decision = sw->Update(loss.scalar<float>()());
    Tensor *low, *skip;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &low));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &skip));
    low->scalar<bool>()() = decision.first;
    skip->scalar<bool>()() = decision.second;
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchUpdate").Device(DEVICE_CPU), PrecisionSwitchUpdateOp);

class PrecisionSwitchExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    PrecisionSwitch* sw = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &sw));
    core::ScopedUnref unref(sw);
    Tensor *counters, *stats;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({4}), &counters));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({2}), &stats));
    sw->Export(counters->flat<int64_t>().data(), stats->flat<double>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchExport").Device(DEVICE_CPU), PrecisionSwitchExportOp);

class PrecisionSwitchImportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    PrecisionSwitch* sw = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &sw));
    core::ScopedUnref unref(sw);
    const Tensor& counters = ctx->input(1);
    const Tensor& stats = ctx->input(2);
    OP_REQUIRES(ctx, counters.NumElements() == 4 && stats.NumElements() == 2,
                errors::InvalidArgument("counters must have 4 elements and stats 2, got shapes ",
                                        counters.shape().DebugString(), " and ", stats.shape().DebugString()));
    sw->Import(counters.flat<int64_t>().data(), stats.flat<double>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfPrecisionSwitchImport").Device(DEVICE_CPU), PrecisionSwitchImportOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
