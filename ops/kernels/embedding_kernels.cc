// Kernels of the table ops registered in ops/embedding_ops.cc.
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_candidates", &config_.max_candidates));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_sketch_bytes", &config_.admission_sketch_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards));
    std::string evict_policy;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &config_.capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity_bytes", &config_.capacity_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("evict_policy", &evict_policy));
    OP_REQUIRES_OK(ctx, ParseEvictPolicy(evict_policy, &config_.evict_policy));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ttl_steps", &config_.ttl_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dram_budget", &config_.dram_budget));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_dir", &config_.ssd_dir));
    std::string rows;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows", &rows));
    OP_REQUIRES(ctx, ParseRowFormat(rows, &config_.rows),
                errors::InvalidArgument("rows must be fp32, bf16 or int8, got '", rows, "'"));
    OP_REQUIRES(ctx, num_shards >= 1 && num_shards <= kMaxShards,
                errors::InvalidArgument("num_shards must be in [1, ", kMaxShards, "], got ", num_shards));
    config_.num_shards = static_cast<int>(num_shards);
    OP_REQUIRES_OK(ctx, ValidateConfig(config_));
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
      const Status opened = (*t)->OpenTier();  // an unwritable ssd_dir fails here, at creation
      if (!opened.ok()) (*t)->Unref(), *t = nullptr;
      return opened;
    }));
    core::ScopedUnref unref(table);
    OP_REQUIRES(ctx, table->config() == config_,
                errors::InvalidArgument("a table named '", shared_name_, "' already exists with (",
                                        table->config().DebugString(), "); asked for (", config_.DebugString(),
                                        "). Give the new table another shared_name."));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<ResourceHandle>()() = handle;
  }

 private:
  TableConfig config_;
  std::string container_, shared_name_;
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingTable").Device(DEVICE_CPU), EmbeddingTableOp);

// Looks up the distinct keys of `keys` (read-only: training lookups insert nothing, the
// apply ops do): fills `grouped` and `rows` (grouped.size() x dim).
Status LookupDistinct(OpKernelContext* ctx, EmbeddingTable* table, const Tensor& keys, bool training,
                      GroupedKeys* grouped, std::vector<float>* rows) {
  if (keys.NumElements() > kMaxKeysPerCall)
    return errors::InvalidArgument("at most ", kMaxKeysPerCall, " ids per call, got ", keys.NumElements());
  GroupKeys(keys.flat<int64_t>().data(), keys.NumElements(), *table, grouped);
  const int64_t dim = table->dim();
  rows->resize(grouped->size() * dim);
  std::vector<Status> shard_status(table->num_shards());  // a tiered table's disk reads can fail
  ForEachShard(ctx, *grouped, *table, [&](int s) {
    const int64_t off = grouped->offsets[s], n = grouped->offsets[s + 1] - off;
    float* out = rows->data() + off * dim;
    shard_status[s] = table->Find(s, &grouped->keys[off], &grouped->hashes[off], n, training, out);
  });
  for (const Status& status : shard_status) TF_RETURN_IF_ERROR(status);
  return OkStatus();
}

// An inference lookup probes each id straight into its output (FindEach) instead of
// de-duplicating first: the de-dup and the copy back cost more than the repeated ids' probes,
// which hit the cache (docs/lookup_speed.md). A training lookup needs the distinct keys for
// its gradient.
Status LookupEach(OpKernelContext* ctx, EmbeddingTable* table, const Tensor& ids, const TensorShape& out_shape,
                  Tensor** out) {
  if (ids.NumElements() > kMaxKeysPerCall)
    return errors::InvalidArgument("at most ", kMaxKeysPerCall, " ids per call, got ", ids.NumElements());
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, out_shape, out));
  return table->FindEach(ids.flat<int64_t>().data(), ids.NumElements(), (*out)->flat<float>().data());
}

