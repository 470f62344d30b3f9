// Registration of the Criteo line parser. Kernel: ops/kernels/criteo_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("TtfParseCriteo")
    .Input("lines: string")
    .Input("filenames: string")
    .Input("line_numbers: int64")
    .Output("labels: float")
    .Output("dense: float")
    .Output("ids: int64")
    .Output("bad_lines: int64")
    .Attr("strict: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle lines, filenames, line_numbers;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &lines));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(1), 1, &filenames));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &line_numbers));
      TF_RETURN_IF_ERROR(c->Merge(lines, line_numbers, &lines));
      const auto rows = InferenceContext::kUnknownDim;  // bad lines may be skipped
      c->set_output(0, c->Vector(rows));
      c->set_output(1, c->Matrix(rows, 13));
      c->set_output(2, c->Matrix(rows, 26));
      c->set_output(3, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Parses Criteo lines: label, 13 integer columns, 26 categorical columns, separated by tabs
(the raw Kaggle form) or commas (the CSV form, header removed); empty fields are missing.
filenames is one name for all lines (a scalar) or one per line; line_numbers [N] are the
1-based numbers of the lines in their files (both only name a bad line in the error).
A number field is [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? with a finite value, or empty.
labels [N] are 0 or 1; dense [N, 13] = log(1 + max(x, 0)), missing as 0; ids [N, 26] are
keys tagged with their field: (field << 56) | v, v = the value itself for up to 8 hex
digits, a 64-bit FNV-1a hash folded into [2^32, 2^56 - 1) for other strings, and
2^56 - 1 for a missing value. A bad line (wrong field count, bad label, non-numeric integer
column) fails the op naming filenames[i] and line_numbers[i] when strict; otherwise it is
skipped and counted in bad_lines.
)doc");

}  // namespace ttf
}  // namespace tensorflow
