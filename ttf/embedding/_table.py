"""EmbeddingTable: the Python side of one ttf table resource (checkpointable, placeable)."""
import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2
from tensorflow.python.saved_model import nested_structure_coder, registration

from ttf._ops import ops, unique_resource_name
from ttf.embedding._logical import EXPORT_FIELDS

_KINDS = ("normal", "truncated_normal", "uniform", "zeros", "constant")


@dataclasses.dataclass(frozen=True)
class RowInitializer:
    """How a new key's row is filled; a pure function of (seed, key).

    kind: "uniform" (minval=a, maxval=b), "normal" / "truncated_normal" (mean=a,
    stddev=b; truncated at 2 stddev), "zeros", or "constant" (value=a). The default is
    Keras' Embedding default, uniform(-0.05, 0.05).
    """

    kind: str = "uniform"
    a: float = -0.05
    b: float = 0.05

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"initializer kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind in ("normal", "truncated_normal") and not self.b > 0:
            raise ValueError(f"{self.kind} initializer needs stddev > 0, got {self.b}")
        if self.kind == "uniform" and not self.a < self.b:
            raise ValueError(f"uniform initializer needs minval < maxval, got {self.a} and {self.b}")

    @classmethod
    def of(cls, initializer):
        """Accepts a RowInitializer, its config dict ({"kind", "a", "b"}, as get_config
        writes it), a kind name, or a tf.keras initializer of a matching kind."""
        if isinstance(initializer, cls):
            return initializer
        if isinstance(initializer, dict) and set(initializer) == {"kind", "a", "b"}:
            return cls(initializer["kind"], float(initializer["a"]), float(initializer["b"]))
        if isinstance(initializer, str):
            return {
                "uniform": cls("uniform", -0.05, 0.05),
                "normal": cls("normal", 0.0, 0.05),
                "truncated_normal": cls("truncated_normal", 0.0, 0.05),
                "zeros": cls("zeros", 0.0, 0.0),
                "ones": cls("constant", 1.0, 0.0),
                "constant": cls("constant", 0.0, 0.0),
            }.get(initializer) or cls(initializer)  # unknown names fail in __post_init__
        inits = tf.keras.initializers
        config = initializer.get_config() if hasattr(initializer, "get_config") else {}
        if isinstance(initializer, inits.RandomUniform):
            return cls("uniform", config["minval"], config["maxval"])
        if isinstance(initializer, inits.TruncatedNormal):
            return cls("truncated_normal", config["mean"], config["stddev"])
        if isinstance(initializer, inits.RandomNormal):
            return cls("normal", config["mean"], config["stddev"])
        if isinstance(initializer, inits.Zeros):
            return cls("zeros", 0.0, 0.0)
        if isinstance(initializer, inits.Ones):
            return cls("constant", 1.0, 0.0)
        if isinstance(initializer, inits.Constant) and tf.size(config["value"]) == 1:
            return cls("constant", float(tf.reshape(config["value"], [])), 0.0)
        raise TypeError(
            f"initializer must be a RowInitializer, one of {_KINDS}, or a tf.keras RandomUniform, "
            f"RandomNormal, TruncatedNormal, Zeros, Ones or scalar Constant; got {initializer!r}"
        )


    def get_config(self):
        return dataclasses.asdict(self)


EVICT_POLICIES = ("lru", "lfu", "ttl")
ROW_FORMATS = ("fp32", "bf16", "int8")
TIER_STATS = ("dram_rows", "disk_rows", "dram_hits", "disk_hits", "demoted", "promoted", "dram_bytes",
              "disk_index_bytes", "disk_file_bytes", "dram_row_limit", "disk_waits", "crowded_shards", "written_back")


def parse_capacity(capacity):
    """(rows, bytes) of a table capacity: an int is rows (0: unbounded), a size with a unit
    ("512M", "2G", "1.5G"; units of 1024, as parse_size) is bytes. ValueError naming
    capacity and the fix otherwise."""
    if isinstance(capacity, (int, np.integer)) and capacity >= 0:
        return int(capacity), 0
    if isinstance(capacity, str) and capacity.strip()[-1:].isalpha():  # a unit: bytes
        try:
            return 0, parse_size(capacity)
        except ValueError as err:
            raise ValueError(f"capacity {capacity!r}: {err}") from None
    raise ValueError(f"capacity must be an int >= 0 (rows; 0: unbounded) or a size with a unit such as '512M' or "
                     f"'2G' (bytes), got {capacity!r}")