// out[p] = rows[inverse[p]] for every position p (in blocks on the CPU pool when there are many).
void ScatterRows(OpKernelContext* ctx, const std::vector<float>& rows, const std::vector<int32_t>& inverse,
                 int64_t dim, float* out) {
  // A row copy is a few ns: blocks of at least 64k positions (~0.3 ms) are worth a hand-off.
  RunInBlocks(ctx, inverse.size(), 65536, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      CopyRow(out + p * dim, rows.data() + static_cast<int64_t>(inverse[p]) * dim, dim);
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
    TensorShape out_shape = ids.shape();
    out_shape.AddDim(dim_);
    Tensor* embeddings = nullptr;
    // Only the embeddings read (a layer called at inference inside a graph): no de-dup.
    if (!training_ && !ctx->output_required(1) && !ctx->output_required(2)) {
      OP_REQUIRES_OK(ctx, LookupEach(ctx, table, ids, out_shape, &embeddings));
      return;
    }
    GroupedKeys grouped;
    std::vector<float>& rows = ScratchRows();
    OP_REQUIRES_OK(ctx, LookupDistinct(ctx, table, ids, training_, &grouped, &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &embeddings));
    ScatterRows(ctx, rows, grouped.inverse, dim_, embeddings->flat<float>().data());
    OutputUniqueAndInverse(ctx, grouped, 1);
    if (training_) table->last_grouping().Keep(std::move(grouped));  // for the apply of these unique keys
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
    std::vector<float>& rows = ScratchRows();
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
    OP_REQUIRES(ctx, dim <= kMaxDim,
                errors::InvalidArgument("grads rows must have at most ", kMaxDim, " elements (a table's largest dim), "
                                        "got shape ", grads.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, dim}), &out));
    const int32_t* inv = inverse.flat<int32_t>().data();
    for (int64_t p = 0; p < n; ++p) {
      OP_REQUIRES(ctx, inv[p] >= 0 && inv[p] < u,
                  errors::InvalidArgument("inverse_index[", p, "] = ", inv[p], " is outside [0, ", u, ")"));
    }
    // One pass in input order (so the sum order, and the result, are deterministic).
    SumRowsByIndex(grads.flat<float>().data(), inv, n, u, dim, out->flat<float>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfEmbeddingGrad").Device(DEVICE_CPU), EmbeddingGradOp);

// TtfTableFind (read-only, training attr as in LookupDistinct) / TtfTableFindOrInsert
// (inserts missing keys, counting them): keys [N] -> rows [N, dim].
template <bool kInsert>
class TableLookupOp : public TableOpKernel {
 public:
  explicit TableLookupOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    if (!kInsert) OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    OP_REQUIRES_OK(ctx, CheckDim(*table, dim_));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be rank 1, got shape ", keys.shape().DebugString()));
    if (!kInsert && !training_) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, LookupEach(ctx, table, keys, TensorShape({keys.NumElements(), dim_}), &out));
      return;
    }
    GroupedKeys grouped;
    std::vector<float>& rows = ScratchRows();
    if (kInsert) {
      OP_REQUIRES(ctx, keys.NumElements() <= kMaxKeysPerCall,
                  errors::InvalidArgument("at most ", kMaxKeysPerCall, " ids per call, got ", keys.NumElements()));
      GroupKeys(keys.flat<int64_t>().data(), keys.NumElements(), *table, &grouped);
      rows.resize(grouped.size() * dim_);
      std::vector<Status> shard_status(table->num_shards());
      ForEachShard(ctx, grouped, *table, [&](int s) {
        const int64_t off = grouped.offsets[s], n = grouped.offsets[s + 1] - off;
        shard_status[s] = table->FindOrInsert(s, &grouped.keys[off], &grouped.hashes[off], n, rows.data() + off * dim_);
      });
      for (const Status& status : shard_status) OP_REQUIRES_OK(ctx, status);
    } else {
      OP_REQUIRES_OK(ctx, LookupDistinct(ctx, table, keys, training_, &grouped, &rows));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({keys.NumElements(), dim_}), &out));
    ScatterRows(ctx, rows, grouped.inverse, dim_, out->flat<float>().data());
  }

 private:
  int64_t dim_;
  bool training_ = false;
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
    OutputScalar(ctx, 3, table->CandidatesDropped());
    OutputScalar(ctx, 4, table->RowsEvicted());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableStats").Device(DEVICE_CPU), TableStatsOp);

class TableTierStatsOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    const EmbeddingTable::TierStats t = table->Tiers();
    const int64_t values[] = {t.dram_rows, t.disk_rows,      t.dram_hits,        t.disk_hits,       t.demoted,
                              t.promoted,  t.dram_bytes,     t.disk_index_bytes, t.disk_file_bytes, t.dram_row_limit,
                              t.disk_waits, t.crowded_shards, t.written_back};
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(std::size(values))}), &out));
    std::copy(std::begin(values), std::end(values), out->flat<int64_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableTierStats").Device(DEVICE_CPU), TableTierStatsOp);

class TableEvictOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    for (int i = 1; i <= 2; ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  errors::InvalidArgument(i == 1 ? "min_last_seen" : "min_count", " must be a scalar, got shape ",
                                          ctx->input(i).shape().DebugString()));
    }
    int64_t evicted = 0;
    OP_REQUIRES_OK(ctx, table->Evict(ctx->input(1).scalar<int64_t>()(), ctx->input(2).scalar<int64_t>()(), &evicted));
    OutputScalar(ctx, 0, evicted);
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableEvict").Device(DEVICE_CPU), TableEvictOp);

