// Registration of the schema-driven line parser. Kernel: ops/kernels/parse_lines_kernels.cc.
// The schema itself (names, kinds, checks) is ttf/data/_schema.py; this op receives it
// flattened into per-column attrs.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "parsed_rows_shape.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

static const InitOnStartupMarker kRegistered = ParsedRowsOp(register_op::OpDefBuilderWrapper("TtfParseLines")
    .Input("lines: string")
    .Input("filenames: string")
    .Input("line_numbers: int64")
    .Attr("separators: string")
    .Attr("delimiter: string")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle lines, filenames, line_numbers;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &lines));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(1), 1, &filenames));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &line_numbers));
      TF_RETURN_IF_ERROR(c->Merge(lines, line_numbers, &lines));
      return ParsedRowsShape(c);
    })
    .Doc(R"doc(
Parses lines of a CTR log by a schema (ttf.data.Schema), one attr entry per column:
kinds 0 skip, 1 label, 2 dense, 3 categorical, 4 multi-hot, 5 hour (YYMMDDHH); slots:
the dense index, the field number (an hour stamp fills fields slot and slot + 1: hour of
day and day of week), or the multi-hot index (its field is num_fields + index);
value_modes (categorical, multi-hot) 0 auto, 1 int, 2 string; log1p and defaults (dense);
separators: one character per column (a multi-hot column's list separator); names (for
messages). delimiter: "" splits a line with a tab on tabs, else on commas; or one
character. filenames is one name for all lines (a scalar) or one per line; line_numbers
[N] are the 1-based numbers of the lines in their files (both only name a bad line).
A number is [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? with a finite value, or empty (missing).
labels [N] are 0 or 1; dense [N, num_dense] = log(1 + max(x, 0)) or x, missing as the
column's default; ids [N, num_fields] are keys (field << 56) | v: v the value for up to 8
hex digits (auto), the decimal integer (int), a 64-bit FNV-1a hash folded into
[2^32, 2^56 - 1) (other strings), 2^56 - 1 when missing. Multi-hot column m gives
multi_hot_values[m] (the keys of every kept row, concatenated) and multi_hot_lengths[m]
[N] (keys per row). A bad line (wrong column count, bad label, non-numeric dense value,
non-integer int value, bad hour stamp) fails the op naming filenames[i] and
line_numbers[i] when strict; otherwise it is skipped and counted in bad_lines.
)doc"), "bad_lines");

}  // namespace ttf
}  // namespace tensorflow
