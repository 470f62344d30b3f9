"""The frozen tables of a serving export: each ttf table as a bucketed hash table in plain
tensors (HashedTable, one HashedShard per trainer shard, keys routed by the trainer's own
rule, ttf.embedding.shard_of), built from each shard's export on the device holding it; and
the serving rows' precisions (float32, float16, row-wise int8)."""
import numpy as np
import tensorflow as tf

from ttf.embedding._logical import mix64, shard_of


def bucket_hash(keys):
    """int64 keys [K] -> uint64 [K]: the high 32 bits of the key's SplitMix64 hash (stock TF ops).

    The trainer's shard_of takes the low 32 bits, so within one shard the buckets stay evenly
    filled (the two never correlate), whatever bits the ids share.
    """
    return tf.bitwise.right_shift(mix64(keys), tf.constant(32, tf.uint64))


def overlay_key(keys):
    """int64 keys -> the int64 keys the overlay's DenseHashTable holds: their SplitMix64 hash, a
    bijection (exact: no two keys share one). The table hashes an int64 as itself, and ttf's
    keys of one id in different fields differ in their high bits only, so unmixed they started
    at one bucket and probed one chain: a delta's apply and each prediction's overlay lookup
    spent most of their time probing (a profile of the follower: DenseHashTable Find and Insert
    23% of its CPU)."""
    return tf.bitcast(mix64(keys), tf.int64)


ROWS_PER_COPY = 1 << 20  # rows gathered per slice while a HashedShard is built
ROW_DTYPES = (tf.float32, tf.float16, tf.int8)  # the serving rows' precisions


def check_row_dtype(row_dtype, owner):
    """row_dtype as a tf.DType, or a one-line ValueError naming `owner` and the choices."""
    try:
        dtype = tf.as_dtype(row_dtype)
    except TypeError:
        dtype = None
    if dtype not in ROW_DTYPES:
        raise ValueError(f"{owner}: row_dtype must be tf.float32, tf.float16 or tf.int8, got {row_dtype!r}")
    return dtype


def quantize_rows(rows):
    """float rows [K, dim] -> (int8 [K, dim], scale_bias float32 [K, 2]): row-wise affine int8
    from each row's min and max (FBGEMM's row-wise 8-bit rows, shifted to int8), stock TF ops.

    scale = (max - min) / 255, q = round((row - min) / scale) - 128, bias = min + 128 * scale, so
    q * scale + bias is within scale / 2 of each element (a constant row: scale 0, exact).
    """
    rows = tf.cast(rows, tf.float32)
    low = tf.reduce_min(rows, axis=1, keepdims=True)
    scale = (tf.reduce_max(rows, axis=1, keepdims=True) - low) / 255.0
    steps = tf.round(tf.math.divide_no_nan(rows - low, scale))  # 0..255; 0 where scale is 0
    quantized = tf.cast(tf.clip_by_value(steps - 128.0, -128.0, 127.0), tf.int8)
    return quantized, tf.concat([scale, low + 128.0 * scale], 1)


def dequantize_rows(quantized, scale_bias):
    """int8 [K, dim], float32 [K, 2] -> float32 [K, dim]: q * scale + bias (a cast and a multiply-add)."""
    return tf.cast(quantized, tf.float32) * scale_bias[:, :1] + scale_bias[:, 1:]


SCALE_BIAS_BYTES = 8  # an int8 row's float32 scale and bias, stored after its codes


def pack_rows(quantized, scale_bias):
    """int8 [K, dim], float32 [K, 2] -> int8 [K, dim + 8]: each row's codes, then the bytes of
    its scale and bias (little-endian, as the hosts TF runs on), so a lookup gathers one row,
    not a row and a scale (FBGEMM's fused row-wise layout): at 10M keys the second random
    gather cost more than the dequantization."""
    return tf.concat([quantized, tf.reshape(tf.bitcast(scale_bias, tf.int8), [-1, SCALE_BIAS_BYTES])], 1)


def split_packed(packed, dim):
    """int8 [K, dim + 8] (pack_rows) -> (int8 codes [K, dim], float32 scale_bias [K, 2])."""
    return packed[:, :dim], tf.bitcast(tf.reshape(packed[:, dim:], [-1, 2, 4]), tf.float32)


def unpack_rows(packed, dim):
    """int8 [K, dim + 8] (pack_rows) -> float32 [K, dim]."""
    return dequantize_rows(*split_packed(packed, dim))


