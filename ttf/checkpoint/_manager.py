"""CheckpointManager: full checkpoints and delta checkpoints between them."""
import contextlib
import json
import os
import re
import sys
import time

import tensorflow as tf
from google.protobuf import message as message_lib

from ttf._durable import fsync_path
from ttf._errors import error_summary
from ttf.embedding._logical import LogicalTable

_CHAIN_FILE = "ttf_chain.json"
# Errors of the network or of a task of the cluster, not of the disk: a worker that dies while
# the chief saves (TensorFlow's coordinator re-connects the cluster then) can fail a save that a
# second attempt completes. A lost parameter server fails every attempt and the error is raised.
_TRANSIENT = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
              tf.errors.DeadlineExceededError)
_CHAIN_ENTRY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*-[0-9]+$")  # a file prefix in the folder: ckpt-3, delta-7


class _Mode:
    """One save's or restore's state, as the LogicalTables of the checkpoint see it
    (ttf/checkpoint/_format.py): a delta or not; `since`, {layer name: table step a delta
    starts after}; `rank_parts`, the parts every rank of a synchronous job wrote (or None);
    `steps`, {layer name: table step} written or read, filled in as the tables go."""

    def __init__(self, delta, since=None, rank_parts=None):
        self.delta, self.since, self.rank_parts = delta, since or {}, rank_parts
        self.steps = {}


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
        self._saved_steps = {}  # {layer name: table step} of the last durable save or restore: a delta starts there

    @property
    def last_step(self):
        """The step of the last save or restore by this manager, or None."""
        return self._last_step

    @property
    def latest(self):
        """The path of the newest file of the chain (full or delta), or None."""
        if not self._chain:
            return None
        return self._path((self._chain["deltas"] or [self._chain["full"]])[-1])

    def _path(self, name):
        return os.path.join(self.directory, name)

    def delta_plan(self):
        """What the next save() writes: None for a full checkpoint, else {layer name: table
        step the delta starts after} for each ttf table. On synchronous ranks every rank exports its part of the
        same kind, with rank 0's plan (ttf.distribute's save)."""
        names = [t.layer.name for t in self._tables()]
        if not (self._chain is not None and self._last_step is not None and self.full_every > 1
                and len(self._chain["deltas"]) + 1 < self.full_every
                and all(name in self._saved_steps for name in names)):
            return None
        # Only updates change a table, and an update after a save at table step S marks its
        # rows and candidates last-seen > S, so rows seen after S are every row that changed
        # since that save (TtfTableExportDelta's contract). The table step, not the global
        # step: a skipped (non-finite) step does not advance it.
        return {name: self._saved_steps[name] for name in names}

    def begin_save(self, table):
        """Before a save of the LogicalTable `table`: the first one (no durable save yet)
        starts the record of deleted ids, which each shard's copy takes and the commit forgets,
        so an id deleted after its shard was copied reaches the next delta."""
        if table.layer.name not in self._saved_steps:
            table.layer.reset_deleted()

    def saved_by_rank_0(self, table_steps):
        """On a rank other than 0 of a synchronous job, once rank 0's save of every rank's
        parts is durable: {layer name: table step} it wrote (where the next delta starts);
        the deleted ids this rank's part took are forgotten."""
        self._saved_steps.update(table_steps)
        for table in self._tables():
            if table.layer.name in table_steps:
                table.layer.commit_save()

    def save(self, step, retries=2, retry_wait=5.0, rank_parts=None):
        """Writes a full or a delta checkpoint for global step `step`; returns its path.

        Atomic and durable: the files are written and fsynced, then the chain file is
        replaced (a temporary file, fsynced, renamed), and only then does the save count
        (the step deltas start after, each table's record of deleted ids). A save that
        raises changes nothing: the previous checkpoint stays restorable and the next
        delta holds everything since the last save that completed.

        A save failing with a network error (a task of the cluster lost mid-save) is tried
        again up to `retries` times, `retry_wait` seconds apart, saying so on stderr; other
        errors (a full disk, say) are raised at once.

        rank_parts: on rank 0 of a synchronous job, the table parts every rank wrote
        ({"delta", "prefixes", "layouts"}, ttf.distribute's save), merged into this checkpoint."""
        failed = 0
        while True:
            try:
                return self._save_once(int(step), rank_parts)
            except _TRANSIENT as error:
                failed += 1
                if failed > retries:
                    raise
                print(f"[ttf] checkpoint: {error_summary(error)}; trying again in {retry_wait:g} s "
                      f"(attempt {failed + 1} of {retries + 1})", file=sys.stderr, flush=True)
                time.sleep(retry_wait)

    def _save_once(self, step, rank_parts):
        tables = self._tables()
        # A save traced in a tf.function (one spanning several tasks) cannot note the step it
        # exported: the table step before it is a safe start for the next delta (it may repeat rows).
        steps_before = {t.layer.name: max(int(shard.stats()[2]) for shard in t.layer.tables) for t in tables}
        for table in tables:
            if table.layer.sharding is None:  # synchronous ranks: their save did it on every rank
                self.begin_save(table)
        plan = self.delta_plan()
        mode = _Mode(plan is not None, plan, rank_parts)
        if plan is not None:
            path = os.path.join(self.directory, f"delta-{step}")
            with self._mode(mode), self._failed_save(path):
                self.checkpoint.write(path)
            chain = {"full": self._chain["full"], "deltas": self._chain["deltas"] + [os.path.basename(path)]}
            old = []
        else:
            with self._mode(mode), self._failed_save(os.path.join(self.directory, f"ckpt-{step}")):
                path = self._full.save(checkpoint_number=step)
            chain = {"full": os.path.basename(path), "deltas": []}
            old = self._chain["deltas"] if self._chain else []
        _sync(path)
        self._write_chain(chain)
        # The save is durable: from here on it counts.
        self._saved_steps = {**steps_before, **mode.steps}
        for table in tables:  # the deletions it took are saved; later ones belong to the next delta
            table.layer.commit_save()
        for name in old:
            for file in tf.io.gfile.glob(os.path.join(self.directory, name) + ".*"):
                tf.io.gfile.remove(file)
        self._last_step = step
        return path

    @contextlib.contextmanager
    def _failed_save(self, path):
        try:
            yield
        except tf.errors.OpError as error:
            kept = self.latest or "none yet"
            raise type(error)(error.node_def, error.op,
                              f"ttf: the save of {path} failed (nothing recorded; the last complete checkpoint, "
                              f"{kept}, is intact): {error.message}") from error

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
        full, deltas = self._path(self._chain["full"]), _Mode(delta=True)
        with self._mode(_Mode(delta=False)) as mode:
            _restore(self.checkpoint, full)
        _check_every_table_restored(tables, full)
        with self._mode(deltas):
            for name in self._chain["deltas"]:
                _restore(self.checkpoint, self._path(name))
        self._saved_steps = {**mode.steps, **deltas.steps}
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
            yield mode
        finally:
            for table in tables:
                table.mode = None

    def _read_chain(self):
        """The chain file, checked as untrusted input: its entries are names of files in
        this folder (refused, naming the entry, when absolute elsewhere or escaping it)."""
        path = os.path.join(self.directory, _CHAIN_FILE)
        if not tf.io.gfile.exists(path):
            return None
        try:
            with tf.io.gfile.GFile(path) as f:
                chain = json.load(f)
            entries = [chain["full"], *chain["deltas"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a ttf chain file (corrupt or truncated: {error}); restore from "
                             "another directory, or remove it to restore the latest full checkpoint") from None
        if not isinstance(chain["deltas"], list):
            raise ValueError(f"{path} is not a ttf chain file: 'deltas' must be a list")
        chain = {"full": self._chain_entry(path, chain["full"]),
                 "deltas": [self._chain_entry(path, entry) for entry in entries[1:]]}
        if not tf.io.gfile.exists(self._path(chain["full"]) + ".index"):
            raise FileNotFoundError(f"{path} names the full checkpoint {chain['full']}, which is missing; "
                                    "restore from another directory or remove the chain file")
        return chain

    def _chain_entry(self, path, entry):
        """The file name a chain entry gives, refusing one that leaves this folder. Chains of
        earlier ttf versions hold absolute paths: such an entry is read by its file name in
        this folder (so a moved folder restores), never at the path it names."""
        if isinstance(entry, str) and os.path.isabs(entry) and _CHAIN_ENTRY.match(os.path.basename(entry)):
            entry = os.path.basename(entry)
        if not isinstance(entry, str) or not _CHAIN_ENTRY.match(entry):
            raise ValueError(f"{path} holds the entry {entry!r}, which is not the name of a checkpoint in this "
                             "folder ('..' and paths elsewhere are refused: a checkpoint folder never makes ttf "
                             "read outside it); fix or remove the chain file")
        return entry

    def _write_chain(self, chain):
        """Replaces the chain file atomically and durably (temporary file, fsync, rename, fsync dir)."""
        path = os.path.join(self.directory, _CHAIN_FILE)
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            json.dump(chain, f)
        _sync(path + ".tmp", glob=False)
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
        fsync_path(self.directory)
        self._chain = chain


def _restore(checkpoint, path):
    """Restores `path`, turning a missing or corrupt file into one error naming the checkpoint."""
    try:
        # expect_partial: a job's parts made later (optimizer slots at the first step) would
        # each print a "Value in checkpoint could not be found" warning that means nothing.
        checkpoint.restore(path).expect_partial()
    # IndexError: TensorFlow's checkpoint reader on a truncated file ("Read less bytes than requested").
    except (tf.errors.OpError, ValueError, IndexError, message_lib.DecodeError) as error:
        message = error.message if isinstance(error, tf.errors.OpError) else str(error)
        raise ValueError(f"checkpoint {path} cannot be restored (a file is missing or corrupt): {message}") from None


def _sync(path, glob=True):
    """fsyncs `path` (with glob, every file of the checkpoint prefix `path`) and its folder."""
    for name in tf.io.gfile.glob(path + ".*") if glob else [path]:
        fsync_path(name)
    fsync_path(os.path.dirname(path) or ".")


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

