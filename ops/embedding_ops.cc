// Registrations of the dynamic embedding table ops: creating a table, looking keys up
// (training and inference, single keys and the fused multi-field form), size and memory,
// eviction, and export/import for checkpoints. Kernels: ops/kernels/embedding_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {
Status ScalarInput(InferenceContext* c, int i) {
  ShapeHandle unused;
  return c->WithRank(c->input(i), 0, &unused);
}

// keys [N] (input 1) -> rows [N, dim].
Status KeysToRowsShape(InferenceContext* c) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
  return OkStatus();
}
}  // namespace

REGISTER_OP("TtfEmbeddingTable")
    .Output("table: resource")
    .Attr("dim: int >= 1")
    .Attr("initializer: {'normal', 'truncated_normal', 'uniform', 'zeros', 'constant'} = 'uniform'")
    .Attr("init_a: float = -0.05")
    .Attr("init_b: float = 0.05")
    .Attr("seed: int = 0")
    .Attr("default_value: float = 0.0")
    .Attr("admission_min_count: int >= 0 = 0")
    .Attr("max_candidates: int >= 1 = 4194304")
    .Attr("admission_sketch_bytes: int >= 0 = 0")
    .Attr("num_shards: int >= 1 = 16")
    .Attr("capacity: int >= 0 = 0")
    .Attr("capacity_bytes: int >= 0 = 0")
    .Attr("evict_policy: {'lru', 'lfu', 'ttl'} = 'lru'")
    .Attr("ttl_steps: int >= 0 = 0")
    .Attr("dram_budget: int >= 0 = 0")
    .Attr("ssd_dir: string = ''")
    .Attr("rows: {'fp32', 'bf16', 'int8'} = 'fp32'")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (once per shared_name) a dynamic embedding table and returns its handle.

rows: how rows are stored: fp32, or bf16 / row-wise int8 (with their optimizer slots in
compressed forms) written back with stochastic rounding seeded by (seed, key, step); lookups
read them decoded to float32 (ops/kernels/row_layout.h). Not with dram_budget yet.

A new key's row is a pure function of (seed, key): normal(mean=init_a, stddev=init_b),
truncated_normal (within 2 stddev), uniform(minval=init_a, maxval=init_b), zeros, or
constant(init_a). Missing and not-yet-admitted keys read `default_value` in every element.
With admission_min_count > 0 a key gets a row only once it was seen in that many
training updates (apply ops); until then it is an admission candidate. At most max_candidates
candidates are kept: when full, the least recently seen eighth of a shard's candidates
(fewest sightings first) is dropped and counted (TtfTableStats.candidates_dropped).
admission_sketch_bytes > 0 (with admission_min_count > 0) counts sightings in a count-min
sketch of that many bytes instead (4 rows of 8-bit counters per lock shard, conservative
update, every counter halved each width/8 sightings of a shard): no candidate is stored, the
memory is fixed, and a key seen once is admitted early with probability at most
(1 / (4 * (admission_min_count - 1)))^4 (docs/tiers.md); the sketch is not checkpointed.
capacity > 0 bounds the rows: after each update the table holds at most capacity rows
(each lock shard its share, capacity / num_shards rounded up) plus that update's new keys;
when over, it evicts down to 15/16 of the capacity by evict_policy: 'lru' (least recently
updated first), 'lfu' (fewest updates first), ties by the other, then by key. Rows updated
by the current update are never evicted. capacity_bytes > 0 is the same bound in bytes
(instead of capacity, never with dram_budget): each shard keeps at most
(capacity_bytes / num_shards) / row_bytes rows, row_bytes = 4 * dim * (1 + optimizer slots)
+ 40 (value and slots, metadata, index entry: the bytes dram_budget counts a row), at the
current row width (an optimizer's first update adds its slots, and the limit falls with
it); it must hold one row per shard at creation and when slots are added (InvalidArgument
otherwise). evict_policy 'ttl' (with ttl_steps > 0, and only
then) also evicts every row and candidate not updated in the last ttl_steps steps (swept
every ttl_steps/16 steps per shard). Evictions are counted (TtfTableStats.rows_evicted)
and recorded as deleted keys for delta checkpoints.
dram_budget > 0 (bytes) with ssd_dir: a DRAM + SSD tier. Each shard keeps at most its share
of the budget in DRAM rows (value, slots, metadata, index entry); before an update would
exceed it, the least recently updated rows outside that update move to an unlinked file
under ssd_dir. Lookups read disk rows in place; the update promotes them back to DRAM, so
a tiered table trains exactly as an untiered one. With capacity or TTL, both tiers count
and an evicted row leaves either. The disk tier's key index counts inside the budget.
ssd_dir must be writable (checked at creation); a full disk fails the op with
ResourceExhausted, leaving every row in exactly one tier.
dim must be in [1, 4096] and num_shards in [1, 4096]; init_a, init_b and default_value
must be finite. Reopening an existing shared_name with any other attr value fails.
)doc");

