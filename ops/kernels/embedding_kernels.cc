// Kernels of the table ops registered in ops/embedding_ops.cc.
#include <cstring>

#include "embedding_table.h"
#include "table_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace ttf {
namespace {

constexpr int64_t kMaxKeysPerCall = (int64_t{1} << 31) - 1;  // inverse_index is int32

class EmbeddingTableOp : public OpKernel {
 public:
  explicit EmbeddingTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string initializer;
    int64_t num_shards;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &config_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &initializer));
    OP_REQUIRES_OK(ctx, ParseInitKind(initializer, &config_.init.kind));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_a", &config_.init.a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_b", &config_.init.b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &config_.init.seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("default_value", &config_.default_value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_min_count", &config_.admission_min_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards));
    OP_REQUIRES(ctx, num_shards <= 4096, errors::InvalidArgument("num_shards must be at most 4096, got ", num_shards));
    config_.num_shards = static_cast<int>(num_shards);
    const InitKind kind = config_.init.kind;
    OP_REQUIRES(ctx, (kind != InitKind::kNormal && kind != InitKind::kTruncatedNormal) || config_.init.b > 0,
                errors::InvalidArgument("initializer '", initializer, "' needs a stddev (init_b) > 0, got ",
                                        config_.init.b));
    OP_REQUIRES(ctx, kind != InitKind::kUniform || config_.init.a < config_.init.b,
                errors::InvalidArgument("uniform initializer needs minval (init_a) < maxval (init_b), got ",
                                        config_.init.a, " and ", config_.init.b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES(ctx, !shared_name_.empty(), errors::InvalidArgument("shared_name must name the table"));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string container = container_.empty() ? ctx->resource_manager()->default_container() : container_;
    ResourceHandle handle = MakeResourceHandle<EmbeddingTable>(ctx, container, shared_name_);
    EmbeddingTable* table = nullptr;
    OP_REQUIRES_OK(ctx, LookupOrCreateResource<EmbeddingTable>(ctx, handle, &table, [this](EmbeddingTable** t) {
      *t = new EmbeddingTable(config_);
      return OkStatus();
    }));
    core::ScopedUnref unref(table);
    OP_REQUIRES(ctx, table->dim() == config_.dim && table->num_shards() == config_.num_shards,
                errors::InvalidArgument("a table named '", shared_name_, "' already exists with dim ", table->dim(),
                                        " and ", table->num_shards(), " shards; asked for dim ", config_.dim, " and ",
                                        config_.num_shards, " shards"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = handle;
  }

 private:
  TableConfig config_;
  std::string container_, shared_name_;
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingTable").Device(DEVICE_CPU), EmbeddingTableOp);

// Looks up the distinct keys of `keys`: fills `grouped` and `rows` (grouped.size() x dim).
Status LookupDistinct(OpKernelContext* ctx, EmbeddingTable* table, const Tensor& keys, bool training,
                      GroupedKeys* grouped, std::vector<float>* rows) {
  if (keys.NumElements() > kMaxKeysPerCall)
    return errors::InvalidArgument("at most ", kMaxKeysPerCall, " ids per call, got ", keys.NumElements());
  GroupKeys(keys.flat<int64_t>().data(), keys.NumElements(), *table, grouped);
  const int64_t dim = table->dim();
  rows->resize(grouped->size() * dim);
  ForEachShard(ctx, *grouped, table->num_shards(), 50 * dim, [&](int s) {
    const int64_t off = grouped->offsets[s], n = grouped->offsets[s + 1] - off;
    float* out = rows->data() + off * dim;
    if (training) {
      table->FindOrInsert(s, &grouped->keys[off], &grouped->hashes[off], n, out);
    } else {
      table->Find(s, &grouped->keys[off], &grouped->hashes[off], n, out);
    }
  });
  return OkStatus();
}

// out[p] = rows[inverse[p]] for every position p, in parallel.
void ScatterRows(OpKernelContext* ctx, const std::vector<float>& rows, const std::vector<int32_t>& inverse,
                 int64_t dim, float* out) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, inverse.size(), 4 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      std::memcpy(out + p * dim, rows.data() + static_cast<int64_t>(inverse[p]) * dim, dim * sizeof(float));
  });
}

void OutputUniqueAndInverse(OpKernelContext* ctx, const GroupedKeys& grouped, int first_output) {
  Tensor* unique_keys = nullptr;
  Tensor* inverse = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(first_output, TensorShape({grouped.size()}), &unique_keys));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(first_output + 1,
                                           TensorShape({static_cast<int64_t>(grouped.inverse.size())}), &inverse));
  std::copy(grouped.keys.begin(), grouped.keys.end(), unique_keys->flat<int64_t>().data());
  std::copy(grouped.inverse.begin(), grouped.inverse.end(), inverse->flat<int32_t>().data());
}

