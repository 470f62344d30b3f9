"""Publisher: a base version in TF Serving's layout, then a numbered sequence of deltas.

    BASE/<version>/                          a SavedModel (export_for_serving, publish_record=True)
    BASE/deltas/<version>/<sequence>/        one delta, sequence 1, 2, ... (10 digits)
        manifest.json                        written last: base version, sequence, parts, checksums
        <table>-<shard>-<piece>.delta        one shard's piece: keys, rows, deleted keys
        dense.delta                          the dense variables, when they changed

A part file is `tf.io.serialize_tensor` of a string vector [3]: the serialized keys int64 [K],
rows [K, dim] (float32 or float16) and deleted keys int64 [D]; with int8 rows (format 2) a
vector [4] whose fourth is each row's scale and bias float32 [K, 2]. Its checksum is
`tf.fingerprint` (farmhash64) of the whole file, so a follower checks it with stock TF.

Each table shard's part is exported, serialized and written by ops placed on the shard's
device (a parameter server writes its own rows); the publishing process gets back only
counts and checksums. Every path goes through tf.io.gfile (local, gs://, s3://, hdfs://,
ram://). On a local file system a delta is written in `deltas/<version>/.tmp-<sequence>-<pid>/`,
each file fsynced, the manifest last, then renamed into place; elsewhere (no atomic folder
rename) it is written in its own folder with the manifest last. Either way a follower, which
applies a delta only once its manifest is there, never sees part of one.

The rows of a delta are those touched since the last delta (each shard's own "since" marker,
the table step at its last published snapshot), and the deleted keys come from the shard's
"publish" record of deleted keys, which only the Publisher resets: checkpoints keep their own
record and step, so publishing never disturbs a chain of delta checkpoints. Nothing changed
(no table step advanced, no key deleted, the dense weights the same): no delta.
"""
import json
import os
import sys
import time

import tensorflow as tf

from ttf._durable import fsync_path, read_text, remove_tree, renames_folders, write_text
from ttf._ops import ops
from ttf.embedding import tables_in
from ttf.embedding._table import CHANGE_LOG_READERS
from ttf.serving._export import SERVING_INFO, export_for_serving, versions
from ttf.serving._frozen import check_row_dtype, quantize_rows, serving_rows, split_packed, stored_int8

DELTAS = "deltas"
MANIFEST = "manifest.json"
PIECE_BYTES = 64 << 20  # the most rows (keys + rows) one part file holds
FORMAT = 1  # float rows
FORMAT_INT8 = 2  # int8 rows: each part adds the rows' scale and bias (a follower of format 1 refuses it)


def delta_folder(base, version, sequence):
    """The folder of delta `sequence` of base `version` under `base`."""
    return os.path.join(base, DELTAS, str(version), f"{sequence:010d}")


@tf.function(autograph=False)
def _write_on_device(path, blob):
    with tf.control_dependencies([tf.io.write_file(path, blob)]):
        return tf.strings.length(blob)


def _write_file(path, blob):
    """Writes `blob` at `path` on the device of the enclosing tf.device scope, and waits for
    it (eager ops on a remote PS run asynchronously); the one write of a part, so a test can
    inject a full disk here."""
    return int(_write_on_device(tf.constant(path), blob))


def exported_steps(path):
    """(version, {table name: [table step of each shard at the snapshot]}) of the serving
    version at `path` (export_for_serving's record, assets.extra/ttf_serving.json)."""
    return int(os.path.basename(path)), json.loads(read_text(os.path.join(path, SERVING_INFO)))["exported_steps"]


def _fingerprint(blob):
    """farmhash64 of a scalar string tensor, as 16 hex digits (stock TF: the follower's check)."""
    return bytes(tf.fingerprint(tf.reshape(blob, [1]))[0].numpy()).hex()


