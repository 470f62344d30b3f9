// TtfTableSummary: a table shard's size and checksums, computed where its rows live, so a
// job's table summary moves three numbers per shard instead of the rows.
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

}  // namespace ttf
}  // namespace tensorflow
