"""The logical table of a sharded embedding: what a checkpoint holds, whatever the topology.

A DynamicEmbedding keeps its rows in one or more EmbeddingTables (one per parameter server
with shard_devices, one per rank on Horovod); key k lives in shard `shard_of(k, n)`. A
checkpoint stores the union of the shards, keyed by key, never by shard position, and a
restore sends each key to the shard its lookup uses. So one process, N parameter servers
and N Horovod ranks restore each other's checkpoints.

A checkpoint is written and read shard by shard where the rows live (ttf/checkpoint/_format.py;
on Horovod each rank writes its own shard: ttf.distribute.horovod.save_checkpoint). The
whole-table path (tf.saved_model.save, .keras files, serving export) goes through the pair of
DynamicEmbedding methods `export_table()` (the logical table as one dict of tensors) and
`import_table(tensors)` (route every key to its shard). A layer whose shards live in other
processes (Horovod: rank r holds shard r of size n) overrides them: export gathers the shards
(an allgather of `merge_exports`' inputs), import keeps its own part with
`table.restore(tensors, num_partitions=n, partition=r)` (the Import op takes only those
keys, reading the input in place). Delta checkpoints (ttf.checkpoint) go through the same
two methods: `export_table(since_step=S)` adds `deleted_keys`, and import_table applies
such a delta on top of the current content; plus `reset_deleted()`.
"""
import warnings
import weakref

import tensorflow as tf

# The fields of an export, in TtfTableExport's output order.
EXPORT_FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")


# SplitMix64's finaliser (Steele et al., 2014), the same as C++ Mix64 in ops/kernels/table_hash.h.
_MIX_ADD, _MIX_MUL1, _MIX_MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix64(keys):
    """SplitMix64's finaliser of int64 keys, as uint64 (stock TF ops, wrapping arithmetic)."""
    bits = tf.bitwise

    def xor_shift(x, n):
        return bits.bitwise_xor(x, bits.right_shift(x, tf.constant(n, tf.uint64)))

    x = tf.bitcast(tf.convert_to_tensor(keys, tf.int64), tf.uint64) + tf.constant(_MIX_ADD, tf.uint64)
    x = xor_shift(x, 30) * tf.constant(_MIX_MUL1, tf.uint64)
    x = xor_shift(x, 27) * tf.constant(_MIX_MUL2, tf.uint64)
    return xor_shift(x, 31)


def shard_of(keys, num_shards):
    """The shard of each key: int32 in [0, num_shards), the low 32 bits of the key's
    SplitMix64 hash mod num_shards.

    The one routing rule of ttf: parameter-server sharding, Horovod ownership and
    checkpoint restore (the C++ import's PartitionOf) all use it, so a key is always found
    where it was put. A mixing hash spreads any id distribution evenly (ids that are all
    multiples of num_shards, field-tagged ids). Routing is never stored in a checkpoint:
    one written with another rule (the plain floormod of earlier versions) restores.
    The C++ table's internal lock shard uses bits 40..63 of the same hash: no correlation.

    Example:
      >>> import ttf, tensorflow as tf
      >>> ttf.embedding.shard_of(tf.constant([0, 5, -1, 1 << 40], tf.int64), 3).numpy()
      array([1, 0, 0, 0], dtype=int32)
    """
    low = tf.bitcast(tf.bitwise.bitwise_and(mix64(keys), tf.constant(0xFFFFFFFF, tf.uint64)), tf.int64)
    return tf.cast(tf.math.floormod(low, tf.cast(num_shards, tf.int64)), tf.int32)


def table_summary(*summaries_or_layers):
    """(size, checksum, value_sum) of the tables of the given layers (their shards in this
    process), each shard's numbers computed on its own device by TtfTableSummary, so only
    numbers travel; or the sum of such triples (e.g. gathered from Horovod ranks). size:
    keys holding a row; checksum: int, an order-independent hash of every key, row, slot,
    count, last-seen step and candidate, equal for tables holding the same rows bit for
    bit whatever their sharding; value_sum: float64 sum of every stored float (approximate:
    its rounding depends on the order). Eager only.

    Example:
      >>> import ttf, tensorflow as tf
      >>> layer = ttf.DynamicEmbedding(4, shard_devices=["/cpu:0"] * 2)
      >>> _ = layer(tf.constant([1, 2, 3], tf.int64), training=True)
      >>> ttf.embedding.table_summary(layer)[0]
      3
    """
    from ttf._ops import ops  # pylint: disable=import-outside-toplevel  (the op library loads lazily)

    size, checksum, value_sum = 0, 0, 0.0
    for item in summaries_or_layers:
        if isinstance(item, tuple):
            triples = [item]
        else:
            triples = []
            for table in item.tables:
                with tf.device(table._resource_device):  # pylint: disable=protected-access
                    triples.append(tuple(t.numpy() for t in ops().ttf_table_summary(table.resource_handle)))
        for shard_size, shard_checksum, shard_sum in triples:
            size += int(shard_size)
            checksum = (checksum + int(shard_checksum)) % (1 << 64)  # the shards' wrapping sum
            value_sum += float(shard_sum)
    return size, checksum - (1 << 64) if checksum >= 1 << 63 else checksum, value_sum


