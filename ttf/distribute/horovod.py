"""Synchronous data-parallel training on Horovod, with ttf tables sharded over the ranks.

Every rank runs the whole model on its slice of the global batch. Each id of a ttf table
lives on exactly one rank, `ttf.embedding.shard_of(id, size)`. A training step:

  forward:  each rank de-duplicates its batch's ids (all fields of a table at once) and one
            alltoall sends each id to its owner; the owner finds or inserts the rows and one
            alltoall brings them back;
  backward: one alltoall carries each id's row gradient to its owner, which sums it over
            the ranks and applies the fused optimizer once per id (ttf.optimizers);
            dense gradients are allreduced (averaged, fused into one buffer).

Table gradients are averaged over the ranks like dense ones, so with every rank's loss the
mean over its slice, N ranks of batch B compute what one process computes on the global
batch of N x B. Importing this module imports horovod; `import ttf` never does.

Your own Keras model (both model.fit and a GradientTape loop work):

    import ttf
    import ttf.distribute.horovod as tdh
    import horovod.tensorflow as hvd
    hvd.init()
    model = make_model()                                  # uses ttf.FusedEmbedding / DynamicEmbedding
    tdh.shard_tables(model)                               # each id now lives on one rank
    optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(1e-3))
    model(sample_batch)                                   # builds the variables
    tdh.broadcast_variables(model.variables)              # rank 0's initial dense weights everywhere

and run it with `horovodrun --gloo -np 2 python your_script.py`.

Compression (`compression="fp16"|"bf16"`) casts what crosses the wire to 16 bits and back:
the embedding rows, their gradients and the dense allreduce (summed in float32 on arrival).
"""
import contextlib
import hashlib
import json

import tensorflow as tf

try:
    import horovod.tensorflow as hvd
except ImportError as err:  # pragma: no cover (depends on the environment)
    raise ImportError(
        f"ttf.distribute.horovod needs horovod ({err}). Install it with ./scripts/setup_horovod.sh "
        "(builds horovod 0.28.1 against this TensorFlow with Gloo, about 6 minutes the first time)."
    ) from err

from ttf._ops import ops
from ttf.embedding import DynamicEmbedding, embedding_of, shard_of