REGISTER_OP("TtfEmbeddingLookup")
    .Input("table: resource")
    .Input("ids: int64")
    .Output("embeddings: float")
    .Output("unique_keys: int64")
    .Output("inverse_index: int32")
    .Attr("dim: int >= 1")
    .Attr("training: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(1), 1, &ids));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(ids, c->Vector(dim), &out));
      c->set_output(0, out);
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Vector(c->NumElements(ids)));
      return OkStatus();
    })
    .Doc(R"doc(
Fused lookup of ids of any shape ([B], [B, F], ...) in one call: de-duplicates the ids,
probes the table once per unique key and returns embeddings of shape ids.shape + [dim].
Neither mode changes the table: insertion, counts and admission happen in the apply ops,
for the keys they update (so a step skipped before its update changes nothing). A missing
key reads, with training=true, the row the update would insert (its initializer row, or the
default row while it is not yet admitted); with training=false, the default row. unique_keys and inverse_index (embeddings = rows(unique_keys)[inverse_index])
feed the gradient: segment-sum the embedding gradients by inverse_index.
)doc");

REGISTER_OP("TtfEmbeddingLookupRagged")
    .Input("table: resource")
    .Input("values: int64")
    .Input("row_splits: int64")
    .Output("embeddings: float")
    .Output("unique_keys: int64")
    .Output("inverse_index: int32")
    .Attr("dim: int >= 1")
    .Attr("training: bool = true")
    .Attr("combiner: {'sum', 'mean'} = 'mean'")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
      c->set_output(0, c->Matrix(batch, dim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Vector(c->Dim(values, 0)));
      return OkStatus();
    })
    .Doc(R"doc(
Fused lookup of ragged multi-hot ids (a RaggedTensor's flat values and row_splits, B bags)
combined per bag by sum or mean into [B, dim]; an empty bag gives zeros.
)doc");

REGISTER_OP("TtfEmbeddingGrad")
    .Input("grads: float")
    .Input("inverse_index: int32")
    .Input("unique_keys: int64")
    .Output("unique_grads: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grads, inverse, unique;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &grads));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &inverse));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unique));
      c->set_output(0, c->Matrix(c->Dim(unique, 0), c->Dim(grads, -1)));
      return OkStatus();
    })
    .Doc(R"doc(
The gradient of a lookup per unique key: grads [..., D] flattened to [N, D] rows are summed
into unique_grads [U, D] by inverse_index (N entries in [0, U)), U = size of unique_keys.
)doc");

REGISTER_OP("TtfTableFindOrInsert")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("rows: float")
    .Attr("dim: int >= 1")
    .SetShapeFn(KeysToRowsShape)
    .Doc("Inserts missing keys [N] (subject to admission), counting a sighting of each, and returns their rows "
         "[N, dim] (the default row for a key not yet admitted): fills a table outside training. Training lookups "
         "never insert; the apply ops do.");

REGISTER_OP("TtfTableFind")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("rows: float")
    .Attr("dim: int >= 1")
    .Attr("training: bool = false")
    .SetShapeFn(KeysToRowsShape)
    .Doc("Lookup of keys [N] -> rows [N, dim]; never inserts or counts. A missing key reads the default row, or "
         "with training=true the row this step's update would insert (its initializer row, once admitted).");