def merge_exports(exports, dim):
    """One logical export (dict of EXPORT_FIELDS) from the exports of a layer's shards.

    Keys, rows and candidates are concatenated; the step is the largest. A shard that was
    never trained has rows without optimizer slots: they get the slots' initial values, as
    the optimizer would give them on the first update. Works eagerly and in a graph.
    """
    if len(exports) == 1:
        return dict(exports[0])
    strides = tf.stack([tf.shape(e["values"])[1] for e in exports])
    stride = tf.reduce_max(strides)
    owner = tf.argmax(strides)  # a shard holding the slots, if any does
    slot_init = tf.concat([e["slot_init"] for e in exports], 0)[: stride // dim - 1]
    slot_row = tf.repeat(slot_init, dim)  # [S * dim]: slot j of a row starts at slot_init[j]
    values = []
    for e in exports:
        v = e["values"]
        missing = stride - tf.shape(v)[1]  # 0, or S * dim for a shard without slots
        values.append(tf.concat([v, tf.tile(slot_row[None, :missing], [tf.shape(v)[0], 1])], 1))
    return {
        "keys": tf.concat([e["keys"] for e in exports], 0),
        "values": tf.concat(values, 0),
        "meta": tf.concat([e["meta"] for e in exports], 0),
        "candidate_keys": tf.concat([e["candidate_keys"] for e in exports], 0),
        "candidate_meta": tf.concat([e["candidate_meta"] for e in exports], 0),
        "optimizer": tf.gather(tf.stack([e["optimizer"] for e in exports]), owner),
        "slot_init": slot_init,
        "step": tf.reduce_max(tf.stack([e["step"] for e in exports])),
        **({"deleted_keys": tf.concat([e["deleted_keys"] for e in exports], 0)} if "deleted_keys" in exports[0] else {}),
    }


class LogicalTable(tf.__internal__.tracking.Trackable):
    """The checkpoint entry of a DynamicEmbedding: its logical table, written shard by shard.

    A registered checkpoint saver (below) writes it: each table shard's rows are exported
    and written by the process holding them, in pieces of at most PIECE_BYTES, under
    `<object>/ttf/src-<i>/part-<k>/<field>` (see the format in docs/checkpoints.md). A
    restore streams the pieces into each new shard, which keeps the keys shard_of routes to
    it: no process ever holds another's rows, and any topology restores any other's
    checkpoint. A checkpoint of the earlier format (`.../logical_table/.ATTRIBUTES/<field>`,
    the whole table in one entry) still restores.

    `mode` (set by ttf.checkpoint's CheckpointManager while it writes or reads a checkpoint)
    is that save's or restore's state: full or delta, where a delta starts, the parts every
    rank wrote, and the table steps written or read (the manager keeps them once the save
    is durable)."""

    def __init__(self, layer):
        self._layer = weakref.ref(layer)  # the layer tracks this object, not the reverse
        self.mode = None
        self.restored = False  # set when a checkpoint restore reaches this entry
        self.saved_model_save = False  # inside tf.saved_model.save: the whole-table entry, once

    @property
    def layer(self):
        return self._layer()

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        # tf.saved_model.save writes the checkpoint from a graph holding copies of the tables,
        # and its variables/ checkpoint holds the whole-table entry: the loaded model restores
        # it with _SavedModelLogicalTable's traced restore function, without ttf's Python.
        if getattr(self.layer, "sharding", None) is not None:  # Horovod: this rank holds 1/N of the ids
            raise ValueError(
                f"tf.saved_model.save of {self.layer.name}, a table sharded over ranks, would write this "
                "rank's ids only. For serving, call ttf.distribute.sync.export_for_serving(model, path, collectives) on every "
                "rank (the whole table, written once by rank 0); for a checkpoint, "
                "ttf.distribute.sync.save_checkpoint(manager, step, collectives) on every rank (each writes its part).")
        # Keras 3's model.export() and tf.saved_model.save come here; ttf.export_for_serving
        # freezes the tables into stock ops and never does.
        warnings.warn(SAVED_MODEL_NEEDS_TTF, UserWarning, stacklevel=2)
        object_map[self] = _SavedModelLogicalTable(self._layer(), object_map)
        self.saved_model_save = True
        return []

    def _serialize_to_tensors(self):
        # Only tf.saved_model.save's checkpoint comes here (see ttf/checkpoint/_format.py).
        self.saved_model_save = False
        return self.layer.export_table()

    def _restore_from_tensors(self, restored_tensors):
        self.restored = True
        return self.layer.import_table(restored_tensors)


SAVED_MODEL_NEEDS_TTF = (
    "ttf: this SavedModel holds ttf tables, so only a process that imports ttf can load it (TF Serving and stock "
    "TensorFlow refuse it: Op type not registered 'TtfTable...'); to serve the model, write it with "
    "ttf.export_for_serving(model, base)")


class _SavedModelLogicalTable(tf.__internal__.tracking.Trackable):
    """LogicalTable inside tf.saved_model.save's graph: the layer's shards as mapped there."""

    def __init__(self, layer, object_map):
        self._dim, self._shards, self._object_map = layer.dim, list(layer.tables), object_map

    def _tables(self):
        return [self._object_map.get(t, t) for t in self._shards]

    def _serialize_to_tensors(self):
        return merge_exports([t.export() for t in self._tables()], self._dim)

    def _restore_from_tensors(self, restored_tensors):
        tables = self._tables()
        return tf.group(*[t.restore(restored_tensors, len(tables), i) for i, t in enumerate(tables)])
