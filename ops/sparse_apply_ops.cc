// Registrations of the fused sparse optimizer updates on a ttf table: one call per step
// sums the gradients of duplicate keys, probes each unique key once and updates its row and
// optimizer slots in place. The apply is where the table changes: a key without a row gets
// one (its initializer row, then the update), each key's count and last-seen step move, and
// under admission a key not yet admitted is counted as a candidate and its gradient dropped.
// weight_decay (every op): decoupled decay of the touched rows before the update,
// row -= row * weight_decay * learning_rate, as Keras' `weight_decay` (AdamW) does to a
// variable; lazily, as DeepRec and TorchRec's fused optimizers do: untouched rows keep theirs.
// Kernels: ops/kernels/sparse_apply_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {
// Inputs: table, keys [N], grads [N, D], then `num_scalars` float scalars, then step.
Status ApplyShape(InferenceContext* c, int num_scalars) {
  ShapeHandle keys, grads, unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &grads));
  shape_inference::DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(grads, 0), &n));
  for (int i = 0; i <= num_scalars; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(3 + i), 0, &unused));
  c->set_output(0, c->Scalar());
  return OkStatus();
}
}  // namespace

REGISTER_OP("TtfTableApplySgd")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("weight_decay: float = 0.0")
    .SetShapeFn([](InferenceContext* c) { return ApplyShape(c, 1); })
    .Doc("row -= learning_rate * grad for each touched key. Returns the number of rows updated.");

REGISTER_OP("TtfTableApplyAdagrad")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("initial_accumulator_value: float = 0.1")
    .Attr("weight_decay: float = 0.0")
    .SetShapeFn([](InferenceContext* c) { return ApplyShape(c, 2); })
    .Doc(R"doc(
Adagrad as Keras: accum += g^2; row -= learning_rate * g / (sqrt(accum) + epsilon).
One slot (the accumulator), starting at initial_accumulator_value.
)doc");

REGISTER_OP("TtfTableApplyAdam")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("beta_1: float")
    .Input("beta_2: float")
    .Input("epsilon: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("weight_decay: float = 0.0")
    .SetShapeFn([](InferenceContext* c) { return ApplyShape(c, 4); })
    .Doc(R"doc(
Lazy Adam (Kingma & Ba) with Keras' epsilon placement: only touched rows and their slots
move. step is the 1-based global step t used for bias correction:
alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t); m += (g - m)(1 - beta_1);
v += (g^2 - v)(1 - beta_2); row -= alpha * m / (sqrt(v) + epsilon).
)doc");

REGISTER_OP("TtfTableApplyFtrl")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("learning_rate_power: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .Input("beta: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("initial_accumulator_value: float = 0.1")
    .Attr("weight_decay: float = 0.0")
    .SetShapeFn([](InferenceContext* c) { return ApplyShape(c, 6); })
    .Doc(R"doc(
FTRL-Proximal (McMahan et al., 2013) as Keras' Ftrl, with slots accumulator (starting at
initial_accumulator_value) and linear (starting at 0).
)doc");

}  // namespace ttf
}  // namespace tensorflow