def serving_rows(table, exported, dtype):
    """The rows of `exported` (table.export(..., stored_values=dtype == tf.int8 and
    table.rows == "int8")) as `dtype` will hold them: an int8 table's own rows packed as they
    are (its codes, scale and bias are the serving layout: no round trip through float32);
    otherwise the float rows [N, dim] (the value, no optimizer slots)."""
    if stored_int8(table, dtype):
        return table.stored_rows(exported["values"])
    return exported["values"][:, :table.dim]


def stored_int8(table, dtype):
    """True when `table`'s rows go to int8 serving rows as they are stored (int8 training rows)."""
    return dtype == tf.int8 and table.rows == "int8"


class HashedShard(tf.Module):
    """One shard of a frozen table: a bucketed hash table in plain tensors.

    Buckets (a power of two, at least the key count) are `bucket_hash(key) & (buckets - 1)`.
    keys int64 [N + 1] (the held keys, then one padding key) and rows [N + 1, dim] (float32,
    float16, or int8 [N + 1, dim + 8]: pack_rows of quantize_rows; the last row is the
    default row) are ordered by bucket; offsets [buckets + 1]
    (int32 below 2^31 keys, else int64) say where each bucket starts. A lookup compares each
    id with the first two keys of its bucket, then, for the ids not found there whose bucket
    holds more, the bucket's other slots (up to `probe`, the largest bucket's size) in one
    vectorised gather: no search, no loop, no custom op.
    """

    def __init__(self, keys, rows, default_row, dtype=tf.float32, name=None, layout=None):
        super().__init__(name=name)
        if layout is not None:  # a shard another process writes (ttf.distribute.horovod.export_for_serving)
            self._placeholder(layout, dtype)
            return
        count = tf.size(keys, out_type=tf.int64)
        buckets = 1 << max(0, int(count.numpy() - 1).bit_length())  # >= count: ~1 key per bucket
        bucket = tf.cast(tf.bitwise.bitwise_and(bucket_hash(keys), tf.constant(buckets - 1, tf.uint64)), tf.int64)
        order = tf.argsort(bucket, stable=True)
        sizes = tf.math.unsorted_segment_sum(tf.ones_like(bucket), bucket, buckets)
        self.probe = max(1, int(tf.reduce_max(sizes).numpy()))
        self.buckets = buckets
        # One padding key at the end: a probe past a bucket reads it, never outside the array.
        self.keys = tf.Variable(tf.concat([tf.gather(keys, order), [0]], 0), trainable=False, name="keys")
        offsets = tf.concat([[0], tf.cumsum(sizes)], 0)
        # int32 offsets where they fit (4 bytes per bucket instead of 8).
        offsets = tf.cast(offsets, tf.int32) if int(count.numpy()) < (1 << 31) - 1 else offsets
        self.offsets = tf.Variable(offsets, trainable=False, name="offsets")
        del bucket, sizes, offsets  # the build's temporaries, freed before the rows' copy
        # The rows in bucket order, copied in bounded slices into the variable: the build holds
        # the input rows and one copy, never a gathered copy and a concatenated one besides.
        held = int(count.numpy())
        self.dim, self.quantized = int(default_row.shape[1]), dtype == tf.int8
        width = self.dim + (SCALE_BIAS_BYTES if self.quantized else 0)
        self.rows = tf.Variable(tf.zeros([held + 1, width], dtype), trainable=False, name="rows")
        for start in range(0, held, ROWS_PER_COPY):
            stop = min(held, start + ROWS_PER_COPY)
            self._put(start, stop, tf.gather(rows, order[start:stop]))
        self._put(held, held + 1, default_row)

    def _put(self, start, stop, rows):
        """Stores rows [stop - start, dim] at [start, stop) in the shard's precision: float rows
        converted, or int8 rows already packed (an int8 table's own: serving_rows) as they are."""
        if rows.dtype == tf.int8:
            stored = rows
        else:
            stored = pack_rows(*quantize_rows(rows)) if self.quantized else tf.cast(rows, self.rows.dtype)
        self.rows[start:stop].assign(stored)

    @classmethod
    def of_table(cls, table, dim, dtype=tf.float32, name=None, publish_record=False):
        """(the HashedShard of one table shard's rows, that shard's table step): built from
        its export (rows only: the optimizer slots are dropped) on the shard's device.
        publish_record: reset the shard's "publish" record of deleted keys in that snapshot."""
        with tf.device(table._resource_device):  # pylint: disable=protected-access  (built and kept where the rows are)
            exported = table.export(reset_deleted=publish_record, record="publish",
                                    stored_values=stored_int8(table, dtype))
            default_row = tf.fill([1, dim], tf.constant(table.default_value, tf.float32))
            shard = cls(exported["keys"], serving_rows(table, exported, dtype), default_row, dtype=dtype, name=name)
        return shard, int(exported["step"])

    @property
    def layout(self):
        """What a placeholder of this shard needs (plain numbers): see _placeholder."""
        return {"buckets": self.buckets, "probe": self.probe, "offsets_dtype": self.offsets.dtype.name,
                "dim": self.dim}

    def _placeholder(self, layout, dtype):
        """Empty variables of unknown length in the layout of a shard built elsewhere: the graph
        traced over them serves that shard once its arrays are restored into them (a SavedModel
        whose variables another process wrote)."""
        self.buckets, self.probe = int(layout["buckets"]), int(layout["probe"])
        self.dim, self.quantized = int(layout["dim"]), dtype == tf.int8
        width = self.dim + (SCALE_BIAS_BYTES if self.quantized else 0)
        self.keys = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False, name="keys")
        self.offsets = tf.Variable(tf.zeros([0], layout["offsets_dtype"]), shape=tf.TensorShape([None]),
                                   trainable=False, name="offsets")
        self.rows = tf.Variable(tf.zeros([0, width], dtype), shape=tf.TensorShape([None, width]), trainable=False,
                                name="rows")

    def find(self, keys):
        """int64 keys [K] -> int64 [K]: each key's row index, or N (the default row).

        Keys are unique, so any slot holding the key is its row: no bucket bounds to check.
        Buckets hold about one key, so the first two slots of each id's bucket are compared
        for every id (two gathers from neighbouring slots), and the rest of the bucket only for
        the few ids still unresolved whose bucket holds more than two keys.
        """
        count = tf.size(self.keys, out_type=tf.int64) - 1  # N held keys, then the padding
        bucket = tf.cast(tf.bitwise.bitwise_and(bucket_hash(keys), tf.constant(self.buckets - 1, tf.uint64)),
                         tf.int64)
        start = tf.cast(tf.gather(self.offsets, bucket), tf.int64)
        second = tf.minimum(start + 1, count)  # the padding slot reads the default row
        found = tf.where(tf.equal(tf.gather(self.keys, start), keys), start,
                         tf.where(tf.equal(tf.gather(self.keys, second), keys), second, count))
        if self.probe <= 2:
            return found
        more = (found == count) & (tf.cast(tf.gather(self.offsets, bucket + 1), tf.int64) - start > 2)
        where = tf.where(more)  # [M, 1], M small: ids of buckets with more than two keys
        rest_keys, rest_start = tf.gather_nd(keys, where), tf.gather_nd(start, where)
        slots = tf.minimum(rest_start[:, None] + tf.range(2, self.probe, dtype=tf.int64)[None, :], count)
        hit = tf.equal(tf.gather(self.keys, slots), rest_keys[:, None])
        return tf.tensor_scatter_nd_update(found, where, tf.reduce_min(tf.where(hit, slots, count), 1))

    def lookup(self, keys):
        """int64 keys [K] -> float32 rows [K, dim]."""
        return self.rows_at(self.find(keys))

    def rows_at(self, index):
        """int64 row indices [K] -> float32 rows [K, dim] (int8 rows dequantized in the graph)."""
        rows = tf.gather(self.rows, index)
        return unpack_rows(rows, self.dim) if self.quantized else tf.cast(rows, tf.float32)


