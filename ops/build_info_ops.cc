// TtfBuildInfo: the TensorFlow version this library was compiled against, so the Python
// loader (ttf/_ops.py) can refuse a library built for another TensorFlow with a clear message.
// setup.py passes the version (tf.__version__ of the TensorFlow whose headers it compiles
// against) as TTF_TF_VERSION: TF 2.21's headers no longer define TF_VERSION_STRING's parts.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"

#ifndef TTF_TF_VERSION
#error "TTF_TF_VERSION is not defined: build the ops with setup.py (it passes -DTTF_TF_VERSION)"
#endif

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
    out->scalar<tstring>()() = TTF_TF_VERSION;
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace ttf
}  // namespace tensorflow