// Export (all rows, or since a step), writing straight into the outputs.
void ExportInto(OpKernelContext* ctx, EmbeddingTable* table, int64_t since_step, bool with_deleted,
                bool reset_deleted, int record, bool stored_values) {
  ExportLayout layout;
  auto allocate = [&](const ExportLayout& l, ExportBuffers* out) -> Status {
    layout = l;
    Tensor *keys, *values, *meta, *candidate_keys, *candidate_meta;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({l.rows}), &keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({l.rows, l.stride}), &values));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({l.rows, 2}), &meta));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({l.candidates}), &candidate_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(4, TensorShape({l.candidates, 2}), &candidate_meta));
    out->keys = keys->flat<int64_t>().data();
    out->values = values->flat<float>().data();
    out->meta = meta->flat<int64_t>().data();
    out->candidate_keys = candidate_keys->flat<int64_t>().data();
    out->candidate_meta = candidate_meta->flat<int64_t>().data();
    return OkStatus();
  };
  std::vector<int64_t> deleted;
  OP_REQUIRES_OK(ctx, table->Export(since_step, allocate, with_deleted ? &deleted : nullptr, reset_deleted, record,
                                    stored_values));
  Tensor* opt = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({}), &opt));
  opt->scalar<tstring>()() = layout.optimizer;
  Tensor* slot_init = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({static_cast<int64_t>(layout.slot_init.size())}), &slot_init));
  std::copy(layout.slot_init.begin(), layout.slot_init.end(), slot_init->flat<float>().data());
  OutputScalar(ctx, 7, layout.step);
  if (with_deleted) {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(8, TensorShape({static_cast<int64_t>(deleted.size())}), &out));
    std::copy(deleted.begin(), deleted.end(), out->flat<int64_t>().data());
  }
}

class TableExportOp : public TableOpKernel {
 public:
  explicit TableExportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reset_deleted", &reset_deleted_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stored_values", &stored_values_));
    OP_REQUIRES_OK(ctx, GetRecordAttr(ctx, &record_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    ExportInto(ctx, table, std::numeric_limits<int64_t>::min(), false, reset_deleted_, record_, stored_values_);
  }

 private:
  bool reset_deleted_, stored_values_;
  int record_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableExport").Device(DEVICE_CPU), TableExportOp);

class TableExportDeltaOp : public TableOpKernel {
 public:
  explicit TableExportDeltaOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reset_deleted", &reset_deleted_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stored_values", &stored_values_));
    OP_REQUIRES_OK(ctx, GetRecordAttr(ctx, &record_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    const Tensor& since = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(since.shape()),
                errors::InvalidArgument("since_step must be a scalar, got shape ", since.shape().DebugString()));
    const int64_t since_step = since.scalar<int64_t>()();
    OP_REQUIRES(ctx, since_step >= -1, errors::InvalidArgument("since_step must be >= -1, got ", since_step));
    ExportInto(ctx, table, since_step, true, reset_deleted_, record_, stored_values_);
  }

 private:
  bool reset_deleted_, stored_values_;
  int record_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableExportDelta").Device(DEVICE_CPU), TableExportDeltaOp);

class TableDeletedKeysOp : public TableOpKernel {
 public:
  explicit TableDeletedKeysOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reset", &reset_));
    OP_REQUIRES_OK(ctx, GetRecordAttr(ctx, &record_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    std::vector<int64_t> deleted;
    table->DeletedKeys(reset_, &deleted, record_);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(deleted.size())}), &out));
    std::copy(deleted.begin(), deleted.end(), out->flat<int64_t>().data());
  }

 private:
  bool reset_;
  int record_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableDeletedKeys").Device(DEVICE_CPU), TableDeletedKeysOp);

class TableRemoveOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be rank 1, got shape ", keys.shape().DebugString()));
    int64_t removed = 0;
    OP_REQUIRES_OK(ctx, table->Remove(keys.flat<int64_t>().data(), keys.NumElements(), &removed));
    OutputScalar(ctx, 0, removed);
  }
};
REGISTER_KERNEL_BUILDER(Name("TtfTableRemove").Device(DEVICE_CPU), TableRemoveOp);

// meta [n, 2] of (count >= 0, last_seen >= 0).
Status CheckMeta(const Tensor& t, const char* name, int64_t n) {
  if (t.dims() != 2 || t.dim_size(0) != n || t.dim_size(1) != 2)
    return errors::InvalidArgument(name, " must have shape [", n, ", 2] (count, last_seen per key), got ",
                                   t.shape().DebugString());
  const int64_t* m = t.flat<int64_t>().data();
  for (int64_t i = 0; i < n; ++i) {
    if (m[2 * i] < 0) return errors::InvalidArgument(name, "[", i, "] has a negative count: ", m[2 * i]);
    if (m[2 * i + 1] < 0)
      return errors::InvalidArgument(name, "[", i, "] has a negative last-seen step: ", m[2 * i + 1]);
  }
  return OkStatus();
}