def check_eviction(capacity, evict_policy, ttl_steps):
    """ValueError naming the argument unless (capacity, evict_policy, ttl_steps) is valid."""
    parse_capacity(capacity)
    if evict_policy not in EVICT_POLICIES:
        raise ValueError(f"evict_policy must be one of {EVICT_POLICIES}, got {evict_policy!r}")
    if not isinstance(ttl_steps, (int, np.integer)) or ttl_steps < 0:
        raise ValueError(f"ttl_steps must be an int >= 0, got {ttl_steps!r}")
    if (evict_policy == "ttl") != (ttl_steps > 0):
        raise ValueError(f"ttl_steps ({ttl_steps}) must be > 0 exactly when evict_policy is 'ttl' "
                         f"(got evict_policy={evict_policy!r})")


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """Bytes of a size such as "2G", "512M", "64k" or "1048576" (units of 1024); ValueError
    naming the text otherwise."""
    value = str(text).strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (value[:-1], value[-1]) if value[-1:] in ("K", "M", "G", "T") else (value, "")
    try:
        size = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise ValueError(f"size must be a number with an optional unit K, M, G or T (e.g. 512M, 2G), "
                         f"got {text!r}") from None
    if not size >= 0 or size != size:
        raise ValueError(f"size must be >= 0, got {text!r}")
    return int(size)


def tier_row_bytes(dim, num_slots):
    """RAM bytes a table counts per row against its dram_budget or a capacity in bytes: value
    and slots, metadata (16) and an index entry (24), as TtfEmbeddingTable does."""
    return 4 * dim * (1 + num_slots) + 40


def parse_dram_budget(dram_budget):
    """Bytes of a dram_budget: an int, or a size with a unit ("2G", "512M"; parse_size).
    ValueError naming dram_budget and the fix otherwise."""
    if isinstance(dram_budget, str):
        try:
            return parse_size(dram_budget)
        except ValueError as err:
            raise ValueError(f"dram_budget {dram_budget!r}: {err}") from None
    if isinstance(dram_budget, (int, np.integer)) and not isinstance(dram_budget, bool) and dram_budget >= 0:
        return int(dram_budget)
    raise ValueError(f"dram_budget must be bytes >= 0, an int or a size such as '2G' or '512M' (0: no SSD tier), "
                     f"got {dram_budget!r}")


def check_rows(rows):
    """ValueError naming rows unless it is a row format."""
    if rows not in ROW_FORMATS:
        raise ValueError(f"rows must be one of {ROW_FORMATS}, got {rows!r}")


def check_tier(dram_budget, ssd_dir):
    """dram_budget in bytes; ValueError naming the argument unless (dram_budget, ssd_dir) is valid."""
    budget = parse_dram_budget(dram_budget)
    if not isinstance(ssd_dir, str) or (budget > 0) != bool(ssd_dir):
        raise ValueError(f"dram_budget ({dram_budget!r}) and ssd_dir ({ssd_dir!r}) go together: set both for a "
                         "DRAM + SSD tier, or neither")
    return budget


# The table's change log numbers its readers (the ops' `record` attr); these are ttf's, each
# with its own record of removed keys, reset only by it. TtfTableSave and TtfTableCommitSave
# default to 0, the checkpoint's.
CHANGE_LOG_READERS = {"checkpoint": 0, "publish": 1}


def _change_log_reader(record):
    if record not in CHANGE_LOG_READERS:
        raise ValueError(f"record must be one of {sorted(CHANGE_LOG_READERS)}, got {record!r}")
    return CHANGE_LOG_READERS[record]