COMPRESSIONS = ("none", "fp16", "bf16")
_WIRE_DTYPES = {"none": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
_wire_bytes = []  # one int64 counter variable, made on first use


def _check_compression(compression):
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    return _WIRE_DTYPES[compression]


def _counter():
    if not _wire_bytes:
        with tf.init_scope():
            _wire_bytes.append(tf.Variable(0, dtype=tf.int64, trainable=False, name="ttf_hvd_wire_bytes"))
    return _wire_bytes[0]


def wire_bytes():
    """Bytes this rank has sent to other ranks so far (ids, rows, row gradients and the dense
    allreduce, in their wire precision; the ring allreduce counted as 2 (n - 1) / n of the buffer)."""
    return int(_counter().numpy())


def _count(nbytes):
    return _counter().assign_add(tf.cast(nbytes, tf.int64))


def _to_wire(values, dtype):
    """float32 -> what crosses the wire. Horovod's alltoall and allgather move bytes but take
    no bfloat16, so bfloat16 travels bit-cast as int16."""
    if dtype == tf.float32:
        return values
    values = tf.cast(values, dtype)
    return tf.bitcast(values, tf.int16) if dtype == tf.bfloat16 else values


def _from_wire(values, dtype):
    if dtype == tf.bfloat16:
        values = tf.bitcast(values, tf.bfloat16)
    return tf.cast(values, tf.float32)


def _itemsize(dtype):
    return 4 if dtype == tf.float32 else 2


class TableSharding:
    """Makes a ttf embedding layer's table one shard of a table spread over the Horovod
    ranks: this rank holds the ids with shard_of(id, size) == rank. Set by shard_tables."""

    def __init__(self, compression="none"):
        self.wire_dtype = _check_compression(compression)
        self.compression = compression
        self.rank, self.size = hvd.rank(), hvd.size()
        self._gathered = {}

    def lookup(self, layer, keys, row_splits, training):
        """The layer's lookup of `keys` (a flat id list with row_splits for ragged ids, else
        any shape), through the owners; training: rows are inserted and gradients routed."""
        if not training:
            embeddings, _ = self._forward(layer, keys, row_splits, training=False)
            return embeddings
        if not layer.built:
            layer.build(None)

        @tf.custom_gradient
        def lookup(anchor):
            del anchor  # connects the tape to the layer's anchor variable; its value is unused
            embeddings, route = self._forward(layer, keys, row_splits, training=True)

            def grad(upstream):
                return self._route_gradient(layer, upstream, row_splits, route)

            return embeddings, grad

        return lookup(tf.convert_to_tensor(layer.anchor))

    def _forward(self, layer, keys, row_splits, training):
        name = layer.name
        unique_keys, inverse = tf.unique(tf.reshape(keys, [-1]), out_idx=tf.int32)
        owner = shard_of(unique_keys, self.size)
        order = tf.argsort(owner, stable=True)  # ids grouped by owner, in rank order
        splits = tf.math.bincount(owner, minlength=self.size, maxlength=self.size, dtype=tf.int32)
        recv_keys, recv_splits = hvd.alltoall(tf.gather(unique_keys, order), splits=splits,
                                              name=f"ttf_{name}_ids")
        # The same id can come from several ranks: probe (and count a sighting) once.
        owned_keys, owned_index = tf.unique(recv_keys, out_idx=tf.int32)
        owned_rows = layer.tables[0].lookup(owned_keys, training)
        sent_rows, _ = hvd.alltoall(_to_wire(tf.gather(owned_rows, owned_index), self.wire_dtype),
                                    splits=recv_splits, name=f"ttf_{name}_rows")
        unique_rows = tf.gather(_from_wire(sent_rows, self.wire_dtype), tf.math.invert_permutation(order))
        per_key = tf.gather(unique_rows, inverse)
        if row_splits is None:
            embeddings = tf.reshape(per_key, tf.concat([tf.shape(keys), [layer.dim]], 0))
        else:
            row_ids = tf.ragged.row_splits_to_segment_ids(row_splits)
            bags = tf.shape(row_splits)[0] - 1
            combine = tf.math.unsorted_segment_sum if layer.combiner == "sum" else tf.math.unsorted_segment_mean
            embeddings = combine(per_key, row_ids, bags)
        route = dict(unique_keys=unique_keys, inverse=inverse, order=order, splits=splits,
                     owned_keys=owned_keys, owned_index=owned_index)
        if training:
            off_rank_ids = tf.reduce_sum(splits) - splits[self.rank]
            off_rank_rows = tf.reduce_sum(recv_splits) - recv_splits[self.rank]
            with tf.control_dependencies([_count(8 * off_rank_ids + off_rank_rows * layer.dim
                                                 * _itemsize(self.wire_dtype))]):
                embeddings = tf.identity(embeddings)
        return embeddings, route

    def _route_gradient(self, layer, upstream, row_splits, route):
        per_key = layer._per_key_gradient(tf.convert_to_tensor(upstream), row_splits)  # pylint: disable=protected-access
        unique_grads = ops().ttf_embedding_grad(tf.cast(per_key, tf.float32), route["inverse"], route["unique_keys"])
        sent = _to_wire(tf.gather(unique_grads, route["order"]), self.wire_dtype)
        received, _ = hvd.alltoall(sent, splits=route["splits"], name=f"ttf_{layer.name}_grads")
        # Sum each owned id's gradient over the ranks; / size averages like the dense allreduce.
        owned_keys = route["owned_keys"]
        summed = tf.math.unsorted_segment_sum(_from_wire(received, self.wire_dtype), route["owned_index"],
                                              tf.size(owned_keys)) / self.size
        off_rank = tf.size(route["unique_keys"]) - route["splits"][self.rank]
        with tf.control_dependencies([_count(off_rank * layer.dim * _itemsize(self.wire_dtype))]):
            summed = tf.identity(summed)
        return tf.IndexedSlices(summed, owned_keys)

    # -- checkpoints: the logical table (every id of every rank) is what gets saved

    def export_table(self, layer):
        """The logical table of `layer` for a checkpoint: gathered before the save by
        gathered_tables (so only rank 0 needs to write), else gathered now (a collective)."""
        saved = self._gathered.get(id(layer))
        return saved if saved is not None else self.gather_export(layer)

    def import_table(self, layer, tensors):
        """Restores this rank's part of a logical table written by any topology: the ids it
        owns (shard_of(id, size) == rank), filtered by the import op itself."""
        return layer.tables[0].restore(tensors, num_partitions=self.size, partition=self.rank)

    def gather_export(self, layer):
        """The logical table of `layer`: every rank's export concatenated (a collective: every
        rank must call it, in the same order of layers)."""
        local = layer.tables[0].export()
        gathered = {}
        for field in ("keys", "values", "meta", "candidate_keys", "candidate_meta"):
            gathered[field] = hvd.allgather(local[field], name=f"ttf_{layer.name}_export_{field}")
        for field in ("optimizer", "slot_init", "step"):
            gathered[field] = local[field]
        return gathered


@contextlib.contextmanager
def gathered_tables(model):
    """Gathers every sharded table of `model` from all ranks (every rank must enter, layers in
    the same order); inside, a checkpoint save on any rank writes the logical tables, every id
    of every rank. Restoring any checkpoint sends each id to its owner.

    Example (every rank runs it):
        with tdh.gathered_tables(model):
            if hvd.rank() == 0:
                manager.save()
    """
    layers = [layer for layer in ttf_layers(model) if layer.sharding is not None]
    for layer in layers:
        layer.sharding._gathered[id(layer)] = layer.sharding.gather_export(layer)  # pylint: disable=protected-access
    try:
        yield
    finally:
        for layer in layers:
            layer.sharding._gathered.pop(id(layer), None)  # pylint: disable=protected-access


def ttf_layers(model):
    """The ttf embedding layers of a Keras model (or layer), in a fixed order."""
    layers = model._flatten_layers(include_self=True, recursive=True)  # pylint: disable=protected-access
    return [layer for layer in layers if isinstance(layer, DynamicEmbedding)]


def shard_tables(model, compression="none"):
    """Shards every ttf table of `model` over the Horovod ranks (call after hvd.init(), before
    training). Returns the sharded layers. A layer already sharded over parameter servers
    (shard_devices) cannot also be sharded over ranks."""
    layers = ttf_layers(model)
    if not layers:
        raise ValueError(f"{model.name} has no ttf embedding layer (ttf.FusedEmbedding / ttf.DynamicEmbedding) "
                         "to shard")
    sharding = TableSharding(compression)
    for layer in layers:
        if len(layer.tables) != 1:
            raise ValueError(f"{layer.name} is sharded over {len(layer.tables)} devices (shard_devices); "
                             "on Horovod build it without shard_devices")
        layer.sharding = sharding  # its export_table/import_table now gather / keep this rank's ids
    return layers


def table_size(model):
    """Ids stored over all ranks, summed over the model's ttf tables (a collective)."""
    local = tf.add_n([tf.cast(layer.size(), tf.int64) for layer in ttf_layers(model)])
    return int(hvd.allreduce(local, op=hvd.Sum, name="ttf_table_size"))


def broadcast_variables(variables, root_rank=0):
    """Rank `root_rank`'s values of `variables` (e.g. model.variables after building) everywhere.
    ttf tables are not variables and are not broadcast: each rank owns its own ids."""
    hvd.broadcast_variables(list(variables), root_rank=root_rank)


def allreduce_dense(grads, compression="none", name="ttf_dense"):
    """Averages a list of dense gradient tensors over the ranks, fused into one buffer.

    float32: one Horovod allreduce. 16-bit: a reduce-scatter (alltoall of the 16-bit buffer,
    summed in float32 by each slice's owner) then an allgather of the 16-bit sums: the bytes of
    a ring allreduce in 16 bits, without summing in 16 bits (Horovod has no bfloat16 allreduce)."""
    dtype = _check_compression(compression)
    size = hvd.size()
    if not grads:
        return []
    flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads], 0)
    n = int(flat.shape[0])
    _count_static = int(2 * (size - 1) * n * _itemsize(dtype) // size)
    if dtype == tf.float32:
        reduced = hvd.allreduce(flat, op=hvd.Average, name=f"{name}_allreduce")
    else:
        chunk = -(-n // size)
        padded = tf.pad(flat, [[0, chunk * size - n]])
        received = hvd.alltoall(_to_wire(padded, dtype), name=f"{name}_reduce_scatter")
        mine = tf.reduce_sum(tf.reshape(_from_wire(received, dtype), [size, chunk]), 0) / size
        reduced = _from_wire(hvd.allgather(_to_wire(mine, dtype), name=f"{name}_allgather"), dtype)[:n]
    with tf.control_dependencies([_count(_count_static)]):
        reduced = tf.identity(reduced)
    out, offset = [], 0
    for g in grads:
        count = int(tf.size(g)) if g.shape.num_elements() is None else g.shape.num_elements()
        out.append(tf.cast(tf.reshape(reduced[offset:offset + count], tf.shape(g)), g.dtype))
        offset += count
    return out


def DistributedOptimizer(optimizer, compression="none"):  # noqa: N802 (named like hvd.DistributedOptimizer)
    """Wraps a ttf (or Keras) optimizer for the Horovod shape: apply_gradients averages the
    dense gradients over the ranks (one fused allreduce) and hands ttf table gradients, which
    the sharded lookup has already summed on their owners, to the fused table update.
    Works with model.compile/fit and with tape.gradient + apply_gradients."""
    _check_compression(compression)
    base = type(optimizer)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        dense = [i for i, (g, v) in enumerate(grads_and_vars) if g is not None and embedding_of(v) is None]
        for i in dense:
            if isinstance(grads_and_vars[i][0], tf.IndexedSlices):
                raise TypeError(f"{grads_and_vars[i][1].name} has a sparse gradient: on Horovod, use ttf "
                                "embedding layers for sparse features (or horovod's own DistributedOptimizer)")
        reduced = allreduce_dense([grads_and_vars[i][0] for i in dense], compression)
        for i, g in zip(dense, reduced):
            grads_and_vars[i] = (g, grads_and_vars[i][1])
        return base.apply_gradients(self, grads_and_vars, *args, **kwargs)

    cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__})
    object.__setattr__(optimizer, "__class__", cls)  # same state and config; only apply_gradients changes
    return optimizer


