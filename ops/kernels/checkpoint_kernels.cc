// Kernels of TtfTableSummary, TtfTableSave and TtfTableCommitSave (ops/checkpoint_ops.cc).
#include <cstring>
#include <limits>

#include "embedding_table.h"
#include "table_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

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
    std::vector<float> scratch;
    for (int s = 0; s < table->num_shards(); ++s) {
      TableShard& sh = table->shard(s);
      std::shared_lock<std::shared_mutex> lock(sh.mu);
      const RowStore& rows = sh.rows.store;
      const RowLayout& layout = table->layout();  // compressed rows are summed in the full layout
      const int64_t stride = layout.full_floats();
      sh.rows.index.ForEach([&](int64_t key, uint32_t id) {
        const float* row = FullRow(layout, rows.row(id), &scratch);
        checksum += HashEntry(kRowSalt, key, row, stride, rows.meta(id));
        for (int64_t i = 0; i < stride; ++i) value_sum += row[i];
        ++size;
      });
      // A tiered shard's disk rows count the same (read sequentially, same lock).
      OP_REQUIRES_OK(ctx, sh.tier.disk.ForEachLive([&](int64_t key, const RowMeta& meta, const float* stored) {
        const float* row = FullRow(layout, stored, &scratch);
        checksum += HashEntry(kRowSalt, key, row, stride, meta);
        for (int64_t i = 0; i < stride; ++i) value_sum += row[i];
        ++size;
      }));
      const RowStore& candidates = sh.admission.candidates.store;
      sh.admission.candidates.index.ForEach([&](int64_t key, uint32_t id) {
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

class TableSaveOp : public TableOpKernel {
 public:
  explicit TableSaveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("delta", &delta_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("piece_bytes", &piece_bytes_));
    OP_REQUIRES_OK(ctx, GetRecordAttr(ctx, &record_));
    OP_REQUIRES(ctx, piece_bytes_ > 0, errors::InvalidArgument("piece_bytes must be > 0, got ", piece_bytes_));
  }

 protected:
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    static const char* kNames[] = {"prefix", "tensor_base", "since_step"};
    for (int i = 1; i <= 3; ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  errors::InvalidArgument(kNames[i - 1], " must be a scalar, got shape ",
                                          ctx->input(i).shape().DebugString()));
    }
    const std::string prefix = ctx->input(1).scalar<tstring>()();
    const std::string base = ctx->input(2).scalar<tstring>()();
    OP_REQUIRES(ctx, !prefix.empty(), errors::InvalidArgument("prefix must not be empty"));
    const int64_t since = ctx->input(3).scalar<int64_t>()();
    OP_REQUIRES(ctx, !delta_ || since >= -1,
                errors::InvalidArgument("since_step must be >= -1 for a delta, got ", since));
    const int64_t since_step = delta_ ? since : std::numeric_limits<int64_t>::min();

    // One piece's tensors, allocated once (room for at most piece_bytes of rows and as many of
    // candidates, or for the whole table when smaller) and refilled after each write.
    const int64_t rows_hint = table->Size(), candidates_hint = table->CandidateCount();
    Tensor fields[5];
    ExportLayout layout;
    std::vector<std::string> written;
    auto allocate = [&](const ExportLayout& l, SavePiece* piece) -> Status {
      layout = l;
      // A few more than now: rows the table gains during the save need no extra piece.
      auto room = [](int64_t hint, int64_t most) { return std::max<int64_t>(1, std::min(most, hint + hint / 16 + 64)); };
      piece->max_rows = room(rows_hint, piece_bytes_ / (24 + 4 * l.stride));
      piece->max_candidates = room(candidates_hint, piece_bytes_ / 24);
      fields[0] = Tensor(DT_INT64, TensorShape({piece->max_rows}));
      fields[1] = Tensor(DT_FLOAT, TensorShape({piece->max_rows, l.stride}));
      fields[2] = Tensor(DT_INT64, TensorShape({piece->max_rows, 2}));
      fields[3] = Tensor(DT_INT64, TensorShape({piece->max_candidates}));
      fields[4] = Tensor(DT_INT64, TensorShape({piece->max_candidates, 2}));
      piece->keys = fields[0].flat<int64_t>().data();
      piece->values = fields[1].flat<float>().data();
      piece->meta = fields[2].flat<int64_t>().data();
      piece->candidate_keys = fields[3].flat<int64_t>().data();
      piece->candidate_meta = fields[4].flat<int64_t>().data();
      piece->write = [&](const SavePiece& p) -> Status {
        static const char* kFields[] = {"keys", "values", "meta", "candidate_keys", "candidate_meta"};
        const int64_t k = static_cast<int64_t>(written.size());
        const std::string piece_prefix = strings::StrCat(prefix, "-p", k);
        BundleWriter writer(ctx->env(), piece_prefix);
        for (int f = 0; f < 5; ++f) {
          const Tensor filled = fields[f].Slice(0, f < 3 ? p.rows : p.candidates);
          TF_RETURN_IF_ERROR(writer.Add(strings::StrCat(base, "/part-", k, "/", kFields[f]), filled));
        }
        TF_RETURN_IF_ERROR(writer.Finish());
        written.push_back(piece_prefix);
        return OkStatus();
      };
      return OkStatus();
    };
    std::vector<int64_t> deleted;
    OP_REQUIRES_OK(ctx, table->Save(since_step, allocate, &deleted, record_));
    if (!delta_) deleted.clear();  // a full save's base needs none (the keys stay recorded until a commit)
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(written.size())}), &out));
    for (size_t k = 0; k < written.size(); ++k) out->flat<tstring>()(k) = written[k];
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<tstring>()() = layout.optimizer;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({static_cast<int64_t>(layout.slot_init.size())}), &out));
    std::copy(layout.slot_init.begin(), layout.slot_init.end(), out->flat<float>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &out));
    out->scalar<int64_t>()() = layout.step;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &out));
    out->scalar<int32_t>()() = static_cast<int32_t>(layout.stride);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({static_cast<int64_t>(deleted.size())}), &out));
    std::copy(deleted.begin(), deleted.end(), out->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({}), &out));
    out->scalar<tstring>()() = layout.row_layout;
  }

 private:
  bool delta_;
  int64_t piece_bytes_;
  int record_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableSave").Device(DEVICE_CPU), TableSaveOp);

