"""CheckpointManager: full checkpoints and delta checkpoints between them."""
import contextlib
import json
import os

import tensorflow as tf

from ttf.embedding._logical import EXPORT_FIELDS, LogicalTable

_CHAIN_FILE = "ttf_chain.json"
_DELTA_FIELDS = EXPORT_FIELDS + ("deleted_keys",)
_DELTA_DTYPES = {"keys": tf.int64, "values": tf.float32, "meta": tf.int64, "candidate_keys": tf.int64,
                 "candidate_meta": tf.int64, "optimizer": tf.string, "slot_init": tf.float32, "step": tf.int64,
                 "deleted_keys": tf.int64}


class _FullSave:
    """A full save that also starts each table's record of deleted ids (the chain's base)."""

    def serialize(self, logical):
        return logical.layer.export_table(reset_deleted=True)


class _DeltaSave:
    def serialize(self, logical):
        # Since the last save's step: see CheckpointManager.delta_plan.
        delta = logical.layer.export_table(since_step=logical.saved_step, reset_deleted=True)
        return {f"delta_{name}": tensor for name, tensor in delta.items()}


class _DeltaRestore:
    def serialize(self, logical):
        # Only the names and dtypes matter: the restore reads the tensors from the file.
        return {f"delta_{name}": tf.zeros([0], dtype) if name not in ("optimizer", "step") else tf.zeros([], dtype)
                for name, dtype in _DELTA_DTYPES.items()}

    def restore(self, logical, restored_tensors):
        return logical.layer.import_table({name: restored_tensors[f"delta_{name}"] for name in _DELTA_FIELDS})


class CheckpointManager:
    """Saves `checkpoint` (a tf.train.Checkpoint holding the model, optimizer, ...) into
    `directory`: every `full_every`-th save is a full checkpoint (kept by a
    tf.train.CheckpointManager, so tf.train.latest_checkpoint(directory) names the last
    full one), the saves between are deltas (`delta-<step>`, only what changed). The chain
    (last full + its deltas) is recorded in `ttf_chain.json`, replaced atomically after
    each file is written; starting a new full checkpoint deletes the old chain's deltas.

    Args:
      checkpoint: a tf.train.Checkpoint; the ttf embeddings reachable from it get deltas.
      directory: where to write.
      full_every: 1 (default): every save is full; M: a full save, then M - 1 deltas.
      max_to_keep: full checkpoints kept.

    Example:
      >>> import ttf, tensorflow as tf, tempfile
      >>> layer, opt = ttf.DynamicEmbedding(4), ttf.optimizers.Adam(0.1)
      >>> manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer, optimizer=opt),
      ...                                            tempfile.mkdtemp(), full_every=4)
      >>> _ = layer(tf.constant([1, 2], tf.int64), training=True)
      >>> manager.save(step=1)  # doctest: +ELLIPSIS
      '.../ckpt-1'
      >>> _ = layer(tf.constant([3], tf.int64), training=True)
      >>> manager.save(step=2)  # doctest: +ELLIPSIS
      '.../delta-2'
      >>> manager.restore_latest()
      2
    """

    def __init__(self, checkpoint, directory, full_every=1, max_to_keep=3):
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        self.checkpoint, self.directory, self.full_every = checkpoint, directory, full_every
        self._full = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=max_to_keep)
        self._chain = self._read_chain()
        self._last_step = None  # the step of the last save or restore: deltas start after it

    @property
    def last_step(self):
        """The step of the last save or restore by this manager, or None."""
        return self._last_step

    @property
    def latest(self):
        """The newest file of the chain (full or delta), or None."""
        if not self._chain:
            return None
        return (self._chain["deltas"] or [self._chain["full"]])[-1]

    def delta_plan(self):
        """What the next save() writes: None for a full checkpoint, else {layer name: table
        step the delta starts after} for each ttf table. On Horovod every rank exports its
        part of the same kind: tdh.gathered_tables(model, delta=plan) with rank 0's plan."""
        if not (self._chain is not None and self._last_step is not None and self.full_every > 1
                and len(self._chain["deltas"]) + 1 < self.full_every
                and all(t.saved_step is not None for t in self._tables())):
            return None
        # Only updates change a table, and an update after a save at table step S marks its
        # rows and candidates last-seen > S, so rows seen after S are every row that changed
        # since that save (TtfTableExportDelta's contract). The table step, not the global
        # step: a skipped (non-finite) step does not advance it.
        return {t.layer.name: t.saved_step for t in self._tables()}

    def save(self, step):
        """Writes a full or a delta checkpoint for global step `step`; returns its path."""
        step = int(step)
        if self.delta_plan() is not None:
            path = os.path.join(self.directory, f"delta-{step}")
            with self._mode(_DeltaSave()):
                self.checkpoint.write(path)
            self._write_chain({"full": self._chain["full"], "deltas": self._chain["deltas"] + [path]})
        else:
            with self._mode(_FullSave()):
                path = self._full.save(checkpoint_number=step)
            old = self._chain["deltas"] if self._chain else []
            self._write_chain({"full": path, "deltas": []})
            for prefix in old:
                for name in tf.io.gfile.glob(prefix + ".*"):
                    tf.io.gfile.remove(name)
        self._last_step = step
        return path

    def restore_latest(self):
        """Restores the chain's full checkpoint and then each delta; returns the restored
        step (from the last file's name), or None when the directory holds no checkpoint.
        A directory written by tf.train.CheckpointManager alone restores its latest."""
        if self._chain is None:
            latest = self._full.latest_checkpoint
            if latest is None:
                return None
            self._chain = {"full": latest, "deltas": []}
        tables = self._tables()
        for table in tables:
            table.restored = False
        self.checkpoint.restore(self._chain["full"])
        _check_every_table_restored(tables, self._chain["full"])
        with self._mode(_DeltaRestore()):
            for path in self._chain["deltas"]:
                self.checkpoint.restore(path)
        for table in self._tables():  # deletions from here on belong to the next delta
            table.layer.reset_deleted()
        self._last_step = int(self.latest.rsplit("-", 1)[1])
        return self._last_step

    # -- helpers

    def _tables(self):
        return [t for t in tf.train.TrackableView(self.checkpoint).descendants() if isinstance(t, LogicalTable)]

    @contextlib.contextmanager
    def _mode(self, mode):
        tables = self._tables()
        for table in tables:
            table.mode = mode
        try:
            yield
        finally:
            for table in tables:
                table.mode = None

    def _read_chain(self):
        path = os.path.join(self.directory, _CHAIN_FILE)
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as f:
            chain = json.load(f)
        if not tf.io.gfile.exists(chain["full"] + ".index"):
            raise FileNotFoundError(f"{path} names the full checkpoint {chain['full']}, which is missing; "
                                    "restore from another directory or remove the chain file")
        return chain

    def _write_chain(self, chain):
        path = os.path.join(self.directory, _CHAIN_FILE)
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            json.dump(chain, f)
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
        self._chain = chain


def _check_every_table_restored(tables, path):
    """Raises when `path` held nothing for a table: its ids would otherwise start empty, silently."""
    missing = [t.layer.name for t in tables if not t.restored]
    if not missing:
        return
    names = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    old_format = any("/tables/" in n and n.endswith("/keys") for n in names)
    cause = ("it holds one entry per table shard, written by ttf before checkpoints held the logical table; "
             "restore it with that ttf version and save again, or train from scratch"
             if old_format else "it was written by another model (different layer names or structure)")
    raise ValueError(f"checkpoint {path} holds no table for the ttf layers {missing}: {cause}")
