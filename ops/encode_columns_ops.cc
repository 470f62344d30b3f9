// Registration of the column encoder: Parquet and TFRecord columns -> the parser's outputs.
// Kernel: ops/kernels/encode_columns_kernels.cc. The same value rules as TtfParseLines
// (ops/kernels/parse_values.h), so a value gives the same key in every format.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "parsed_rows_shape.h"

namespace tensorflow {
namespace ttf {

static const InitOnStartupMarker kRegistered = ParsedRowsOp(register_op::OpDefBuilderWrapper("TtfEncodeColumns")
    .Input("location: string")
    .Input("row_numbers: int64")
    .Input("error: string")
    .Input("valid: N * uint8")
    .Input("splits: N * int64")
    .Input("ints: N * int64")
    .Input("floats: N * double")
    .Input("offsets: N * int64")
    .Input("bytes: N * uint8")
    .Input("strings: N * string")
    .Attr("N: int >= 1")
    .Attr("sources: list(int)")
    .Attr("row_word: string = 'row'")
    .SetShapeFn(ParsedRowsShape)
    .Doc(R"doc(
Encodes the rows numbered row_numbers [num_rows] (only named in errors), given column by column (one entry of every list input per schema
column that is not skipped) into TtfParseLines' outputs, by the same value rules
(parse_values.h): an integer is the value its decimal text is, a string the value its
bytes are. kinds as TtfParseLines (1 label, 2 dense, 3 categorical, 4 multi-hot, 5 hour);
sources: where column c's items are: 0 ints[c], 1 floats[c], 2 Arrow strings (item i is
bytes[c][offsets[c][i] : offsets[c][i + 1]]), 3 strings[c], 4 a dictionary (item i is entry
ints[c][i] of the Arrow strings offsets[c], bytes[c]; a categorical column's keys are
computed once per entry). splits[c]: empty (item r is
row r) or [num_rows + 1] (row r holds items splits[r] .. splits[r + 1]: TFRecord lists,
Parquet lists). valid[c]: empty (all valid) or one byte per item, 0 = null. A null or
absent value is missing (a dense column's default, the missing key, an empty multi-hot
list); a null label, a non-0/1 label, a non-finite dense value, a categorical column with
several values, an out-of-range int value or a bad hour stamp is a bad row: strict fails
naming `location, <row_word> row_numbers[r]`; otherwise it is skipped and counted.
A non-empty `error` (the reader could not decode these rows) fails when strict, or
counts all num_rows rows as bad.
)doc"), "bad_rows");

}  // namespace ttf
}  // namespace tensorflow