REGISTER_OP("TtfTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("The number of keys holding a row.");

REGISTER_OP("TtfTableStats")
    .Input("table: resource")
    .Output("candidates: int64")
    .Output("memory_bytes: int64")
    .Output("step: int64")
    .Output("candidates_dropped: int64")
    .Output("rows_evicted: int64")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 5; ++i) c->set_output(i, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Keys counted toward admission but without a row yet; bytes allocated; the table's step;
candidates dropped so far by the max_candidates bound; rows evicted so far by the capacity
and TTL policy (not counting TtfTableEvict and TtfTableRemove).
)doc");

REGISTER_OP("TtfTableTierStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(13));
      return OkStatus();
    })
    .Doc(R"doc(
The DRAM + SSD tier of a table, as int64[13]: rows in DRAM, rows on disk, lookups of keys
found in DRAM, lookups of keys found on disk (both since creation, keys with a row only),
rows demoted to disk, rows promoted back, DRAM bytes of the rows (values, slots, metadata,
index), RAM bytes of the disk tier's key index, bytes of the disk files, and the DRAM row
limit the budget gives at the current row width (0 for an untiered table), the lookups'
disk reads that were not in the page cache (waited for the device, since creation), the
lock shards whose disk key index takes over half their share of dram_budget, and the rows of
the demoted count that an update read from disk and wrote straight back (DRAM admission).
)doc");

REGISTER_OP("TtfTableEvict")
    .Input("table: resource")
    .Input("min_last_seen: int64")
    .Input("min_count: int64")
    .Output("evicted: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2));
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Removes every key whose last-seen step is below min_last_seen or that was seen in fewer
than min_count training updates (admission candidates go by last-seen step only). Returns
the number of rows removed. A shard left at most half full is rebuilt densely and the freed
memory handed back to the system, so the process RSS falls.
)doc");

namespace {
// The outputs of TtfTableExport, then (delta) deleted_keys.
Status ExportShape(InferenceContext* c) {
  const auto n = InferenceContext::kUnknownDim;
  c->set_output(0, c->Vector(n));
  c->set_output(1, c->Matrix(n, n));
  c->set_output(2, c->Matrix(n, 2));
  c->set_output(3, c->Vector(n));
  c->set_output(4, c->Matrix(n, 2));
  c->set_output(5, c->Scalar());
  c->set_output(6, c->Vector(n));
  c->set_output(7, c->Scalar());
  if (c->num_outputs() > 8) c->set_output(8, c->Vector(n));
  return OkStatus();
}
}  // namespace

REGISTER_OP("TtfTableExport")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("values: float")
    .Output("meta: int64")
    .Output("candidate_keys: int64")
    .Output("candidate_meta: int64")
    .Output("optimizer: string")
    .Output("slot_init: float")
    .Output("step: int64")
    .Attr("reset_deleted: bool = false")
    .Attr("record: int = 0")
    .Attr("stored_values: bool = false")
    .SetShapeFn(ExportShape)
    .Doc(R"doc(
Everything a checkpoint needs: keys [N], values [N, dim * (1 + S)] (row then S optimizer
slots), meta [N, 2] (count, last-seen step), the admission candidates and their meta, the
optimizer owning the slots, the slots' initial values [S] and the table step.
One consistent snapshot (every shard locked shared while it is taken: writers wait,
readers go on), written straight into the outputs. reset_deleted=true also clears the
record of deleted keys in the same snapshot and starts recording (the base of a chain of
TtfTableExportDelta). record: which reader's record of removed keys, in [0, 2): each reader
of the change log keeps its own, reset by it only, so one reader's chain of deltas never
disturbs another's (the caller numbers its readers). stored_values=true: values holds each
row's value as the table stores it instead, [N, W] 4-byte words, no optimizer slots (for
rows int8 the dim int8 codes, then a float32 scale and bias, value = code * scale + bias,
zero-padded to whole words; for bf16 the bfloat16 values; for fp32 the floats), for an
int8 serving export that keeps the codes.
)doc");