@registration.register_serializable(package="ttf", name="EmbeddingTable")
class EmbeddingTable(tf.saved_model.experimental.TrackableResource):
    """One dynamic hash table of float32 rows keyed by int64, living on `device`.

    Most users reach it through `ttf.DynamicEmbedding`, whose checkpoint holds the
    logical table of all its shards (see ttf/embedding/_logical.py); export() and
    restore() are the table's half of that. It is public for custom layers.

    Every table object owns its own table: the resource name is unique per object, and a
    SavedModel loaded into a process (ttf imported) gets new tables, never the live ones.

    Args:
      dim: row width (> 0).
      initializer: see RowInitializer.of.
      seed: with the key, determines a new row.
      default_value: what missing (and not yet admitted) keys read, in every element.
      admission_min_count: a key gets its own row once seen in this many training
        updates (0: at its first). Until then it reads the default row and gets no update.
      admission_sketch_bytes: > 0 (with admission_min_count): count the sightings of keys
        without a row in a count-min sketch of this many bytes (fixed memory, no candidate
        stored; a key seen once is admitted early with probability at most
        (1 / (4 * (admission_min_count - 1)))^4; not checkpointed, docs/tiers.md). 0: exact
        candidates, at most 4M of them (oldest dropped).
      num_shards: lock shards inside the table (parallelism of lookups and updates).
      capacity: at most this many rows after each update (0: unbounded), plus that update's
        own new keys; when over, the table evicts down to 15/16 of it by evict_policy. A size
        with a unit ("512M", "2G", "1.5G"; units of 1024) is bytes instead: at most
        capacity / tier_row_bytes(dim, optimizer slots) rows (each lock shard its share), at
        the row width of the moment (an optimizer's first update adds its slots: Adam's
        rows are 3x as wide). Not with dram_budget (it bounds a tiered table's RAM already:
        bound both tiers with a capacity in rows).
      evict_policy: "lru" (least recently updated rows first), "lfu" (fewest updates
        first), or "ttl": every row not updated in the last ttl_steps steps goes (and LRU
        above a capacity, if one is set). With dram_budget, also the order rows move to
        disk in: lfu the fewest updates first, lru and ttl the least recently updated.
      ttl_steps: for evict_policy="ttl" (and only then), > 0.
      dram_budget: bytes of DRAM rows (see tier_row_bytes) this table keeps, an int or a
        size such as "2G" or "512M" (units of 1024); with ssd_dir,
        the rows beyond it live in a file under ssd_dir (0: all rows in DRAM). Lookups
        read disk rows in place, updates bring them back to DRAM, so training is exactly
        that of an all-DRAM table (docs/tiers.md). The disk tier's key index counts inside
        the budget. With a capacity or TTL, rows leave both tiers by the policy.
      ssd_dir: a writable directory for the disk tier (with dram_budget; InvalidArgument at
        creation if it cannot be written). Its file is a cache, unlinked at once: a
        checkpoint holds every row, and a killed process leaves nothing there.
      rows: how rows are stored: "fp32", "bf16" or "int8" (a scale and an offset a row),
        with optimizer slots to match (docs/table_rows.md). Lookups read them as float32;
        updates run in float32 and write back with stochastic rounding seeded by (seed, key,
        step), so rows stay a pure function of the seed and the update history. Exports hold
        float32 rows, checkpoints the stored rows (restored to the bit into the same rows); a
        restore into another row format converts. With dram_budget, the disk tier keeps the
        rows as stored.
      name: a readable name (made unique).
      device: where the table lives, e.g. "/job:ps/replica:0/task:0".
    """

    def __init__(self, dim, initializer="uniform", seed=0, default_value=0.0, admission_min_count=0,
                 num_shards=16, name="embedding_table", device="", capacity=0, evict_policy="lru", ttl_steps=0,
                 dram_budget=0, ssd_dir="", admission_sketch_bytes=0, rows="fp32"):
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if admission_min_count < 0:
            raise ValueError(f"admission_min_count must be >= 0, got {admission_min_count}")
        if not 1 <= num_shards <= 4096:
            raise ValueError(f"num_shards must be in [1, 4096], got {num_shards}")
        check_eviction(capacity, evict_policy, ttl_steps)
        dram_budget = check_tier(dram_budget, ssd_dir)
        check_rows(rows)
        self.rows = rows
        self.capacity_rows, self.capacity_bytes = parse_capacity(capacity)
        if self.capacity_bytes and dram_budget:
            raise ValueError(f"capacity {capacity!r} (bytes) with dram_budget ({dram_budget}): a tiered table's RAM is "
                             "already bounded by dram_budget; give capacity in rows (an int) to bound both tiers")
        if self.capacity_bytes and self.capacity_bytes // num_shards < tier_row_bytes(dim, 0):
            raise ValueError(f"capacity {capacity!r} gives each of the {num_shards} lock shards "
                             f"{self.capacity_bytes // num_shards} bytes, below one row ({tier_row_bytes(dim, 0)} "
                             f"bytes at dim {dim}, more with optimizer slots): raise it or lower num_shards")
        if not isinstance(admission_sketch_bytes, (int, np.integer)) or admission_sketch_bytes < 0:
            raise ValueError(f"admission_sketch_bytes must be an int >= 0, got {admission_sketch_bytes!r}")
        if admission_sketch_bytes and not admission_min_count:
            raise ValueError(f"admission_sketch_bytes ({admission_sketch_bytes}) counts admission sightings: set "
                             "admission_min_count > 0 too, or leave it 0")
        self.admission_sketch_bytes = int(admission_sketch_bytes)
        self.dram_budget = dram_budget
        self.ssd_dir = ssd_dir
        self.capacity = capacity.strip() if isinstance(capacity, str) else int(capacity)  # as given: rows or a size
        self.evict_policy = evict_policy
        self.ttl_steps = int(ttl_steps)
        self.dim = dim
        self.initializer = RowInitializer.of(initializer)
        self.seed = int(seed)
        self.default_value = float(default_value)
        self.admission_min_count = int(admission_min_count)
        self.num_shards = int(num_shards)
        self.name = name
        self._shared_name = unique_resource_name(name)
        super().__init__(device=device)
        with tf.init_scope():  # create it now, outside whatever graph is being traced
            self.resource_handle  # noqa: B018  (the property creates the resource)

    def _create_resource(self):
        return ops().ttf_embedding_table(
            dim=self.dim, initializer=self.initializer.kind, init_a=self.initializer.a,
            init_b=self.initializer.b, seed=self.seed, default_value=self.default_value,
            admission_min_count=self.admission_min_count, num_shards=self.num_shards,
            capacity=self.capacity_rows, capacity_bytes=self.capacity_bytes, evict_policy=self.evict_policy,
            ttl_steps=self.ttl_steps, dram_budget=self.dram_budget, ssd_dir=self.ssd_dir,
            admission_sketch_bytes=self.admission_sketch_bytes, rows=self.rows,
            shared_name=self._shared_name)

    def _destroy_resource(self):
        ops().ttf_table_destroy(self.resource_handle)

    def lookup(self, keys, training):
        """keys int64 [N] -> rows [N, dim]. Never changes the table: a missing key reads,
        in training, the row the optimizer's apply will insert for it (its initializer row,
        or the default row while not yet admitted), at inference the default row. Rows are
        inserted, counted and admitted by the apply ops (ttf.optimizers), for the keys they
        update, so a step skipped before its update changes nothing."""
        return ops().ttf_table_find(self.resource_handle, keys, dim=self.dim, training=bool(training))

    def size(self):
        """The number of keys holding a row (int64 scalar tensor)."""
        return ops().ttf_table_size(self.resource_handle)

    def stats(self):
        """(candidates, memory_bytes, step, candidates_dropped, rows_evicted): admission
        candidates, bytes allocated, table step, candidates dropped by max_candidates, rows
        evicted by the capacity and TTL policy."""
        return ops().ttf_table_stats(self.resource_handle)

    def tier_stats(self):
        """The DRAM + SSD tier as a dict of ints (TtfTableTierStats): dram_rows, disk_rows,
        dram_hits and disk_hits (lookups of keys with a row, by tier, since creation: a
        training lookup counts its distinct keys, an inference lookup its ids read from DRAM
        and the distinct keys it reads from disk),
        demoted, promoted, dram_bytes, disk_index_bytes (RAM), disk_file_bytes,
        dram_row_limit (0 untiered), disk_waits (lookups' disk reads that missed the page
        cache and waited for the device, since creation), crowded_shards (lock shards whose
        disk key index takes over half their share of dram_budget: raise the budget),
        written_back (of demoted: disk rows an update read and wrote straight back, not kept in
        DRAM because, before that update, they ranked below the last row demoted)."""
        with tf.device(self._resource_device):
            values = ops().ttf_table_tier_stats(self.resource_handle).numpy()
        return dict(zip(TIER_STATS, (int(v) for v in values)))

    def evict(self, min_last_seen, min_count):
        return ops().ttf_table_evict(self.resource_handle, tf.cast(min_last_seen, tf.int64),
                                     tf.cast(min_count, tf.int64))

    def export(self, since_step=None, reset_deleted=False, record="checkpoint", stored_values=False):
        """The table's content as a dict: keys [N], values [N, dim * (1 + S)] (row then S
        optimizer slots), meta [N, 2] (count, last-seen step), candidate_keys [C],
        candidate_meta [C, 2], optimizer (string), slot_init [S], step. One consistent
        snapshot (TtfTableExport).

        stored_values: values holds each row's value as the table stores it instead, no slots
          (see stored_rows): what an int8 serving export keeps without converting.

        since_step: a delta instead (TtfTableExportDelta): only rows and candidates last
          seen after table step since_step, plus deleted_keys, the keys removed since the
          record of deletions was last reset.
        reset_deleted: clear and (re)start that record in the same snapshot (the base of
          a chain of deltas).
        record: whose record of deleted keys: "checkpoint" (delta checkpoints) or
          "publish" (deltas published to serving, ttf.serving.Publisher). Each reader keeps
          its own, reset only by it, so publishing never disturbs a checkpoint chain.
        """
        options = dict(reset_deleted=reset_deleted, record=_change_log_reader(record), stored_values=stored_values)
        with tf.device(self._resource_device):
            if since_step is None:
                return dict(zip(EXPORT_FIELDS, ops().ttf_table_export(self.resource_handle, **options)))
            exported = ops().ttf_table_export_delta(self.resource_handle, tf.cast(since_step, tf.int64), **options)
        return dict(zip(EXPORT_FIELDS + ("deleted_keys",), exported))

    def stored_rows(self, values):
        """An export's stored_values [N, W] (float32 words) -> int8 [N, dim + 8] for an int8
        table: each row's dim codes, then its float32 scale and bias (value = code * scale +
        bias), byte for byte: ttf.serving's packed int8 row layout (ttf/serving/_frozen.py)."""
        if self.rows != "int8":
            raise ValueError(f"stored_rows: {self.name} stores {self.rows} rows, not int8 codes")
        words = tf.shape(values)[1]
        return tf.reshape(tf.bitcast(values, tf.int8), [-1, 4 * words])[:, :self.dim + 8]

    def restore(self, export, num_partitions=1, partition=0):
        """Loads the keys of `export` (a dict as export() returns, of any table or of a
        whole logical table) that shard_of(key, num_partitions) routes to `partition`:
        this table is that shard. A full export replaces the table's content; a delta
        (with deleted_keys) removes those keys, then upserts its rows and candidates."""
        fields = [export[f] for f in EXPORT_FIELDS]
        partitioned = dict(num_partitions=num_partitions, partition=partition)
        with tf.device(self._resource_device):
            if "deleted_keys" not in export:
                return ops().ttf_table_import(self.resource_handle, *fields, **partitioned)
            removed = ops().ttf_table_remove(self.resource_handle, export["deleted_keys"])  # others' keys: ignored
            with tf.control_dependencies([removed]):
                return ops().ttf_table_import(self.resource_handle, *fields, merge=True, **partitioned)

    def reset_deleted(self, record="checkpoint"):
        """Clears and (re)starts the record of deleted keys `record` (see export)."""
        with tf.device(self._resource_device):
            return ops().ttf_table_deleted_keys(self.resource_handle, reset=True, record=_change_log_reader(record))

    def commit_save(self):
        """A checkpoint save of this table is durable: forgets the deleted keys its save took
        with each shard's rows (TtfTableCommitSave); keys deleted since stay recorded."""
        with tf.device(self._resource_device):
            return ops().ttf_table_commit_save(self.resource_handle, record=CHANGE_LOG_READERS["checkpoint"])

    # -- SavedModel: a loaded table is a new table (tables are not shared by name)

    def _serialize_to_proto(self, object_proto=None, **kwargs):
        config = dict(dim=self.dim, initializer=self.initializer.get_config(), seed=self.seed,
                      default_value=self.default_value, admission_min_count=self.admission_min_count,
                      num_shards=self.num_shards, name=self.name, capacity=self.capacity,
                      evict_policy=self.evict_policy, ttl_steps=self.ttl_steps,
                      dram_budget=self.dram_budget, ssd_dir=self.ssd_dir,
                      admission_sketch_bytes=self.admission_sketch_bytes, rows=self.rows)
        return nested_structure_coder.encode_structure(config)

    @classmethod
    def _deserialize_from_proto(cls, proto, object_proto=None, **kwargs):
        """Loading a SavedModel where ttf is imported: a fresh table on this process
        (the checkpoint in the SavedModel then fills it); without ttf, TensorFlow revives
        the saved resource as is."""
        value = struct_pb2.StructuredValue()
        proto.Unpack(value)
        table = cls(**nested_structure_coder.decode_proto(value))
        # The loaded functions capture only the handle: it keeps the table (whose deletion
        # destroys the resource) alive, so `tf.saved_model.load(p).signatures[...]` works
        # after the loaded object itself is gone.
        table.resource_handle._ttf_table = table
        return table
