// The loss-driven precision switch: a resource fed the training loss every step that
// decides whether the next step runs in low precision (bfloat16) or full precision
// (float32), and whether this step's update must be skipped (non-finite loss).
// Kernels: ops/kernels/precision_kernels.cc. Python wrapper: ttf/precision/_switch.py.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {

// Fails graph construction with a message naming the input when it is known not to be a
// scalar (the default WithRank message does not say which input was wrong).
Status ScalarInput(InferenceContext* c, int index, const char* name) {
  ShapeHandle shape = c->input(index);
  if (c->RankKnown(shape) && c->Rank(shape) != 0) {
    return errors::InvalidArgument(name, " must be a scalar, got shape ", c->DebugString(shape));
  }
  return OkStatus();
}

}  // namespace

REGISTER_OP("TtfPrecisionSwitch")
    .Output("handle: resource")
    .Attr("warmup_steps: int >= 0 = 100")
    .Attr("decay: float = 0.98")
    .Attr("spike_k: float = 4.0")
    .Attr("calm_k: float = 2.0")
    .Attr("calm_steps: int >= 1 = 10")
    .Attr("hold_steps: int >= 0 = 100")
    .Attr("min_relative_deviation: float = 0.01")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (or finds, by container/shared_name) a precision switch and returns its handle.

The switch keeps an exponential moving mean and variance of the loss
(mean += (1-decay)*d, var = decay*(var + (1-decay)*d*d), d = loss - mean; Finch 2009).
deviation = max(sqrt(var), min_relative_deviation * |mean|).
The first max(warmup_steps, 1) finite losses only feed the statistics (float32).
After that a loss above mean + spike_k * deviation is a spike; a loss at or below
mean + calm_k * deviation is calm. Spikes and non-finite losses force float32 for the
next hold_steps steps and reset the calm run; low precision is chosen again only once
the hold is over and calm_steps consecutive calm losses were seen. Between the two
thresholds the mode does not change (hysteresis).

warmup_steps: finite losses that only feed the statistics.
decay: weight of the old statistics in each update, in (0, 1).
spike_k: deviations above the mean that make a spike, > 0.
calm_k: deviations above the mean still counted as calm, in [0, spike_k].
calm_steps: consecutive calm losses needed to enter low precision, >= 1.
hold_steps: float32 steps after a spike or a non-finite loss, >= 0.
min_relative_deviation: floor of the deviation relative to |mean|, >= 0, so a
  perfectly flat loss does not turn every rounding change into a spike.
)doc");

REGISTER_OP("TtfPrecisionSwitchUpdate")
    .Input("handle: resource")
    .Input("loss: T")
    .Input("step: int64")
    .Output("use_low_precision: bool")
    .Output("skip_update: bool")
    .Attr("T: {bfloat16, half, float, double}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0, "handle"));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1, "loss"));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2, "step"));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Feeds the loss of training step `step` to the switch.

use_low_precision: whether step `step` + 1 should run in low precision.
skip_update: true when `loss` is NaN or Inf: that step's update must not be applied.
)doc");

REGISTER_OP("TtfPrecisionSwitchRead")
    .Input("handle: resource")
    .Output("use_low_precision: bool")
    .Output("holding: bool")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0, "handle"));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The switch's current state, without feeding a loss.

use_low_precision: the decision the last update returned.
holding: float32 because of a spike or a non-finite loss (not because of warm-up),
  until low precision is chosen again.
)doc");

REGISTER_OP("TtfPrecisionSwitchExport")
    .Input("handle: resource")
    .Output("stats: double")
    .Output("counters: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0, "handle"));
      c->set_output(0, c->Vector(2));
      c->set_output(1, c->Vector(9));
      return OkStatus();
    })
    .Doc(R"doc(
The switch's state, for checkpoints and logging.

stats: [mean, variance] of the loss.
counters: [format_version (1), observed (finite losses), use_low_precision (0/1),
  hold_until_step, calm_run, last_step, spikes, non_finite, holding (0/1)].
)doc");

REGISTER_OP("TtfPrecisionSwitchImport")
    .Input("handle: resource")
    .Input("stats: double")
    .Input("counters: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0, "handle"));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      return OkStatus();
    })
    .Doc("Replaces the switch's state by one TtfPrecisionSwitchExport produced.");

}  // namespace ttf
}  // namespace tensorflow