class TableImportOp : public TableOpKernel {
 public:
  explicit TableImportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_partitions", &num_partitions_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("partition", &partition_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("merge", &merge_));
    OP_REQUIRES(ctx, num_partitions_ >= 1,
                errors::InvalidArgument("num_partitions must be >= 1, got ", num_partitions_));
    OP_REQUIRES(ctx, partition_ >= 0 && partition_ < num_partitions_,
                errors::InvalidArgument("partition must be in [0, num_partitions = ", num_partitions_, "), got ",
                                        partition_));
  }
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
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(optimizer.shape()),
                errors::InvalidArgument("optimizer must be a scalar, got shape ", optimizer.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                errors::InvalidArgument("step must be a scalar, got shape ", step.shape().DebugString()));
    ImportSource src;
    src.step = step.scalar<int64_t>()();
    OP_REQUIRES(ctx, src.step >= 0, errors::InvalidArgument("step must be >= 0, got ", src.step));
    src.optimizer = std::string(optimizer.scalar<tstring>()());
    int64_t expected_slots = 0;
    OP_REQUIRES(ctx, SlotsOfOptimizer(src.optimizer, &expected_slots),
                errors::InvalidArgument("optimizer must be one of '', 'sgd', 'adagrad', 'adam', 'ftrl', got '",
                                        src.optimizer, "'"));
    OP_REQUIRES(ctx, slot_init.NumElements() == expected_slots,
                errors::InvalidArgument("optimizer '", src.optimizer, "' keeps ", expected_slots,
                                        " slot(s) per row, but slot_init has ", slot_init.NumElements()));
    src.slot_init.assign(slot_init.flat<float>().data(), slot_init.flat<float>().data() + expected_slots);
    for (float v : src.slot_init)
      OP_REQUIRES(ctx, std::isfinite(v), errors::InvalidArgument("slot_init must be finite, got ", v));
    if (ctx->num_inputs() > 9) {  // TtfTableImportStored
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(9).shape()),
                  errors::InvalidArgument("row_layout must be a scalar, got shape ",
                                          ctx->input(9).shape().DebugString()));
      src.row_layout = std::string(ctx->input(9).scalar<tstring>()());
    }
    RowLayout from;
    OP_REQUIRES_OK(ctx, SourceRowLayout(src, table->dim(), &from));
    const int64_t n = keys.NumElements();
    const int64_t stride = from.words();
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(0) == n && values.dim_size(1) == stride,
                src.row_layout.empty()
                    ? errors::InvalidArgument("values must have shape [", n, ", ", stride, "] (dim ", table->dim(),
                                              " times 1 + ", expected_slots, " slots), got ",
                                              values.shape().DebugString())
                    : errors::InvalidArgument("values must have shape [", n, ", ", stride, "] (the words of a row '",
                                              src.row_layout, "'), got ", values.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckMeta(ctx->input(3), "meta", n));
    const int64_t m = candidate_keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckMeta(ctx->input(5), "candidate_meta", m));
    OP_REQUIRES(ctx, n < (int64_t{1} << 32) && m < (int64_t{1} << 32),
                errors::InvalidArgument("at most 2^32 - 1 keys per import, got ", n, " keys and ", m, " candidates"));
    src.keys = keys.flat<int64_t>().data();
    src.num_rows = n;
    src.values = values.flat<float>().data();
    src.meta = ctx->input(3).flat<int64_t>().data();
    src.candidate_keys = candidate_keys.flat<int64_t>().data();
    src.num_candidates = m;
    src.candidate_meta = ctx->input(5).flat<int64_t>().data();
    src.num_partitions = num_partitions_;
    src.partition = partition_;
    src.merge = merge_;
    OP_REQUIRES_OK(ctx, table->Import(src));
  }

 private:
  int64_t num_partitions_, partition_;
  bool merge_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableImport").Device(DEVICE_CPU), TableImportOp);
REGISTER_KERNEL_BUILDER(Name("TtfTableImportStored").Device(DEVICE_CPU), TableImportOp);

class TableDestroyOp : public OpKernel {
 public:
  explicit TableDestroyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ignore_lookup_error", &ignore_lookup_error_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Status s = DeleteResource(ctx, HandleFromInput(ctx, 0));
    if (!ignore_lookup_error_ || !absl::IsNotFound(s)) OP_REQUIRES_OK(ctx, s);
  }

 private:
  bool ignore_lookup_error_;
};
REGISTER_KERNEL_BUILDER(Name("TtfTableDestroy").Device(DEVICE_CPU), TableDestroyOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
