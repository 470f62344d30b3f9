// TtfTableSummary: a table shard's size and checksums, computed where its rows live, so a
// job's table summary moves three numbers per shard instead of the rows. TtfTableSave and
// TtfTableCommitSave: the streamed checkpoint writer and its commit.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

REGISTER_OP("TtfTableSummary")
    .Input("table: resource")
    .Output("size: int64")
    .Output("checksum: int64")
    .Output("value_sum: float64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The table's size (keys holding a row), an order-independent checksum and the float64 sum
of every stored float (values and optimizer slots). checksum is the wrapping int64 sum,
over rows and admission candidates, of a SplitMix64 hash of (key, every float's bits,
count, last-seen step): equal for two tables holding the same rows bit for bit, whatever
their sharding, since the sums of shards add up (mod 2^64). value_sum is for approximate
comparisons (its rounding depends on the order of the sum). Each lock shard is read under
its shared lock, one at a time: lookups go on meanwhile.
)doc");

REGISTER_OP("TtfTableSave")
    .Input("table: resource")
    .Input("prefix: string")
    .Input("tensor_base: string")
    .Input("since_step: int64")
    .Output("piece_prefixes: string")
    .Output("optimizer: string")
    .Output("slot_init: float")
    .Output("step: int64")
    .Output("stride: int32")
    .Output("deleted_keys: int64")
    .Output("row_layout: string")
    .Attr("delta: bool = false")
    .Attr("piece_bytes: int = 67108864")
    .Attr("record: int = 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      for (int i = 1; i <= 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      const auto n = shape_inference::InferenceContext::kUnknownDim;
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Scalar());
      c->set_output(4, c->Scalar());
      c->set_output(5, c->Vector(n));
      c->set_output(6, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Writes the table into tensor bundles `prefix`-p<k>, one per piece of at most piece_bytes of
rows (and of candidates), each holding `tensor_base`/part-<k>/{keys, values, meta,
candidate_keys, candidate_meta}: the sharded checkpoint format of ttf/checkpoint/_format.py.
It copies one lock shard at a time, under that shard's lock held shared: each shard is a
consistent snapshot, lookups go on, and an update waits for one shard's copy only (a piece is
written with no lock held, except when one shard holds more than a piece). Its extra memory is
one piece, not the table: a tiered table's disk rows are read sequentially from its files.
With each shard's copy, the shard's new removed keys of change-log reader `record` (see
TtfTableExport) are taken, and kept until a TtfTableCommitSave (so a save that fails loses
none). Returns the pieces' prefixes
(at least one), the layout (optimizer, slot_init, step = the table step before the first
shard was copied, stride = the row width with slots) and, with delta, the keys deleted since
the last committed save, and row_layout: '' for fp32 rows, whose values are the full layout
(dim * (1 + slots) floats), else the layout tag of compressed rows, whose values are their
stored words as they are (stride words, float32 bits; restored by TtfTableImportStored).
With delta, only rows and candidates last seen after since_step (>= -1) are written; without
it since_step is ignored.
)doc");

REGISTER_OP("TtfBundleString")
    .Input("prefix: string")
    .Input("tensor_name: string")
    .Output("value: string")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      for (int i = 0; i < 2; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The scalar string tensor `tensor_name` of the tensor bundle `prefix`, or '' when the bundle holds no
such tensor (a checkpoint's optional entries, such as a table source's row layout tag).
)doc");

REGISTER_OP("TtfTableCommitSave")
    .Input("table: resource")
    .Attr("record: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
A save of the table (TtfTableSave) is durable: forgets the removed keys saves took for
change-log reader `record` with the shards' rows. Keys removed after a shard's copy stay
recorded for the next delta.
)doc");

}  // namespace ttf
}  // namespace tensorflow