Status CheckDim(const EmbeddingTable& table, int64_t dim) {
  if (table.dim() != dim)
    return errors::InvalidArgument("dim attr is ", dim, " but the table's rows have dim ", table.dim());
  return OkStatus();
}

class EmbeddingLookupOp : public TableOpKernel {
 public:
  explicit EmbeddingLookupOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OP_REQUIRES_OK(ctx, CheckDim(*table, dim_));
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES(ctx, ids.dims() >= 1,
                errors::InvalidArgument("ids must have rank >= 1, got shape ", ids.shape().DebugString()));
    GroupedKeys grouped;
    std::vector<float> rows;
    OP_REQUIRES_OK(ctx, LookupDistinct(ctx, table, ids, training_, &grouped, &rows));
    TensorShape out_shape = ids.shape();
    out_shape.AddDim(dim_);
    Tensor* embeddings = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &embeddings));
    ScatterRows(ctx, rows, grouped.inverse, dim_, embeddings->flat<float>().data());
    OutputUniqueAndInverse(ctx, grouped, 1);
  }

 private:
  int64_t dim_;
  bool training_;
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingLookup").Device(DEVICE_CPU), EmbeddingLookupOp);

class EmbeddingLookupRaggedOp : public TableOpKernel {
 public:
  explicit EmbeddingLookupRaggedOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    mean_ = combiner == "mean";
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OP_REQUIRES_OK(ctx, CheckDim(*table, dim_));
    const Tensor& values = ctx->input(1);
    const Tensor& splits = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() == 1,
                errors::InvalidArgument("values must be rank 1, got shape ", values.shape().DebugString()));
    OP_REQUIRES(ctx, splits.dims() == 1 && splits.NumElements() >= 1,
                errors::InvalidArgument("row_splits must be a rank-1 tensor with at least one element, got shape ",
                                        splits.shape().DebugString()));
    const auto sp = splits.flat<int64_t>();
    const int64_t bags = sp.size() - 1;
    OP_REQUIRES(ctx, sp(0) == 0, errors::InvalidArgument("row_splits must start at 0, got ", sp(0)));
    for (int64_t b = 0; b < bags; ++b) {
      OP_REQUIRES(ctx, sp(b) <= sp(b + 1),
                  errors::InvalidArgument("row_splits must be non-decreasing; row_splits[", b, "]=", sp(b),
                                          " > row_splits[", b + 1, "]=", sp(b + 1)));
    }
    OP_REQUIRES(ctx, sp(bags) == values.NumElements(),
                errors::InvalidArgument("row_splits must end at the number of values (", values.NumElements(),
                                        "), got ", sp(bags)));
    GroupedKeys grouped;
    std::vector<float> rows;
    OP_REQUIRES_OK(ctx, LookupDistinct(ctx, table, values, training_, &grouped, &rows));
    Tensor* embeddings = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({bags, dim_}), &embeddings));
    float* out = embeddings->flat<float>().data();
    const int64_t dim = dim_;
    const bool mean = mean_;
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t avg = values.NumElements() / std::max<int64_t>(bags, 1) + 1;
    Shard(workers->num_threads, workers->workers, bags, 4 * dim * avg, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        float* dst = out + b * dim;
        std::fill(dst, dst + dim, 0.0f);
        for (int64_t p = sp(b); p < sp(b + 1); ++p) {
          const float* row = rows.data() + static_cast<int64_t>(grouped.inverse[p]) * dim;
          for (int64_t j = 0; j < dim; ++j) dst[j] += row[j];
        }
        const int64_t len = sp(b + 1) - sp(b);
        if (mean && len > 1) {
          const float scale = 1.0f / static_cast<float>(len);
          for (int64_t j = 0; j < dim; ++j) dst[j] *= scale;
        }
      }
    });
    OutputUniqueAndInverse(ctx, grouped, 1);
  }

 private:
  int64_t dim_;
  bool training_, mean_;
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingLookupRagged").Device(DEVICE_CPU), EmbeddingLookupRaggedOp);

class EmbeddingGradOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& grads = ctx->input(0);
    const Tensor& inverse = ctx->input(1);
    const Tensor& unique_keys = ctx->input(2);
    OP_REQUIRES(ctx, grads.dims() >= 2,
                errors::InvalidArgument("grads must have rank >= 2, got shape ", grads.shape().DebugString()));
    OP_REQUIRES(ctx, inverse.dims() == 1 && unique_keys.dims() == 1,
                errors::InvalidArgument("inverse_index and unique_keys must be rank 1, got shapes ",
                                        inverse.shape().DebugString(), " and ", unique_keys.shape().DebugString()));
    const int64_t dim = grads.dim_size(grads.dims() - 1);
    const int64_t n = inverse.NumElements(), u = unique_keys.NumElements();
    OP_REQUIRES(ctx, grads.NumElements() == n * dim,
                errors::InvalidArgument("grads ", grads.shape().DebugString(), " must hold one row of ", dim,
                                        " per inverse_index entry (", n, ")"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, dim}), &out));
    float* __restrict dst = out->flat<float>().data();
    const float* __restrict src = grads.flat<float>().data();
    const int32_t* inv = inverse.flat<int32_t>().data();
    std::fill(dst, dst + u * dim, 0.0f);
    // One pass in input order (so the sum order, and the result, are deterministic).
    for (int64_t p = 0; p < n; ++p) {
      OP_REQUIRES(ctx, inv[p] >= 0 && inv[p] < u,
                  errors::InvalidArgument("inverse_index[", p, "] = ", inv[p], " is outside [0, ", u, ")"));
      float* row = dst + static_cast<int64_t>(inv[p]) * dim;
      const float* g = src + p * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += g[j];
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingGrad").Device(DEVICE_CPU), EmbeddingGradOp);

// TtfTableFindOrInsert / TtfTableFind: keys [N] -> rows [N, dim].
template <bool kTraining>
class TableLookupOp : public TableOpKernel {
 public:
  explicit TableLookupOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) { OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_)); }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OP_REQUIRES_OK(ctx, CheckDim(*table, dim_));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be rank 1, got shape ", keys.shape().DebugString()));
    GroupedKeys grouped;
    std::vector<float> rows;
    OP_REQUIRES_OK(ctx, LookupDistinct(ctx, table, keys, kTraining, &grouped, &rows));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({keys.NumElements(), dim_}), &out));
    ScatterRows(ctx, rows, grouped.inverse, dim_, out->flat<float>().data());
  }

 private:
  int64_t dim_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableFindOrInsert").Device(DEVICE_CPU), TableLookupOp<true>);
REGISTER_KERNEL_BUILDER(Name("TtfTableFind").Device(DEVICE_CPU), TableLookupOp<false>);

void OutputScalar(OpKernelContext* ctx, int index, int64_t value) {
  Tensor* out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({}), &out));
  out->scalar<int64_t>()() = value;
}

class TableSizeOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OutputScalar(ctx, 0, table->Size());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableSize").Device(DEVICE_CPU), TableSizeOp);

class TableStatsOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OutputScalar(ctx, 0, table->CandidateCount());
    OutputScalar(ctx, 1, table->MemoryBytes());
    OutputScalar(ctx, 2, table->step());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableStats").Device(DEVICE_CPU), TableStatsOp);

class TableEvictOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    for (int i = 1; i <= 2; ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  errors::InvalidArgument(i == 1 ? "min_last_seen" : "min_count", " must be a scalar, got shape ",
                                          ctx->input(i).shape().DebugString()));
    }
    OutputScalar(ctx, 0, table->Evict(ctx->input(1).scalar<int64_t>()(), ctx->input(2).scalar<int64_t>()()));
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableEvict").Device(DEVICE_CPU), TableEvictOp);

template <typename T>
Status OutputVector(OpKernelContext* ctx, int index, const std::vector<T>& v, int64_t cols) {
  Tensor* out = nullptr;
  const int64_t rows = cols == 0 ? static_cast<int64_t>(v.size()) : static_cast<int64_t>(v.size()) / cols;
  TensorShape shape = cols == 0 ? TensorShape({rows}) : TensorShape({rows, cols});
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
  std::copy(v.begin(), v.end(), out->flat<T>().data());
  return OkStatus();
}

std::vector<int64_t> FlattenMeta(const std::vector<RowMeta>& meta) {
  std::vector<int64_t> flat;
  flat.reserve(2 * meta.size());
  for (const RowMeta& m : meta) {
    flat.push_back(m.count);
    flat.push_back(m.last_seen);
  }
  return flat;
}

class TableExportOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    TableSnapshot snap;
    std::string optimizer;
    std::vector<float> slot_init;
    table->Export(&snap, &optimizer, &slot_init);
    const int64_t stride = table->dim() * (1 + static_cast<int64_t>(slot_init.size()));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, snap.keys, 0));
    // values is [N, stride] even when N == 0.
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({static_cast<int64_t>(snap.keys.size()), stride}), &values));
    std::copy(snap.values.begin(), snap.values.end(), values->flat<float>().data());
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, FlattenMeta(snap.meta), 2));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, snap.candidate_keys, 0));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 4, FlattenMeta(snap.candidate_meta), 2));
    Tensor* opt = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({}), &opt));
    opt->scalar<tstring>()() = optimizer;
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 6, slot_init, 0));
    OutputScalar(ctx, 7, table->step());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableExport").Device(DEVICE_CPU), TableExportOp);

Status ReadMeta(const Tensor& t, const char* name, int64_t n, std::vector<RowMeta>* meta) {
  if (t.dims() != 2 || t.dim_size(0) != n || t.dim_size(1) != 2)
    return errors::InvalidArgument(name, " must have shape [", n, ", 2], got ", t.shape().DebugString());
  const auto m = t.matrix<int64_t>();
  meta->resize(n);
  for (int64_t i = 0; i < n; ++i) (*meta)[i] = RowMeta{m(i, 0), m(i, 1)};
  return OkStatus();
}

class TableImportOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& candidate_keys = ctx->input(4);
    const Tensor& optimizer = ctx->input(6);
    const Tensor& slot_init = ctx->input(7);
    const Tensor& step = ctx->input(8);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be rank 1, got shape ", keys.shape().DebugString()));
    OP_REQUIRES(ctx, slot_init.dims() == 1,
                errors::InvalidArgument("slot_init must be rank 1, got shape ", slot_init.shape().DebugString()));
    OP_REQUIRES(ctx, candidate_keys.dims() == 1,
                errors::InvalidArgument("candidate_keys must be rank 1, got shape ",
                                        candidate_keys.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(optimizer.shape()) && TensorShapeUtils::IsScalar(step.shape()),
                errors::InvalidArgument("optimizer and step must be scalars"));
    const int64_t n = keys.NumElements();
    const int64_t stride = table->dim() * (1 + slot_init.NumElements());
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(0) == n && values.dim_size(1) == stride,
                errors::InvalidArgument("values must have shape [", n, ", ", stride, "] (dim ", table->dim(),
                                        " times 1 + ", slot_init.NumElements(), " slots), got ",
                                        values.shape().DebugString()));
    const std::string opt_name(optimizer.scalar<tstring>()());
    OP_REQUIRES(ctx, slot_init.NumElements() == 0 || !opt_name.empty(),
                errors::InvalidArgument("optimizer must name the owner of the ", slot_init.NumElements(), " slots"));
    TableSnapshot snap;
    snap.keys.assign(keys.flat<int64_t>().data(), keys.flat<int64_t>().data() + n);
    snap.values.assign(values.flat<float>().data(), values.flat<float>().data() + n * stride);
    OP_REQUIRES_OK(ctx, ReadMeta(ctx->input(3), "meta", n, &snap.meta));
    const int64_t m = candidate_keys.NumElements();
    snap.candidate_keys.assign(candidate_keys.flat<int64_t>().data(), candidate_keys.flat<int64_t>().data() + m);
    OP_REQUIRES_OK(ctx, ReadMeta(ctx->input(5), "candidate_meta", m, &snap.candidate_meta));
    std::vector<float> slots(slot_init.flat<float>().data(), slot_init.flat<float>().data() + slot_init.NumElements());
    OP_REQUIRES_OK(ctx, table->Import(snap, opt_name, slots, step.scalar<int64_t>()()));
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableImport").Device(DEVICE_CPU), TableImportOp);

class TableDestroyOp : public OpKernel {
 public:
  explicit TableDestroyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ignore_lookup_error", &ignore_lookup_error_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Status s = DeleteResource(ctx, HandleFromInput(ctx, 0));
    if (!ignore_lookup_error_ || !errors::IsNotFound(s)) OP_REQUIRES_OK(ctx, s);
  }

 private:
  bool ignore_lookup_error_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableDestroy").Device(DEVICE_CPU), TableDestroyOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