class TableCommitSaveOp : public TableOpKernel {
 public:
  explicit TableCommitSaveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetRecordAttr(ctx, &record_));
  }

 protected:
  void ComputeWithTable(OpKernelContext*, EmbeddingTable* table) override { table->CommitSave(record_); }

 private:
  int record_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableCommitSave").Device(DEVICE_CPU), TableCommitSaveOp);

class BundleStringOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    for (int i = 0; i < 2; ++i)
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  errors::InvalidArgument(i == 0 ? "prefix" : "tensor_name", " must be a scalar, got shape ",
                                          ctx->input(i).shape().DebugString()));
    BundleReader reader(ctx->env(), ctx->input(0).scalar<tstring>()());
    OP_REQUIRES_OK(ctx, reader.status());
    const std::string name = ctx->input(1).scalar<tstring>()();
    Tensor value(DT_STRING, TensorShape({}));
    if (reader.Contains(name)) OP_REQUIRES_OK(ctx, reader.Lookup(name, &value));
    OP_REQUIRES(ctx, value.dtype() == DT_STRING && value.dims() == 0,
                errors::InvalidArgument(name, " in the checkpoint ", ctx->input(0).scalar<tstring>()(),
                                        " is not a scalar string: the checkpoint is damaged"));
    ctx->set_output(0, value);
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfBundleString").Device(DEVICE_CPU), BundleStringOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