class Publisher:
    """Publishes a Keras model's ttf tables for a DeltaFollower (and TF Serving): a base
    version, then deltas of what changed, every few seconds.

    Call `maybe_publish()` from the training loop, between steps (it returns at once unless a
    publish is due), and `publish()` at the end. The first call writes a base version (the
    next free version under `base`, so a restarted trainer starts a new base that followers
    switch to); a new base follows every `rebase_every` seconds in which something changed,
    so a follower that fell behind never replays more than that.

    A delta holds what changed since the last one, and nothing when nothing did: the rows
    of each table shard touched since its last snapshot (its table step then), the keys
    deleted since, and the dense weights when they changed (by default in every delta in
    which they did: the rows served never run ahead of the dense weights they were trained
    with). An idle job (no step, no eviction) writes no delta. Between steps means no update
    of a table runs during the snapshot (ttf.distribute.Job publishes after each step or
    round); a step still running then on another thread would have its rows sent again in the
    next delta only if its table step is above the snapshot's.

    A write that fails (a full disk) prints one line and pauses publishing; training goes on,
    each later call retries, and the first that succeeds says so and publishes everything
    since the last whole delta (no row or deletion is lost: markers advance only when a delta
    is whole).

    Args:
      model: a built Keras model with ttf tables (one process or parameter servers).
      base: the publish folder (TF Serving's base path), on any file system tf.io.gfile
        reaches (local, gs://, s3://, hdfs://, ram://).
      publish_every, rebase_every: seconds (> 0).
      dense_publish_every: 0 (default): the dense weights go with every delta in which they
        changed; S > 0: at most every S seconds (a model whose dense weights are large next
        to its rows; the rows served may then be up to S seconds ahead of them).
      row_dtype: tf.float32, tf.float16 or tf.int8 rows (row-wise affine, a float32 scale and
        bias each: ttf.export_for_serving), in the base and in the deltas.
      keep_versions: base versions kept (older ones and their deltas are removed).
      clock: the time source (seconds), for tests.
      shards: the publishing processes and the table shards this one holds (default
        LocalShards(): this process, every shard; ranks of a synchronous job: ttf.distribute's).

    Raises:
      ValueError: no ttf table in the model, a table sharded over Horovod ranks (use
        ttf.distribute.horovod.Publisher), or a bad argument.

    Example:
      >>> import ttf, tensorflow as tf, tempfile
      >>> ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
      >>> out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids)))
      >>> model = tf.keras.Model(ids, out)
      >>> _ = model(tf.constant([[1, 2]], tf.int64))
      >>> publisher = ttf.serving.Publisher(model, tempfile.mkdtemp())
      >>> publisher.publish()  # the base: (version, sequence)
      (1, 0)
      >>> publisher.publish()  # nothing changed since: no delta
      (1, 0)
    """

    def __init__(self, model, base, publish_every=10.0, dense_publish_every=0.0, rebase_every=3600.0,
                 row_dtype=tf.float32, keep_versions=2, clock=time.monotonic, shards=None):
        for name, value in (("publish_every", publish_every), ("rebase_every", rebase_every)):
            if not value > 0:
                raise ValueError(f"Publisher: {name} must be > 0 seconds, got {value!r}")
        if not dense_publish_every >= 0:
            raise ValueError(f"Publisher: dense_publish_every must be >= 0 seconds (0: with every delta in which "
                             f"they changed), got {dense_publish_every!r}")
        row_dtype = check_row_dtype(row_dtype, "Publisher")
        if not isinstance(keep_versions, int) or keep_versions < 1:
            raise ValueError(f"Publisher: keep_versions must be an int >= 1, got {keep_versions!r}")
        self.layers = tables_in(model)
        if not self.layers:
            raise ValueError(f"Publisher: {model.name} holds no ttf table: nothing to publish (use "
                             "ttf.export_for_serving for a model without tables)")
        self.shards = shards or LocalShards()
        if isinstance(self.shards, LocalShards) and any(getattr(layer, "sharding", None) is not None
                                                        for layer in self.layers):
            raise ValueError("Publisher: the tables are sharded over ranks: publish with "
                             "ttf.distribute.sync.Publisher(model, base, collectives) on every rank (each rank writes its own part)")
        self.model, self.base = model, os.fspath(base)
        self.publish_every, self.dense_publish_every, self.rebase_every = publish_every, dense_publish_every, rebase_every
        self.row_dtype, self.keep_versions, self.clock = row_dtype, keep_versions, clock
        self.version = None  # the current base version
        self.sequence = 0  # the last whole delta of that base
        self.paused = None  # the cause, while writes fail
        self._since = {}  # (table name, shard) -> table step: rows last seen after it go in the next delta
        self._pending_deleted = {}  # (table name, shard) -> deleted keys (on the shard's device) not yet published
        self._dense_fingerprint = None  # of the dense weights the follower serves (the base's or a delta's)
        self._need_base = True
        self._last_base = self._last_publish = self._last_dense = None

    # -- the loop's calls

    def maybe_publish(self):
        """Publishes if one is due (a base, or a delta every publish_every seconds) and
        something changed; returns (version, sequence) when something was published, else
        None. Never raises for a failed write: it prints one line and retries at the next
        interval."""
        now = self.clock()
        due = self._need_base or self._last_publish is None or now - self._last_publish >= self.publish_every
        if not self.shards.agree(due):
            return None
        before = (self.version, self.sequence)
        published = self.publish()
        return published if published != before else None

    def publish(self, with_dense=False):
        """Publishes now what changed (a base if one is due, else a delta; with_dense: the
        delta carries the dense weights if they changed, whether or not dense_publish_every
        has passed, e.g. a job's last publish); returns (version, sequence), unchanged when
        nothing changed, or None when the write failed (see maybe_publish)."""
        now = self.clock()
        self._last_publish = now
        try:
            rebase = self._need_base or now - self._last_base >= self.rebase_every
            # A new base when one is due and it would differ from the current one.
            if self.shards.agree(rebase) and (self._need_base or self.sequence > 0 or self._any(self._changed_shards())):
                self.publish_base()
            else:
                dense_due = with_dense or now - self._last_dense >= self.dense_publish_every
                self.publish_delta(dense=self.shards.agree(dense_due))
        except (OSError, tf.errors.OpError) as error:
            cause = getattr(error, "message", None) or str(error)
            if self.paused is None:
                print(f"ttf: publishing to {self.base} paused: {cause.splitlines()[0]}; training goes on and each "
                      f"publish retries (free space there to resume)", file=sys.stderr, flush=True)
            self.paused = cause
            return None
        if self.paused is not None:
            print(f"ttf: publishing to {self.base} resumed: base {self.version}, sequence {self.sequence}",
                  file=sys.stderr, flush=True)
            self.paused = None
        return self.version, self.sequence

    # -- what a publish writes

    def publish_base(self):
        """Writes a new base version (every table shard's "publish" record of deleted keys
        restarts in that snapshot); deltas then start again at sequence 1."""
        self._need_base = True  # until the base is whole: the records were reset by the export
        version, steps = self.shards.export_base(self.model, self.base, self.row_dtype)
        # Published between steps: every row last seen at or before the snapshot's table step is in it.
        self._since = {(layer.name, shard): steps[layer.name][shard] for layer, shard, _ in self.shards.table_shards(self.layers)}
        self._pending_deleted = {}
        self._dense_fingerprint = self._dense()[1] if self.shards.writes_shared else None
        self.version, self.sequence = version, 0
        self._need_base = False
        now = self.clock()
        self._last_base = self._last_dense = now
        if self.shards.writes_shared:
            self._remove_old_versions()
        return self.version

    def publish_delta(self, dense=False):
        """Writes delta sequence + 1 of the current base if anything changed: each changed
        shard's rows touched since its marker and its deleted keys, and, when `dense`, the
        dense variables if they changed since the base or the last delta carrying them.
        Returns the sequence, or None when nothing changed (nothing written). A failure
        leaves no whole delta and loses nothing (see maybe_publish)."""
        if self.version is None:
            raise ValueError("Publisher.publish_delta: no base version yet; call publish() first")
        changed = self._changed_shards()
        blob = None
        if dense and self.shards.writes_shared:
            blob, fingerprint = self._dense()
            if fingerprint == self._dense_fingerprint:
                blob = None
        if not self.shards.agree(blob is not None) and not self._any(changed):
            return None
        sequence = self.sequence + 1
        if self.shards.writes_shared:  # a delta that landed though its write reported a failure: the next one
            while tf.io.gfile.exists(os.path.join(delta_folder(self.base, self.version, sequence), MANIFEST)):
                sequence += 1
        sequence = self.shards.agree(sequence)
        folder = os.path.join(self.base, DELTAS, str(self.version))
        final = delta_folder(self.base, self.version, sequence)
        atomic = renames_folders(self.base)
        target = os.path.join(folder, f".tmp-{sequence}-{self.shards.agree(os.getpid())}") if atomic else final
        made = True
        if self.shards.writes_shared:
            try:
                remove_tree(target)  # a failed attempt's parts (no manifest: never applied)
                tf.io.gfile.makedirs(target)
            except (OSError, tf.errors.OpError) as error:
                made = getattr(error, "message", None) or str(error)
        made = self.shards.agree(made)  # the folder exists before any process writes its parts into it
        if made is not True:
            raise OSError(made)
        try:
            written = self._write_parts(target, changed, blob)
            outcome = None
            if self.shards.writes_shared:
                try:
                    self._write_manifest(target, sequence, written["every"], written["dense"])
                    if atomic:
                        fsync_path(target)
                        tf.io.gfile.rename(target, final)  # whole, or not there
                        fsync_path(folder)
                except (OSError, tf.errors.OpError) as error:
                    outcome = getattr(error, "message", None) or str(error)
            outcome = self.shards.agree(outcome)
            if outcome is not None:
                raise OSError(outcome)
        finally:
            if self.shards.writes_shared and atomic:
                remove_tree(target)
        self._since.update(written["steps"])
        self._pending_deleted = {}
        self.sequence = sequence
        if written["dense"] is not None:
            self._dense_fingerprint = written["dense"]["fingerprint"]
            self._last_dense = self.clock()
        return sequence

    def _changed_shards(self):
        """The (layer, shard, table) of this process whose rows or deletions changed since the
        last snapshot: its table step moved (only an update moves it, and an update stamps
        the rows it touches with its step), or keys were deleted (evictions need no step)."""
        changed = []
        reader = CHANGE_LOG_READERS["publish"]
        for layer, shard, table in self.shards.table_shards(self.layers):
            key = (layer.name, shard)
            with tf.device(table._resource_device):  # pylint: disable=protected-access
                moved = int(table.stats()[2]) != self._since[key] or key in self._pending_deleted
                if not moved:
                    deleted = ops().ttf_table_deleted_keys(table.resource_handle, reset=False, record=reader)
                    moved = int(tf.size(deleted)) > 0
            if moved:
                changed.append((layer, shard, table))
        return changed

    def _write_parts(self, target, changed, blob):
        """Writes the changed shards' parts (each on its shard's device) and the dense part
        (`blob`, or None) into `target`; returns {"every": every process's part entries,
        "steps": the new markers, "dense": the dense entry or None}, raising OSError when
        any process failed."""
        written = {"error": None, "parts": [], "dense": None}
        steps = {}
        try:
            for layer, shard, table in changed:
                key = (layer.name, shard)
                with tf.device(table._resource_device):  # pylint: disable=protected-access
                    exported = table.export(since_step=self._since[key], reset_deleted=True, record="publish",
                                            stored_values=stored_int8(table, self.row_dtype))
                    deleted = exported["deleted_keys"]
                    if key in self._pending_deleted:  # from deltas that failed: kept until one is whole
                        deleted = tf.concat([self._pending_deleted[key], deleted], 0)
                    self._pending_deleted[key] = deleted
                    rows, scale_bias = serving_rows(table, exported, self.row_dtype), None
                    if stored_int8(table, self.row_dtype):  # an int8 table's codes, scale and bias as they are
                        rows, scale_bias = split_packed(rows, layer.dim)
                    elif self.row_dtype == tf.int8:  # quantized where the rows are (the shard's device)
                        rows, scale_bias = quantize_rows(rows)
                    rows = tf.cast(rows, self.row_dtype)
                    steps[key] = int(exported["step"])
                    written["parts"] += self._write_shard(target, layer, shard, exported["keys"], rows, deleted,
                                                          scale_bias)
            if blob is not None:
                written["dense"] = self._write_dense(target, blob)
        except (OSError, tf.errors.OpError) as error:
            written["error"] = (getattr(error, "message", None) or str(error)).splitlines()[0]
        every = self.shards.gather(written)
        failed = "; ".join(w["error"] for w in every if w["error"])
        if failed:
            raise OSError(failed)
        return {"every": every, "steps": steps, "dense": written["dense"]}

    def _write_manifest(self, target, sequence, every, dense):
        """manifest.json, written (and fsynced) last: a follower applies a delta only once it is there."""
        manifest = {"format": FORMAT_INT8 if self.row_dtype == tf.int8 else FORMAT,
                    "base_version": self.version, "sequence": sequence,
                    "row_dtype": self.row_dtype.name, "published_at": time.time(),
                    "tables": [layer.name for layer in self.layers],
                    "parts": [part for w in every for part in w["parts"]], "dense": dense}
        write_text(os.path.join(target, MANIFEST), json.dumps(manifest))

    def _any(self, changed):
        """True when `changed` (this process's changed shards) is not empty on some process."""
        return any(report["changed"] for report in self.shards.gather({"error": None, "changed": bool(changed)}))

    def _write_shard(self, folder, layer, shard, keys, rows, deleted, scale_bias=None):
        """Writes one shard's rows (int8 ones with their scale_bias) in pieces of at most
        PIECE_BYTES, on the current device (the shard's); returns their manifest entries. Only
        shapes and checksums come back."""
        count = int(keys.shape[0])
        row_bytes = 8 + layer.dim * self.row_dtype.size + (0 if scale_bias is None else 8)
        per_piece = max(1, PIECE_BYTES // row_bytes)
        entries = []
        for piece, start in enumerate(range(0, max(count, 1), per_piece)):
            end = min(count, start + per_piece)
            piece_deleted = deleted if piece == 0 else tf.zeros([0], tf.int64)
            fields = [keys[start:end], rows[start:end], piece_deleted]
            if scale_bias is not None:
                fields.append(scale_bias[start:end])
            blob = tf.io.serialize_tensor(tf.stack([tf.io.serialize_tensor(field) for field in fields]))
            name = f"{layer.name}-{shard}-{piece}.delta"
            path = os.path.join(folder, name)
            size = _write_file(path, blob)
            fsync_path(path)
            entries.append({"file": name, "table": layer.name, "shard": shard, "rows": end - start,
                            "deleted": int(piece_deleted.shape[0]), "bytes": size, "fingerprint": _fingerprint(blob)})
        return entries

    def _dense(self):
        """(the model's variables serialized in export_for_serving's order, its fingerprint)."""
        with tf.device("CPU:0"):
            blob = tf.io.serialize_tensor(tf.stack([tf.io.serialize_tensor(tf.convert_to_tensor(v))
                                                    for v in self.model.variables]))
        return blob, _fingerprint(blob)

    def _write_dense(self, folder, blob):
        """The dense part: the model's variables in one file (small next to a delta's rows:
        docs/serving.md)."""
        path = os.path.join(folder, "dense.delta")
        size = _write_file(path, blob)
        fsync_path(path)
        return {"file": "dense.delta", "variables": len(self.model.variables), "bytes": size,
                "fingerprint": _fingerprint(blob)}

    def _remove_old_versions(self):
        """Keeps the keep_versions newest base versions (and their deltas)."""
        for version in versions(self.base)[: -self.keep_versions]:
            remove_tree(os.path.join(self.base, str(version)))
            remove_tree(os.path.join(self.base, DELTAS, str(version)))


class LocalShards:
    """A Publisher's processes and shards when one process publishes every shard of every
    table (one process; a parameter-server chief, each shard written on its own device).
    Another implementation (ttf.distribute's, over the ranks of a synchronous job) gives
    the same five: `writes_shared`, `agree`, `gather`, `table_shards` and `export_base`."""

    writes_shared = True  # this process writes the manifest, the dense part and removes old versions

    def agree(self, value):
        """The value every publishing process acts on (here: this process's own)."""
        return value

    def gather(self, written):
        """Every publishing process's `written` report of a delta (here: this process's)."""
        return [written]

    def table_shards(self, layers):
        """(layer, shard number, table) of every table shard this process publishes."""
        return [(layer, shard, table) for layer in layers for shard, table in enumerate(layer.tables)]

    def export_base(self, model, base, row_dtype):
        """Writes the next base version; returns (version, {table name: [table step of each shard]})."""
        return exported_steps(export_for_serving(model, base, row_dtype=row_dtype, publish_record=True))
