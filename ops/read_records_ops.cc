// Registration of the TFRecord framing reader: a block of records of a plain TFRecord file, read
// through TensorFlow's file systems, as one byte buffer and the records' spans in it.
// Kernel: ops/kernels/read_records_kernels.cc. The spans go to TtfParseExampleSpans.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("TtfReadRecords")
    .Input("path: string")
    .Input("offset: int64")
    .Input("first_record: int64")
    .Input("max_records: int64")
    .Output("data: string")
    .Output("starts: int64")
    .Output("ends: int64")
    .Output("record_numbers: int64")
    .Output("next_offset: int64")
    .Output("next_record: int64")
    .Output("bad_records: int64")
    .Output("finished: bool")
    .Attr("max_bytes: int = 67108864")
    .Attr("strict: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      for (int i = 0; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
      const auto n = c->UnknownDim();
      c->set_output(0, c->Scalar());
      for (int i = 1; i <= 3; ++i) c->set_output(i, c->Vector(n));
      for (int i = 4; i <= 7; ++i) c->set_output(i, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Reads the records of the TFRecord file `path` (not compressed) from byte `offset`, the start
of record number `first_record` (0-based), through TensorFlow's file systems (Env): up to
max_records records, and no more once their bytes pass max_bytes (at least one record). Each
record's length and data are checked against their masked CRC32C. data (a scalar) holds the
bytes read; record i is data[starts[i]:ends[i]], number record_numbers[i] in its file. next_offset and
next_record are where the next block starts; finished is true once nothing more of the file can
be read (its end reached; an offset of -1 reads nothing and is finished). A data CRC mismatch, a bad length CRC or a file that ends
inside a record fail naming `path, record N (byte B)` when strict; otherwise the record is
skipped and counted in bad_records (after a bad length or a truncated record nothing more of
the file can be framed: the file ends there).
)doc");

}  // namespace ttf
}  // namespace tensorflow
