"""Keras layers over ttf tables: DynamicEmbedding (any id shape, ragged with a combiner)
and FusedEmbedding (all fields of a [B, F] batch in one op call)."""
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record

from ttf._ops import ops
from ttf.data._schema import FIELD_SHIFT as _FIELD_SHIFT  # the field tag's place, defined once
from ttf.embedding._logical import EXPORT_FIELDS, LogicalTable, merge_exports, shard_of
from ttf.embedding._table import EmbeddingTable

_VALUE_MASK = (1 << _FIELD_SHIFT) - 1


def embedding_of(variable):
    """The DynamicEmbedding whose table gradient arrives on `variable`, or None."""
    return getattr(variable, "_ttf_embedding", None)


@tf.keras.utils.register_keras_serializable(package="ttf")
class DynamicEmbedding(tf.keras.layers.Layer):
    """An embedding layer over a dynamic hash table: any int64 id gets its own row.

    The table grows on demand during training (no vocabulary, no hash collisions): a new id
    reads its initial row in forward and the ttf optimizer's update stores it (a lookup never
    changes the table, so a skipped step changes nothing); at
    inference (training=False, model.predict, model.evaluate, a SavedModel) unseen ids read
    the default row and never grow it. Train it with a ttf optimizer (ttf.optimizers.Adam,
    ...), which updates only the touched rows and their slots in one fused op per step.

    training=None (a plain `model(x)`) follows a Keras Embedding: inside a recording
    tf.GradientTape the lookup trains (new ids read their initial rows, the row gradient
    reaches the optimizer), outside
    one it is find-only. A frozen layer (trainable=False) is always find-only. A table
    that gets no gradient in a step makes the ttf optimizer warn, naming the table.

    Args:
      dim: embedding width.
      initializer: a new row's values, a pure function of (seed, id): "uniform" (Keras'
        default, uniform(-0.05, 0.05)), "normal", "truncated_normal", "zeros", a
        ttf.embedding.RowInitializer, or a matching tf.keras initializer.
      combiner: None, or "sum" / "mean" to combine ragged (multi-hot) ids per row.
      name: layer name.
      seed: row initialisation seed.
      admission_min_count: an id gets its own row only at its this-many-th training update;
        until then it reads the default row and its gradient is dropped.
      admission_sketch_bytes: > 0: count those sightings in a count-min sketch of this many
        bytes per table shard (fixed memory; see ttf.embedding.EmbeddingTable).
      default_value: the value of every element of the default row.
      shard_devices: devices to shard the table over by id (a parameter-server cluster:
        ["/job:ps/replica:0/task:0", ...]); each step then makes one lookup and one update
        request per shard. None: the parameter servers of a ParameterServerStrategy whose
        scope is open (so no chief holds rows), else one table on the layer's device. A checkpoint holds the
        logical table (every id of every shard), so it restores into any sharding.
      num_shards: lock shards inside each table (parallelism within one process).
      capacity: rows each table shard (one process's: the layer's table, each parameter
        server's or Horovod rank's shard) holds at most after each update, plus that
        update's new ids; 0: unbounded. Rows beyond it are evicted by evict_policy. A size
        with a unit ("512M", "2G", "1.5G") is bytes of rows instead (value, optimizer slots,
        metadata and index entry: ttf.embedding.tier_row_bytes each; not with dram_budget).
      evict_policy: "lru" (least recently updated first), "lfu" (fewest updates first) or
        "ttl" (every id not updated in the last ttl_steps steps; LRU above a capacity). With
        dram_budget, also the order rows move to disk in (lfu: fewest updates first; else
        least recently updated first).
      ttl_steps: steps without an update after which evict_policy="ttl" evicts an id.
      dram_budget, ssd_dir: a DRAM + SSD tier for each table shard: at most dram_budget
        bytes of DRAM rows (an int or a size such as "2G"), the rest in a file under ssd_dir
        (see ttf.embedding.EmbeddingTable and docs/tiers.md); training is exactly that of an
        all-DRAM table.
      rows: how each table stores rows: "fp32", "bf16" or "int8" (see
        ttf.embedding.EmbeddingTable and docs/table_rows.md).

    Input: int64 (or int32) ids of shape [B], [B, F], ..., or a RaggedTensor [B, None]
    (needs a combiner). Output: float32 [..., dim] ([B, dim] for ragged ids).

    Example:
      >>> import ttf, tensorflow as tf
      >>> layer = ttf.DynamicEmbedding(8)
      >>> ids = tf.constant([[3, 1 << 40], [3, -7]], tf.int64)
      >>> with tf.GradientTape() as tape:
      ...     loss = tf.reduce_sum(layer(ids, training=True))
      >>> int(layer.size())  # a lookup inserts nothing
      0
      >>> grads = tape.gradient(loss, layer.trainable_variables)
      >>> _ = ttf.optimizers.Adam(0.01).apply_gradients(zip(grads, layer.trainable_variables))
      >>> int(layer.size())  # the update stored the three ids' rows
      3
    """

    def __init__(self, dim, initializer="uniform", combiner=None, name=None, seed=0, admission_min_count=0,
                 default_value=0.0, shard_devices=None, num_shards=16, capacity=0, evict_policy="lru", ttl_steps=0,
                 dram_budget=0, ssd_dir="", admission_sketch_bytes=0, rows="fp32", **kwargs):
        kwargs.setdefault("dtype", "float32")  # rows are float32 whatever the model's precision
        super().__init__(name=name, **kwargs)
        self.supports_jit = False  # Keras 3's jit_compile="auto": the table ops have no XLA kernels
        if combiner not in (None, "sum", "mean"):
            raise ValueError(f"combiner must be None, 'sum' or 'mean', got {combiner!r}")
        if shard_devices is not None and not shard_devices:
            raise ValueError("shard_devices must be None or a non-empty list of device strings")
        if shard_devices is None:
            shard_devices = _parameter_server_devices()
        self.dim = dim
        self.combiner = combiner
        self.tables = [
            EmbeddingTable(dim, initializer, seed, default_value, admission_min_count, num_shards,
                           name=f"{self.name}_shard{i}", device=device, capacity=capacity,
                           evict_policy=evict_policy, ttl_steps=ttl_steps, dram_budget=dram_budget, ssd_dir=ssd_dir,
                           admission_sketch_bytes=admission_sketch_bytes, rows=rows)
            for i, device in enumerate(shard_devices or [""])
        ]
        # None, or an object whose lookup(layer, keys, row_splits, training) replaces the
        # local lookup: ttf.distribute.horovod.shard_tables sets one that makes this table one
        # rank's shard of a table spread over the Horovod ranks. Its export_table(layer) and
        # import_table(layer, tensors) then carry the checkpoint (see export_table).
        self.sharding = None
        self.logical_table = LogicalTable(self)  # the checkpoint entry (not the shards)
        self._serving_table = None  # set by ttf.export_for_serving while it traces

    def build(self, input_shape):
        # The anchor carries the table gradient: lookups feed it to a custom gradient that
        # returns IndexedSlices(row gradients, ids), so tape.gradient / model.fit hand the
        # optimizer a (gradient, variable) pair like any other weight. Its value is unused.
        self.anchor = self.add_weight(name="table_anchor", shape=[], initializer="zeros", trainable=True)
        self.anchor._ttf_embedding = self
        super().build(input_shape)

    def call(self, ids, training=None):
        keys, row_splits = self.keys_of(ids)
        return self._lookup(keys, row_splits, self.trains(training))

    def trains(self, training):
        """Whether a call with this `training` argument trains the table (new ids read their
        initial rows and the row gradient reaches the optimizer, whose update inserts them): training=None as a Keras Embedding does, inside a
        recording tape; never for a frozen layer (trainable=False)."""
        return _static_bool(training) and self.trainable

    def keys_of(self, ids):
        """The table keys of a call's ids -> (keys, row_splits): the flat ids and their
        row_splits for ragged ids, else the (tagged) ids in their shape and None."""
        if isinstance(ids, tf.SparseTensor):
            ids = tf.RaggedTensor.from_sparse(ids)
        if isinstance(ids, tf.RaggedTensor):
            if self.combiner is None:
                raise ValueError(f"{self.name}: ragged ids need combiner='sum' or 'mean'")
            if ids.ragged_rank != 1 or ids.shape.rank != 2:
                raise ValueError(f"{self.name}: ragged ids must have shape [B, None], got {ids.shape}")
            return _as_keys(ids.values, self.name), ids.row_splits
        ids = _as_keys(tf.convert_to_tensor(ids), self.name)
        if ids.shape.rank == 0:
            raise ValueError(f"{self.name}: ids must have rank >= 1, got a scalar")
        return self._tag(ids), None

    def _tag(self, ids):
        return ids

    def size(self):
        """The number of ids holding a row (int64 scalar tensor)."""
        return tf.add_n([t.size() for t in self.tables])

    def evict(self, before_step=None, min_count=None):
        """Removes ids last trained before step `before_step`, or updated in fewer than
        `min_count` training steps. Returns the number of rows removed."""
        if before_step is None and min_count is None:
            raise ValueError("evict needs before_step and/or min_count")
        min_last_seen = -(1 << 63) if before_step is None else before_step
        return tf.add_n([t.evict(min_last_seen, min_count or 0) for t in self.tables])

    # -- lookup and gradient

    def _lookup(self, keys, row_splits, training):
        if self._serving_table is not None and not training:  # ttf.export_for_serving is tracing
            return self._combine(self._serving_table.lookup(tf.reshape(keys, [-1])), keys, row_splits)
        if self.sharding is not None:
            return self.sharding.lookup(self, keys, row_splits, training)
        if not training:
            return self._forward(keys, row_splits, training=False)[0]
        if not self.built:
            self.build(None)

        @tf.custom_gradient
        def lookup(anchor):
            del anchor  # only connects the tape to the layer's anchor variable
            embeddings, unique_keys, inverse = self._forward(keys, row_splits, training=True)

            def grad(upstream):
                per_key = self._per_key_gradient(upstream, row_splits)
                return tf.IndexedSlices(ops().ttf_embedding_grad(per_key, inverse, unique_keys), unique_keys)

            return embeddings, grad

        return lookup(tf.convert_to_tensor(self.anchor))

    def _per_key_gradient(self, upstream, row_splits):
        """The gradient of each looked-up id: upstream itself for dense ids; for ragged
        ids, one row per id of each bag, scaled by 1/length for the mean combiner."""
        if row_splits is None:
            return upstream
        row_ids = tf.ragged.row_splits_to_segment_ids(row_splits)
        per_key = tf.gather(upstream, row_ids)
        if self.combiner == "mean":
            lengths = tf.cast(tf.maximum(row_splits[1:] - row_splits[:-1], 1), tf.float32)
            per_key *= tf.gather(1.0 / lengths, row_ids)[:, None]
        return per_key

    def _forward(self, keys, row_splits, training):
        """-> embeddings, unique_keys, inverse_index (embeddings = rows[unique_keys][inverse])."""
        if len(self.tables) == 1:
            table = self.tables[0]
            if row_splits is None:
                return ops().ttf_embedding_lookup(table.resource_handle, keys, dim=self.dim, training=training)
            return ops().ttf_embedding_lookup_ragged(table.resource_handle, keys, row_splits, dim=self.dim,
                                                     training=training, combiner=self.combiner)
        # Sharded over devices: de-duplicate here, so each shard gets one request of unique ids.
        flat = tf.reshape(keys, [-1])
        unique_keys, inverse = tf.unique(flat, out_idx=tf.int32)
        parts, positions = self._partition(unique_keys)
        rows = [t.lookup(p, training) for t, p in zip(self.tables, parts)]
        per_key = tf.gather(tf.dynamic_stitch(positions, rows), inverse)
        return self._combine(per_key, keys, row_splits), unique_keys, inverse

    def _combine(self, per_key, keys, row_splits):
        """Rows of the flattened keys [N, dim] -> [..., dim] in keys' shape, or one combined row per bag."""
        if row_splits is None:
            return tf.reshape(per_key, tf.concat([tf.shape(keys), [self.dim]], 0))
        row_ids = tf.ragged.row_splits_to_segment_ids(row_splits)
        bags = tf.shape(row_splits)[0] - 1
        combine = tf.math.unsorted_segment_sum if self.combiner == "sum" else tf.math.unsorted_segment_mean
        # [N, dim] stated: rows fetched through a routing traced with unknown sizes (a pipelined
        # step) would give bags of unknown width, and every layer after them unknown shapes.
        return combine(tf.reshape(per_key, [-1, self.dim]), row_ids, bags)

    def _partition(self, keys):
        """Splits keys by shard (shard_of) -> (keys per shard, their positions)."""
        n = len(self.tables)
        shard = shard_of(keys, n)
        return (tf.dynamic_partition(keys, shard, n),
                tf.dynamic_partition(tf.range(tf.size(keys)), shard, n))

    def apply_gradient(self, gradient, apply_fn):
        """Runs apply_fn(table, keys, rows) on each shard for an IndexedSlices gradient
        (rows [N, dim] for keys [N]); used by ttf.optimizers. Returns the update ops."""
        keys = tf.cast(gradient.indices, tf.int64)
        rows = tf.convert_to_tensor(gradient.values)
        if len(self.tables) == 1:
            return [apply_fn(self.tables[0], keys, rows)]
        key_parts, positions = self._partition(keys)
        updates = []
        for table, part, pos in zip(self.tables, key_parts, positions):
            with tf.device(table._resource_device):
                updates.append(apply_fn(table, part, tf.gather(rows, pos)))
        return updates

    # -- checkpoints: the logical table (see ttf/embedding/_logical.py)

    def export_table(self, since_step=None, reset_deleted=False):
        """The logical table: every id of every shard with its row, optimizer slots and
        counters, as one dict of tensors (the fields of EmbeddingTable.export). A
        checkpoint saves this. since_step / reset_deleted: a delta, see
        EmbeddingTable.export. Override it (with import_table and reset_deleted) for
        shards that live in other processes, e.g. gather them on Horovod."""
        if self.sharding is not None:  # shards on other ranks: the sharding gathers them (a collective)
            return self.sharding.export_table(self, since_step, reset_deleted)
        return merge_exports([t.export(since_step, reset_deleted) for t in self.tables], self.dim)

    def import_table(self, tensors):
        """Loads a logical table written by any topology (one process, N shards, N ranks):
        each shard takes the ids shard_of routes to it, so each id lands where its lookup
        goes. A full export replaces the content; a delta (with deleted_keys) is applied on
        top of it. A checkpoint restore calls this."""
        if self.sharding is not None:  # this rank keeps the ids it owns
            return self.sharding.import_table(self, tensors)
        n = len(self.tables)
        return tf.group(*[table.restore(tensors, n, i) for i, table in enumerate(self.tables)])

    def reset_deleted(self):
        """Clears and (re)starts every shard's record of deleted ids (delta checkpoints)."""
        return tf.group(*[table.reset_deleted() for table in self.tables])

    def commit_save(self):
        """A checkpoint save is durable: every shard forgets the deleted ids the save took
        (those deleted after its shard was copied stay for the next delta)."""
        return tf.group(*[table.commit_save() for table in self.tables])

    # -- .keras files (tf_keras saving_lib): the anchor plus the logical table, like a checkpoint

    def save_own_variables(self, store):
        super().save_own_variables(store)
        for field, value in self.export_table().items():
            value = value.numpy()
            if field == "optimizer":  # its UTF-8 bytes: Keras 3's weights store refuses string arrays
                value = np.frombuffer(value, np.uint8)
            store[f"table_{field}"] = value

    def load_own_variables(self, store):
        names = list(store.keys())
        super().load_own_variables({k: store[k] for k in names if not k.startswith("table")})
        if any(k.startswith("table_") for k in names):
            exported = _exported_from_store(store, "table_")
        else:  # a file written before the logical table (ttf <= 0.1): one entry per shard, table{i}_
            shards = sorted({k[len("table"):].split("_", 1)[0] for k in names if k.startswith("table")})
            if not shards:
                raise ValueError(f"{self.name}: the file holds no table for this layer (saved without its rows?)")
            exported = merge_exports([_exported_from_store(store, f"table{i}_") for i in shards], self.dim)
        self.import_table(exported)

    def get_config(self):
        table = self.tables[0]
        config = super().get_config()
        config.update(dim=self.dim, combiner=self.combiner, seed=table.seed,
                      admission_min_count=table.admission_min_count, default_value=table.default_value,
                      initializer=table.initializer.get_config(), num_shards=table.num_shards,
                      capacity=table.capacity, evict_policy=table.evict_policy, ttl_steps=table.ttl_steps,
                      dram_budget=table.dram_budget, ssd_dir=table.ssd_dir,
                      admission_sketch_bytes=table.admission_sketch_bytes, rows=table.rows)
        return config


