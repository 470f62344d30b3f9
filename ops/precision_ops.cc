// Registrations of the loss-driven precision switch: a resource that watches the training
// loss and decides whether the next step may run in low precision (bf16).
// Kernels: ops/kernels/precision_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("TtfPrecisionSwitch")
    .Output("switch: resource")
    .Attr("warmup_steps: int >= 0 = 100")
    .Attr("ema_decay: float = 0.98")
    .Attr("spike_k: float = 3.0")
    .Attr("hold_steps: int >= 0 = 200")
    .Attr("calm_steps: int >= 0 = 50")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (once per shared_name) a precision switch. It keeps an exponential moving mean and
deviation of the loss (decay ema_decay). Low precision is allowed once warmup_steps losses
were seen and the last calm_steps losses in a row were calm; a spike (loss above
mean + spike_k * deviation) or a NaN/Inf loss forces fp32 for the next hold_steps steps.
)doc");

REGISTER_OP("TtfPrecisionSwitchUpdate")
    .Input("switch: resource")
    .Input("loss: float")
    .Output("use_low_precision: bool")
    .Output("skip_update: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Feeds one step's loss; returns whether the next step may run in low precision, and whether
this step's update must be skipped (the loss was NaN or Inf; it does not enter the moving
statistics).
)doc");

REGISTER_OP("TtfPrecisionSwitchExport")
    .Input("switch: resource")
    .Output("counters: int64")
    .Output("stats: float64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(4));
      c->set_output(1, c->Vector(2));
      return OkStatus();
    })
    .Doc("The switch state: counters [steps, hold_remaining, calm_count, low], stats [mean, variance].");

REGISTER_OP("TtfPrecisionSwitchImport")
    .Input("switch: resource")
    .Input("counters: int64")
    .Input("stats: float64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      return OkStatus();
    })
    .Doc("Restores a state exported by TtfPrecisionSwitchExport.");

}  // namespace ttf
}  // namespace tensorflow
