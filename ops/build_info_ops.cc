// TtfBuildInfo: the TensorFlow version this library was compiled against, so the Python
// loader (ttf/_ops.py) can refuse a library built for another TensorFlow with a clear message.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/public/version.h"

namespace tensorflow {
namespace ttf {

REGISTER_OP("TtfBuildInfo")
    .Output("tf_version: string")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("The TensorFlow version string (e.g. 2.16.2) the ttf op library was built against.");

class BuildInfoOp : public OpKernel {
 public:
  explicit BuildInfoOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = TF_VERSION_STRING;
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace ttf
}  // namespace tensorflow