@tf.keras.utils.register_keras_serializable(package="ttf")
class FusedEmbedding(DynamicEmbedding):
    """All F sparse fields of a batch in one table and one op call: ids [B, F] -> [B, F, dim].

    One fused lookup de-duplicates the B x F ids, probes the table once per unique id and
    scatters the rows back; one fused optimizer op updates them. Fields share the table, so
    ids must not collide across fields: ttf.data's Criteo reader tags each key with its
    field already; for raw per-field ids pass tag_fields=True, which puts the field index
    in the top 8 bits of each id (ids must then fit in 56 bits).

    Args: as DynamicEmbedding, plus num_fields (F, checked against the input) and
    tag_fields. Example:
      >>> import ttf, tensorflow as tf
      >>> layer = ttf.FusedEmbedding(16, num_fields=3, tag_fields=True)
      >>> ids = tf.constant([[1, 1, 1], [2, 1, 5]], tf.int64)
      >>> with tf.GradientTape() as tape:
      ...     loss = tf.reduce_sum(layer(ids, training=True))
      >>> grads = tape.gradient(loss, layer.trainable_variables)
      >>> _ = ttf.optimizers.SGD(0.1).apply_gradients(zip(grads, layer.trainable_variables))
      >>> int(layer.size())  # id 1 in three fields is three keys
      5
    """

    def __init__(self, dim, num_fields, tag_fields=False, **kwargs):
        if kwargs.get("combiner") is not None:
            raise ValueError("FusedEmbedding takes one id per field; use DynamicEmbedding for ragged ids")
        if not 0 < num_fields <= 256:
            raise ValueError(f"num_fields must be in [1, 256], got {num_fields}")
        super().__init__(dim, **kwargs)
        self.num_fields = num_fields
        self.tag_fields = tag_fields

    def keys_of(self, ids):
        if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"{self.name}: FusedEmbedding takes dense ids [B, {self.num_fields}]")
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank != 2 or ids.shape[1] not in (None, self.num_fields):
            raise ValueError(f"{self.name}: ids must have shape [B, {self.num_fields}], got {ids.shape}")
        return super().keys_of(ids)

    def _tag(self, ids):
        if not self.tag_fields:
            return ids
        # The field goes in the top 8 bits: an id outside [0, 2**56) would lose bits to it
        # and silently share a row with another id.
        in_range = tf.reduce_all((ids >= 0) & (ids <= _VALUE_MASK))
        message = tf.strings.format(
            f"{self.name}: with tag_fields=True ids must be in [0, 2**56) (the field takes the top 8 bits); "
            "got min {} and max {}", (tf.reduce_min(ids), tf.reduce_max(ids)))
        with tf.control_dependencies([tf.debugging.Assert(in_range, [message])]):
            ids = tf.identity(ids)
        fields = tf.constant([f << _FIELD_SHIFT for f in range(self.num_fields)], tf.int64)
        return tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(ids, _VALUE_MASK), fields[None, :])

    def get_config(self):
        config = super().get_config()
        config.update(num_fields=self.num_fields, tag_fields=self.tag_fields)
        return config


