// Kernel of TtfTableSummary (ops/checkpoint_ops.cc).
#include <cstring>

#include "embedding_table.h"
#include "table_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace ttf {
namespace {

// Distinct salts keep a row's hash apart from a candidate's with the same key and meta.
constexpr uint64_t kRowSalt = 0x5851f42d4c957f2dULL, kCandidateSalt = 0x14057b7ef767814fULL;

uint64_t HashEntry(uint64_t salt, int64_t key, const float* floats, int64_t n, const RowMeta& meta) {
  uint64_t h = Mix64(salt ^ static_cast<uint64_t>(key));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, floats + i, sizeof(bits));
    h = Mix64(h ^ bits);
  }
  h = Mix64(h ^ static_cast<uint64_t>(meta.count));
  return Mix64(h ^ static_cast<uint64_t>(meta.last_seen));
}

class TableSummaryOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;

 protected:
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    int64_t size = 0;
    uint64_t checksum = 0;  // wrapping sum: order-independent, shards add up
    double value_sum = 0.0;
    for (int s = 0; s < table->num_shards(); ++s) {
      TableShard& sh = table->shard(s);
      std::shared_lock<std::shared_mutex> lock(sh.mu);
      const RowStore& rows = sh.rows.store;
      const int64_t stride = rows.stride();
      sh.rows.index.ForEach([&](int64_t key, uint32_t id) {
        const float* row = rows.row(id);
        checksum += HashEntry(kRowSalt, key, row, stride, rows.meta(id));
        for (int64_t i = 0; i < stride; ++i) value_sum += row[i];
        ++size;
      });
      const RowStore& candidates = sh.candidates.store;
      sh.candidates.index.ForEach([&](int64_t key, uint32_t id) {
        checksum += HashEntry(kCandidateSalt, key, nullptr, 0, candidates.meta(id));
      });
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = size;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<int64_t>()() = static_cast<int64_t>(checksum);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<double>()() = value_sum;
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableSummary").Device(DEVICE_CPU), TableSummaryOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
