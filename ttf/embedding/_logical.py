"""The logical table of a sharded embedding: what a checkpoint holds, whatever the topology.

A DynamicEmbedding keeps its rows in one or more EmbeddingTables (one per parameter server
with shard_devices, one per rank on Horovod); key k lives in shard `shard_of(k, n)`. A
checkpoint stores the union of the shards, keyed by key, never by shard position, and a
restore sends each key to the shard its lookup uses. So one process, N parameter servers
and N Horovod ranks restore each other's checkpoints.

The hook for a new topology is the pair of DynamicEmbedding methods the checkpoint calls:
`export_table()` (the logical table as one dict of tensors) and `import_table(tensors)`
(route every key to its shard). A layer whose shards live in other processes (Horovod:
rank r holds shard r of size n) overrides them: export gathers the shards (an allgather of
`merge_exports`' inputs), import keeps its own part with
`table.restore(tensors, num_partitions=n, partition=r)` (the Import op takes only those
keys, reading the input in place). Delta checkpoints (ttf.checkpoint) go through the same
two methods: `export_table(since_step=S)` adds `deleted_keys`, and import_table applies
such a delta on top of the current content; plus `reset_deleted()`.
"""
import weakref

import tensorflow as tf

# The fields of an export, in TtfTableExport's output order.
EXPORT_FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")


def shard_of(keys, num_shards):
    """The shard of each key: int32 floormod(key, num_shards), in [0, num_shards).

    The one routing rule of ttf: parameter-server sharding, Horovod ownership and
    checkpoint restore all use it, so a key is always found where it was put.

    Example:
      >>> import ttf, tensorflow as tf
      >>> ttf.embedding.shard_of(tf.constant([0, 5, -1, 1 << 40], tf.int64), 3).numpy()
      array([0, 2, 2, 1], dtype=int32)
    """
    return tf.cast(tf.math.floormod(keys, tf.cast(num_shards, tf.int64)), tf.int32)


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
    """The checkpoint entry of a DynamicEmbedding: its logical table (every key of every
    shard, under `.../logical_table/.ATTRIBUTES/<field>`). Saving calls the layer's
    export_table(), restoring its import_table(). `mode` (set by ttf.checkpoint while it
    writes or reads a delta checkpoint) replaces both. `saved_step` is the table step of
    the last eager save or restore (where the next delta starts)."""

    def __init__(self, layer):
        self._layer = weakref.ref(layer)  # the layer tracks this object, not the reverse
        self.mode = None
        self.saved_step = None
        self.restored = False  # set when a checkpoint restore reaches this entry

    @property
    def layer(self):
        return self._layer()

    def _serialize_to_tensors(self):
        tensors = self.mode.serialize(self) if self.mode is not None else self.layer.export_table()
        self._note_step(tensors)
        return tensors

    def _restore_from_tensors(self, restored_tensors):
        if self.mode is not None:
            restored = self.mode.restore(self, restored_tensors)
        else:
            restored = self.layer.import_table(restored_tensors)
        self.restored = True
        self._note_step(restored_tensors)
        return restored

    def _note_step(self, tensors):
        step = tensors.get("step", tensors.get("delta_step"))
        if isinstance(step, tf.Tensor) and hasattr(step, "numpy"):  # eager: a checkpoint, not a trace
            self.saved_step = int(step.numpy())

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        # tf.saved_model.save writes the checkpoint from a graph holding copies of the tables.
        if getattr(self.layer, "sharding", None) is not None:  # Horovod: this rank holds 1/N of the ids
            raise ValueError(
                f"tf.saved_model.save of {self.layer.name}, a table sharded over Horovod ranks, would write this "
                "rank's ids only. For serving, call ttf.distribute.horovod.export_for_serving(model, path) on every "
                "rank (the whole table, written once by rank 0); for a checkpoint, a CheckpointManager save inside "
                "ttf.distribute.horovod.gathered_tables(model) on every rank.")
        object_map[self] = _SavedModelLogicalTable(self._layer(), object_map)
        return []


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