def rank_slice(dataset, batch_size):
    """This rank's slice of each global batch: `dataset` yields global batches of
    batch_size x size (every rank reads the same stream), this rank keeps rows
    [rank * batch_size, (rank + 1) * batch_size) of each, so the ranks together see exactly
    the examples of one process's global batch, in the same steps."""
    start = hvd.rank() * batch_size

    def take(*element):
        return tf.nest.map_structure(lambda t: t[start:start + batch_size], element)

    return dataset.map(take, num_parallel_calls=tf.data.AUTOTUNE)


def gather_rows(array, name):
    """Concatenates a NumPy array's rows over the ranks (rank order), e.g. eval predictions."""
    return hvd.allgather(tf.convert_to_tensor(array), name=name).numpy()


def mean_over_ranks(value, name="ttf_mean"):
    """The average of a scalar tensor over the ranks (e.g. the global batch's loss)."""
    return hvd.allreduce(value, op=hvd.Average, name=name)


def all_ranks(flag, name="ttf_all_ranks"):
    """A boolean scalar that is True only where `flag` is True on every rank (e.g. a step's
    gradients are finite: make_train_step(finite_across=all_ranks))."""
    return tf.cast(hvd.allreduce(tf.cast(flag, tf.int32), op=hvd.Min, name=name), tf.bool)


def check_same_config(config, what="flags"):
    """Raises ValueError naming the ranks whose `config` (a JSON-able dict) differs from rank 0's."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    digests = hvd.allgather_object(digest, name="ttf_check_config")
    configs = None
    if any(d != digests[0] for d in digests):
        configs = hvd.allgather_object(config, name="ttf_check_config_values")
        diffs = []
        for rank, other in enumerate(configs):
            changed = sorted(k for k in set(other) | set(configs[0]) if other.get(k) != configs[0].get(k))
            if changed:
                diffs.append(f"rank {rank} differs from rank 0 in " + ", ".join(
                    f"{k} ({other.get(k)!r} vs {configs[0].get(k)!r})" for k in changed))
        raise ValueError(f"the ranks were started with different {what}: " + "; ".join(diffs))


__all__ = ["COMPRESSIONS", "DistributedOptimizer", "TableSharding", "allreduce_dense", "broadcast_variables",
           "all_ranks", "check_same_config", "gather_rows", "gathered_tables", "mean_over_ranks", "rank_slice", "shard_tables", "table_size",
           "ttf_layers", "wire_bytes"]