REGISTER_OP("TtfTableExportDelta")
    .Input("table: resource")
    .Input("since_step: int64")
    .Output("keys: int64")
    .Output("values: float")
    .Output("meta: int64")
    .Output("candidate_keys: int64")
    .Output("candidate_meta: int64")
    .Output("optimizer: string")
    .Output("slot_init: float")
    .Output("step: int64")
    .Output("deleted_keys: int64")
    .Attr("reset_deleted: bool = true")
    .Attr("record: int = 0")
    .Attr("stored_values: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      return ExportShape(c);
    })
    .Doc(R"doc(
A delta checkpoint: like TtfTableExport, but only the rows and candidates whose last-seen
step is > since_step (>= -1), plus deleted_keys: the keys whose row or candidate was
removed (evicted, dropped, TtfTableRemove) since the record was last reset (sorted,
distinct; empty until a reset started the record). With reset_deleted the record is
cleared in the same snapshot. Restore = Import of the full export, then per delta:
TtfTableRemove(deleted_keys), then TtfTableImport(merge=true).
Lookups after a save at table step t mark rows last-seen t: pass since_step = t - 1 to
catch every change made after that save. record: which reader's record of removed keys is
read and reset (see TtfTableExport). stored_values: as TtfTableExport's.
)doc");

REGISTER_OP("TtfTableDeletedKeys")
    .Input("table: resource")
    .Output("deleted_keys: int64")
    .Attr("reset: bool = false")
    .Attr("record: int = 0")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    })
    .Doc(R"doc(
The keys removed from the table since the record was last reset (sorted, distinct); a record
also loses the keys a committed save took for it (TtfTableCommitSave). The record is off
(empty) until the first reset; reset=true clears and starts it. record: which reader's
record (see TtfTableExport).
)doc");

REGISTER_OP("TtfTableRemove")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("removed: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc("Removes these keys' rows and admission candidates (absent keys are ignored); returns rows removed.");

// TtfTableImport's and TtfTableImportStored's shapes.
static Status ImportShape(InferenceContext* c) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 2, &unused));
  TF_RETURN_IF_ERROR(ScalarInput(c, 6));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(7), 1, &unused));
  TF_RETURN_IF_ERROR(ScalarInput(c, 8));
  return OkStatus();
}

REGISTER_OP("TtfTableImport")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("values: float")
    .Input("meta: int64")
    .Input("candidate_keys: int64")
    .Input("candidate_meta: int64")
    .Input("optimizer: string")
    .Input("slot_init: float")
    .Input("step: int64")
    .SetShapeFn(ImportShape)
    .Attr("num_partitions: int >= 1 = 1")
    .Attr("partition: int >= 0 = 0")
    .Attr("merge: bool = false")
    .Doc(R"doc(
Replaces the table's whole content with an export (see TtfTableExport), or with
merge=true upserts its rows and candidates and keeps the others (for delta checkpoints;
the step becomes max(table step, step)). Only keys with PartitionOf(key, num_partitions) ==
partition are taken (the low 32 bits of the key's SplitMix64 hash mod num_partitions, as
ttf.embedding.shard_of computes it), read in place from the inputs. The input is validated whole
before the table changes: shapes, counts and last-seen steps >= 0, step >= 0, optimizer
one of '', sgd, adagrad, adam, ftrl with its slot count (0, 0, 1, 2, 2), distinct keys.
)doc");

REGISTER_OP("TtfTableImportStored")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("values: float")
    .Input("meta: int64")
    .Input("candidate_keys: int64")
    .Input("candidate_meta: int64")
    .Input("optimizer: string")
    .Input("slot_init: float")
    .Input("step: int64")
    .Input("row_layout: string")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ImportShape(c));
      return ScalarInput(c, 9);
    })
    .Attr("num_partitions: int >= 1 = 1")
    .Attr("partition: int >= 0 = 0")
    .Attr("merge: bool = false")
    .Doc(R"doc(
TtfTableImport of a checkpoint's rows (ttf/checkpoint/_format.py): row_layout '' is the full
layout, as TtfTableImport's values; a layout tag (RowLayout::Tag, as TtfTableSave returns it)
means each row of values is that layout's stored words (float32 bits, not numbers), with the
optimizer's slots or none (then they start at slot_init). Rows of the table's own layout are
copied as they are (the same bits); others are decoded and converted. A tag that cannot be
read, of another dim or of other slots is an InvalidArgument naming the cause and the fix.
)doc");

REGISTER_OP("TtfTableDestroy")
    .Input("table: resource")
    .Attr("ignore_lookup_error: bool = true")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Deletes the table from its resource manager, freeing its memory.");

}  // namespace ttf
}  // namespace tensorflow
