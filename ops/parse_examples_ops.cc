// Registration of the tf.train.Example parser: serialized Examples -> the parser's outputs.
// Kernel: ops/kernels/parse_examples_kernels.cc. The same value rules as TtfParseLines
// (ops/kernels/parse_values.h), so a value gives the same key in every format.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "parsed_rows_shape.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

static const InitOnStartupMarker kParseExamples = ParsedRowsOp(register_op::OpDefBuilderWrapper("TtfParseExamples")
    .Input("records: string")
    .Input("location: string")
    .Input("record_numbers: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle records, location, numbers;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &records));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &location));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &numbers));
      TF_RETURN_IF_ERROR(c->Merge(records, numbers, &records));
      return ParsedRowsShape(c);
    })
    .Doc(R"doc(
Parses serialized tf.train.Example records [N] by a schema into TtfParseLines' outputs, reading
the protobuf wire format itself (no string tensors, no protobuf objects): a feature of the
Features map is matched by name to the schema column names[c] (kinds, slots, value_modes,
log1p, defaults as TtfParseLines, one entry per column read; kind 0 skip is not given);
unknown features and fields are skipped. A label or dense column takes an int64_list or
float_list, a categorical, multi-hot or hour column an int64_list (an integer is the value of
its decimal text) or bytes_list (packed or not). An absent feature or an empty list is
missing (a dense column's default, the missing key, an empty multi-hot list); a feature that
appears twice takes its last value, as protobuf's map does. A bad record (a missing or
non-0/1 label, several values in a one-value column, a list of a type the column cannot take,
a non-finite dense value, a bad int or hour value, bytes that are not a tf.train.Example)
fails naming `location, record record_numbers[i]` and the feature when strict; otherwise it
is skipped and counted in bad_records.
)doc"), "bad_records");

static const InitOnStartupMarker kParseExampleSpans = ParsedRowsOp(
    register_op::OpDefBuilderWrapper("TtfParseExampleSpans")
        .Input("data: string")
        .Input("starts: int64")
        .Input("ends: int64")
        .Input("location: string")
        .Input("record_numbers: int64")
        .SetShapeFn([](InferenceContext* c) {
          ShapeHandle data, starts, ends, location, numbers;
          TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &data));
          TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &starts));
          TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &ends));
          TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &location));
          TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &numbers));
          TF_RETURN_IF_ERROR(c->Merge(starts, ends, &starts));
          TF_RETURN_IF_ERROR(c->Merge(starts, numbers, &starts));
          return ParsedRowsShape(c);
        })
        .Doc(R"doc(
TtfParseExamples on records that lie in one string: record i is data[starts[i]:ends[i]] (a block
of TtfReadRecords, parsed where it was read). A span outside data fails the op.
)doc"),
    "bad_records");

}  // namespace ttf
}  // namespace tensorflow