def _as_keys(ids, layer_name):
    if ids.dtype == tf.int64:
        return ids
    if ids.dtype == tf.int32:
        return tf.cast(ids, tf.int64)
    raise TypeError(f"{layer_name}: ids must be int64 or int32, got {ids.dtype.name}")


def _static_bool(training):
    if training is None:  # as a Keras Embedding: it trains wherever a tape records it
        return record.could_possibly_record()
    value = tf.get_static_value(training)
    if value is None:
        raise ValueError("training must be a Python bool or a constant; ttf picks the lookup op at trace time")
    return bool(value)


def _exported_from_store(store, prefix):
    """The export dict saved under `prefix` in a .keras weights store."""
    exported = {k[len(prefix):]: np.asarray(store[k]) for k in store.keys() if k.startswith(prefix)}
    missing = set(EXPORT_FIELDS) - set(exported)
    if missing:
        raise ValueError(f"the .keras file's table entry {prefix}* lacks {sorted(missing)}: not written by ttf?")
    optimizer = exported["optimizer"]
    if optimizer.dtype == np.uint8:  # UTF-8 bytes (ttf writes these since Keras 3 support)
        exported["optimizer"] = optimizer.tobytes().decode()
    else:  # a string scalar (.keras files of earlier tf_keras versions of ttf)
        optimizer = optimizer.item()
        exported["optimizer"] = optimizer.decode() if isinstance(optimizer, bytes) else optimizer
    return exported


def _parameter_server_devices():
    """The ps tasks of the ParameterServerStrategy whose scope is open, or None."""
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return None
    resolver = strategy.cluster_resolver or strategy._cluster_resolver  # pylint: disable=protected-access
    num_ps = resolver.cluster_spec().num_tasks("ps")
    return [f"/job:ps/replica:0/task:{i}" for i in range(num_ps)] or None


def tables_in(model):
    """The ttf embedding layers inside a Keras model or layer (nested models included), in
    a fixed order: the one way ttf finds a model's tables (save, export, Horovod, compile)."""
    layers = model._flatten_layers(include_self=True, recursive=True)  # pylint: disable=protected-access
    return [layer for layer in layers if isinstance(layer, DynamicEmbedding)]