class HashedTable(tf.Module):
    """A copy of a DynamicEmbedding's table in stock TF ops, shard by shard, plus an overlay
    that published deltas update in place.

    Keys go to shard `shard_of(key, shards)` (the layer's own routing; ids it never held read
    the layer's default row, as its inference lookup does: no growth, no failure). Each shard
    is a HashedShard built from that shard's export only, under `tf.device` of that shard.

    The overlay holds what the deltas since the base changed (apply): `overlay_slots`, a
    `tf.lookup.experimental.DenseHashTable` key -> int64 slot (-2: deleted, reads the default
    row; absent: the base's row; it holds overlay_key(key), and the two keys in RESERVED_KEYS are
    reserved by it), and
    `overlay_rows` [slots, dim] (the rows' dtype; int8 rows [slots, dim + 8]: pack_rows),
    which grows by doubling when a delta brings more new keys than it has room for. Each
    key owns two slots (2j, 2j + 1): a delta writes a key's new row into the slot not serving
    it, then remaps all of the table's keys (deletions included) in one insert, which the hash
    table makes whole under its lock, so a lookup sees every row of a delta or none of them
    (DeltaFollower waits for lookups still reading the previous mapping before the next delta
    reuses their slots). So it is bounded by twice the keys touched until the next base, and
    growing copies the overlay only, never the frozen base. A lookup reads the overlay first,
    then the base, and skips the overlay while it is empty, so a base alone looks up as fast
    as before.

    Args:
      layer: a DynamicEmbedding (any sharding).
      dtype: tf.float32, tf.float16 to halve the rows, or tf.int8 to quarter them (row-wise
        affine: quantize_rows; each row adds a float32 scale and bias); looked up as float32.
      publish_record: export each shard with its "publish" record of deleted keys reset in
        the same snapshot (ttf.serving.Publisher's base); `exported_steps` then holds each
        shard's table step at that snapshot.
      rank_shards: a layer sharded over Horovod ranks: [(shard, table step)] per rank, shard
        being this rank's HashedShard or another rank's HashedShard.layout (a placeholder
        whose arrays that rank writes: ttf.distribute.horovod.export_for_serving).
    """

    DELETED = -2  # the overlay slot of a deleted key
    EMPTY_KEY = -(1 << 63)  # reserved by the overlay's hash table (with EMPTY_KEY + 1)
    RESERVED_KEYS = (3453682501520545093, 3030375423906679887)  # overlay_key(k) == EMPTY_KEY, EMPTY_KEY + 1

    def __init__(self, layer, dtype=tf.float32, name=None, publish_record=False, rank_shards=None):
        super().__init__(name=name or f"{layer.name}_frozen")
        dtype = check_row_dtype(dtype, "HashedTable")
        self.row_dtype = dtype
        self.dim = layer.dim
        default_row = tf.fill([1, layer.dim], tf.constant(layer.tables[0].default_value, tf.float32))
        self.default_row = tf.Variable(default_row, trainable=False, name="default_row")
        self.shards = []
        steps = []
        sharding = getattr(layer, "sharding", None)
        if sharding is not None and rank_shards is None:
            raise ValueError(f"{layer.name} is sharded over {sharding.size} ranks, each holding its own rows: "
                             "export it with ttf.distribute.sync.export_for_serving(model, base, collectives) on every rank")
        if sharding is not None:  # Horovod: this rank's shard, built here, and the others' placeholders
            for i, (shard, step) in enumerate(rank_shards):
                if not isinstance(shard, HashedShard):  # its rank writes its arrays into the same SavedModel
                    shard = HashedShard(None, None, None, dtype, name=f"shard_{i}", layout=shard)
                self.shards.append(shard)
                steps.append(step)
        for i, table in enumerate(layer.tables if sharding is None else []):
            shard, step = HashedShard.of_table(table, layer.dim, dtype, f"shard_{i}", publish_record)
            self.shards.append(shard)
            steps.append(step)
        self.exported_steps = np.array(steps, np.int64)  # not tracked: a numpy array
        # Open addressing, values in one array: lookups and inserts of a delta's keys run several
        # times faster than MutableHashTable's node map. It holds overlay_key(key), never the key:
        # its two reserved keys (EMPTY_KEY and EMPTY_KEY + 1) are the overlay keys of
        # RESERVED_KEYS, which apply_delta refuses (InvalidArgument).
        self.overlay_slots = tf.lookup.experimental.DenseHashTable(
            tf.int64, tf.int64, default_value=-1, empty_key=self.EMPTY_KEY, deleted_key=self.EMPTY_KEY + 1,
            initial_num_buckets=1024, name=f"{layer.name}_overlay_slots")
        width = layer.dim + (SCALE_BIAS_BYTES if dtype == tf.int8 else 0)
        self.overlay_rows = tf.Variable(tf.zeros([0, width], dtype), shape=tf.TensorShape([None, width]),
                                        trainable=False, name="overlay_rows")
        self.overlay_used = tf.Variable(0, dtype=tf.int64, trainable=False, name="overlay_used")

    def lookup(self, keys):
        """keys int64 [K] -> rows float32 [K, dim]."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        if len(self.shards) == 1:
            base = self.shards[0].lookup(keys)
        else:
            owner = shard_of(keys, len(self.shards))
            parts = tf.dynamic_partition(keys, owner, len(self.shards))
            places = tf.dynamic_partition(tf.range(tf.size(keys)), owner, len(self.shards))
            base = tf.dynamic_stitch(places, [shard.lookup(part) for shard, part in zip(self.shards, parts)])

        def overlaid():
            slots = self.overlay_slots.lookup(overlay_key(keys))[:, None]
            gathered = tf.maximum(slots[:, 0], 0)
            rows = tf.gather(self.overlay_rows, gathered)
            rows = unpack_rows(rows, self.dim) if self.row_dtype == tf.int8 else tf.cast(rows, tf.float32)
            return tf.where(slots >= 0, rows, tf.where(slots == self.DELETED, self.default_row, base))

        return tf.cond(self.overlay_slots.size() > 0, overlaid, lambda: tf.identity(base))

    def apply(self, keys, rows, deleted_keys, scale_bias=None):
        """One delta of this table: deleted_keys int64 [D] read the default row from now on, then
        keys int64 [K] (distinct) read rows [K, dim] (a key both deleted and upserted in one delta
        was re-added: the upsert comes second). rows: float32 for a float table; int8 with
        scale_bias float32 [K, 2] (quantize_rows) for an int8 one. Returns the op (stock TF ops only)."""
        quantized = self.row_dtype == tf.int8
        if (scale_bias is not None) != quantized:
            raise ValueError(f"HashedTable.apply: a table of {self.row_dtype.name} rows takes "
                             f"{'int8 rows with scale_bias' if quantized else 'float rows, no scale_bias'}")
        held = self.overlay_slots.lookup(overlay_key(keys))
        fresh = held < 0  # absent or deleted: a new pair of slots, the row in its first
        used = self.overlay_used.read_value()
        # A held key's row goes to the other slot of its pair: the one serving it is left alone.
        slots = tf.where(fresh, used + 2 * tf.cumsum(tf.cast(fresh, tf.int64), exclusive=True),
                         tf.bitwise.bitwise_xor(held, tf.constant(1, tf.int64)))
        needed = used + 2 * tf.reduce_sum(tf.cast(fresh, tf.int64))
        capacity = tf.raw_ops.VariableShape(input=self.overlay_rows.handle, out_type=tf.int64)[0]  # no read

        rows = pack_rows(rows, tf.convert_to_tensor(scale_bias, tf.float32)) if quantized else tf.cast(
            rows, self.overlay_rows.dtype)

        def grow():  # doubling: copies the overlay (never the base), amortised over the deltas
            size = tf.maximum(needed, 2 * capacity)
            extra = tf.zeros(tf.stack([size - capacity, self.overlay_rows.shape[1]]), self.overlay_rows.dtype)
            return tf.identity(self.overlay_rows.assign(tf.concat([self.overlay_rows, extra], 0)).read_value()[:1, :1])

        grown = tf.cond(needed > capacity, grow, lambda: tf.zeros([1, 1], self.overlay_rows.dtype))
        with tf.control_dependencies([grown]):
            # the rows first, into slots no lookup reads, then the keys: a concurrent lookup never
            # reads a slot not yet written. The raw op returns no value: a variable's scatter_nd_update
            # returns a read of the whole overlay, a copy that made each delta cost in proportion to the
            # rows already applied.
            written = tf.raw_ops.ResourceScatterUpdate(resource=self.overlay_rows.handle, indices=slots, updates=rows)
        with tf.control_dependencies([written]):
            # One insert remaps the whole delta (deletions first: a key deleted and re-added in one
            # delta ends on its row, the insert applying its batch in order).
            deleted_keys = tf.convert_to_tensor(deleted_keys, tf.int64)
            mapped = self.overlay_slots.insert(
                overlay_key(tf.concat([deleted_keys, keys], 0)),
                tf.concat([tf.fill(tf.shape(deleted_keys), tf.constant(self.DELETED, tf.int64)), slots], 0))
        with tf.control_dependencies([mapped]):
            return self.overlay_used.assign(needed)


FrozenTable = HashedTable  # the name ttf.serving exported before tables were hashed
