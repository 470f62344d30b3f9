"""DeltaFollower: serves the newest base version and applies its deltas in place (pure TF).

It never imports ttf's op library: the SavedModel holds stock TF ops only, and a delta is
read with tf.io.read_file / tf.fingerprint / tf.io.parse_tensor and applied through the
model's own `apply_delta` / `apply_dense` signatures (see ttf/serving/_publish.py for the
layout and docs/serving.md).
"""
import contextlib
import json
import os
import sys
import threading
import time

import tensorflow as tf

from ttf._durable import read_text
from ttf.serving._export import SERVING_INFO, versions, whole_version
from ttf.serving._publish import DELTAS, FORMAT, FORMAT_INT8, MANIFEST
from ttf.serving._watch import FolderWatch


class DeltaFollower:
    """Follows a Publisher's folder: loads the newest base version, applies its deltas in
    order without reloading, and serves `predict(features)` (the serving_default signature).

    `start()` follows in a background thread: it learns of a new delta or base by inotify
    where `base` is on a local Linux filesystem, else (gs://, s3://, hdfs://, a network
    filesystem: any path tf.io.gfile reaches) by polling every `poll_seconds`
    (`watcher` says which), and syncs at once; `predict` runs meanwhile, never waiting for an
    apply. Or call `sync()` yourself every few seconds. A sync loads a newer base when one
    appears (the only reload: a new base arrives every rebase_every seconds; a version is
    whole once its assets.extra/ttf_serving.json, written last, is there), then applies
    every whole delta after `sequence`. Each table's update is swapped in whole: a `predict`
    sees all of a delta's rows of a table or none (HashedTable), and before applying a delta
    the follower waits for the predictions still reading the mapping two deltas back, whose
    slots it reuses (at most one prediction's time). A delta is applied only when its
    manifest is there and every part's checksum matches; a folder without its manifest is not
    complete yet and is waited for.
    A gap (the next sequence is missing while a later one is there), a duplicate (a
    sequence already applied) or a delta of another base version is refused with one line
    on stderr: the follower keeps serving what it has (`refused` says why) until the next
    base version, which it then loads (re-sync).

    Args:
      base: the Publisher's folder (TF Serving's base path).
      watch: "auto" (inotify where the folder is local, else polling) or "polling".
      poll_seconds: the polling interval, and with inotify the interval of a safety re-check.

    Attributes:
      version: the base version served (None before one exists).
      sequence: the last delta applied (0: the base alone).
      refused: why deltas stopped being applied, until the next base; else None.
      watcher: "inotify" or "polling (<why>)" once started; None before.
      applied_at: time.time() when the last delta was applied (None before one).

    Example:
      >>> follower = ttf.serving.DeltaFollower("/models/ctr").start()  # doctest: +SKIP
      >>> follower.watcher  # doctest: +SKIP
      'inotify'
      >>> follower.predict({"ids": ids, "dense": dense})["probability"]  # doctest: +SKIP
      >>> follower.stop()  # doctest: +SKIP
    """

    def __init__(self, base, watch="auto", poll_seconds=1.0):
        if watch not in ("auto", "polling"):
            raise ValueError(f"DeltaFollower: watch must be 'auto' or 'polling', got {watch!r}")
        if not (isinstance(poll_seconds, (int, float)) and poll_seconds > 0):
            raise ValueError(f"DeltaFollower: poll_seconds must be a number > 0, got {poll_seconds!r}")
        self.base, self._watch_mode, self.poll_seconds = os.fspath(base), watch, poll_seconds
        self.version, self.sequence, self.refused = None, 0, None
        self.watcher = self.applied_at = self._thread = self._watch = None
        self._loaded = self._info = None
        self._sync_lock = threading.RLock()  # one sync or apply at a time; predict never takes it
        # Predictions in flight per mapping generation (bumped after each delta): a delta reuses the
        # slots the mapping before the last one served, so it first waits for their readers.
        self._readers, self._generation = {}, 0
        self._readers_changed = threading.Condition()
        self.sync()

    # -- following in the background

    def start(self):
        """Follows in a background thread (inotify or polling: `watcher`); returns self."""
        if self._thread is not None:
            raise ValueError("DeltaFollower.start: already following; stop() first")
        self._watch = FolderWatch(self.base if tf.io.gfile.isdir(self.base) else os.path.dirname(self.base) or ".",
                                  self._watch_mode)
        self.watcher = self._watch.kind
        self._stopping = False
        self._thread = threading.Thread(target=self._follow, name=f"DeltaFollower({self.base})", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stops the background thread (after the apply it may be in) and waits for it."""
        if self._thread is None:
            return
        self._stopping = True
        self._watch.close()
        self._thread.join()
        self._watch.release()
        self._thread = self._watch = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _follow(self):
        failed = None
        while not self._stopping:
            # watch first, then sync: whatever appears after the sync's listing wakes the wait.
            folders = [self.base, os.path.join(self.base, DELTAS)]
            if self._watch.kind == "inotify" and not os.path.isdir(self.base):  # not published yet: its creation wakes us
                folders.append(os.path.dirname(os.path.abspath(self.base)))
            if self.version is not None:
                folders.append(os.path.join(self.base, DELTAS, str(self.version)))
            self._watch.watch(folders)
            try:
                self.sync()
                failed = None
            except Exception as error:  # noqa: BLE001  (a thread that dies would serve stale rows silently)
                cause = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                if cause != failed:
                    print(f"ttf: DeltaFollower sync failed ({cause}); serving base {self.version} at sequence "
                          f"{self.sequence}, retrying", file=sys.stderr, flush=True)
                failed = cause
            if not self._stopping:
                self._watch.wait(self.poll_seconds)

    def sync(self):
        """Loads a newer base if there is one, then applies the whole deltas that follow;
        returns how many deltas were applied."""
        with self._sync_lock:
            return self._sync()

    def _sync(self):
        for version in reversed(versions(self.base)):  # the newest whole version, if newer than the one served
            if self.version is not None and version <= self.version:
                break
            if whole_version(os.path.join(self.base, str(version))):
                self._load(version)
                break
        if self._loaded is None or self.refused is not None:
            return 0
        applied = 0
        for sequence, path in self._deltas():
            if sequence <= self.sequence:
                continue
            if sequence != self.sequence + 1:
                self._refuse(f"gap: delta {sequence} follows sequence {self.sequence} (delta {self.sequence + 1} "
                             f"is missing)")
                break
            if not self.apply(path):
                break
            applied += 1
        return applied

    def apply(self, path):
        """Applies the delta in folder `path`; True when applied. False, changing nothing, when
        it is not whole yet (no manifest) or was refused (see `refused`)."""
        with self._sync_lock:
            return self._apply(path)

    def _apply(self, path):
        if self._loaded is None:
            raise ValueError(f"DeltaFollower: no base version under {self.base} yet")
        if self.refused is not None:
            return False
        if not tf.io.gfile.exists(os.path.join(path, MANIFEST)):
            return False  # the manifest is written last: not whole yet
        try:
            manifest = json.loads(read_text(os.path.join(path, MANIFEST)))
        except ValueError as err:
            return self._refuse(f"{path}/{MANIFEST}: not a delta manifest ({err})")
        problem = _manifest_problem(manifest)
        if problem:  # untrusted input: checked before any field is used
            return self._refuse(f"{path}/{MANIFEST}: {problem}")
        if manifest.get("format") not in (FORMAT, FORMAT_INT8):
            return self._refuse(f"{path}: delta format {manifest.get('format')!r}, this follower reads {FORMAT} and "
                                f"{FORMAT_INT8}")
        sequence, version = manifest["sequence"], manifest["base_version"]
        if version != self.version:
            return self._refuse(f"wrong base: {path} is a delta of base version {version}, serving {self.version}")
        if sequence <= self.sequence:
            return self._refuse(f"duplicate: {path} is delta {sequence}, sequence {self.sequence} is applied")
        if sequence != self.sequence + 1:
            return self._refuse(f"gap: {path} is delta {sequence}, the next is {self.sequence + 1}")
        names = [table["name"] for table in self._info["tables"]]
        if manifest["tables"] != names:
            return self._refuse(f"{path}: tables {manifest['tables']}, base version {version} has {names}")
        quantized = manifest["row_dtype"] == "int8"
        for table in self._info["tables"]:  # int8 rows go in as they are: both int8 or neither
            if (table.get("row_dtype") == "int8") != quantized or quantized != (manifest["format"] == FORMAT_INT8):
                return self._refuse(f"{path}: {manifest['row_dtype']} rows (format {manifest['format']}) for table "
                                    f"{table['name']!r} of {table.get('row_dtype', 'float32')} rows: publish with the "
                                    f"base's row_dtype")
        row_dtype = tf.int8 if quantized else tf.dtypes.as_dtype(manifest["row_dtype"])
        tables = {name: ([], [], [], []) for name in names}  # keys, rows, deleted, scale_bias
        for part in manifest["parts"]:
            if part["table"] not in tables:
                return self._refuse(f"{path}: a part of table {part['table']!r}, which base version {version} lacks")
            fields = self._read(path, part)
            if fields is None:
                return False
            if fields.shape[0] != (4 if quantized else 3):
                return self._refuse(f"{path}/{part['file']}: {fields.shape[0]} fields, a {manifest['row_dtype']} "
                                    f"delta has {4 if quantized else 3}")
            keys, rows, deleted, scale_bias = tables[part["table"]]
            keys.append(tf.io.parse_tensor(fields[0], tf.int64))
            parsed = tf.io.parse_tensor(fields[1], row_dtype)
            rows.append(parsed if quantized else tf.cast(parsed, tf.float32))
            deleted.append(tf.io.parse_tensor(fields[2], tf.int64))
            if quantized:
                scale_bias.append(tf.io.parse_tensor(fields[3], tf.float32))
        dense = None
        if manifest.get("dense"):
            fields = self._read(path, manifest["dense"])
            if fields is None:
                return False
            dense = {f"dense_{j}": tf.io.parse_tensor(blob, tf.dtypes.as_dtype(spec["dtype"]))
                     for j, (blob, spec) in enumerate(zip(fields, self._info["dense"]))}
        inputs = {"sequence": tf.constant(sequence, tf.int64), "base_version": tf.constant(version, tf.int64)}
        for i, (name, table) in enumerate(zip(names, self._info["tables"])):
            keys, rows, deleted, scale_bias = tables[name]
            inputs[f"keys_{i}"] = tf.concat(keys, 0) if keys else tf.zeros([0], tf.int64)
            inputs[f"rows_{i}"] = tf.concat(rows, 0) if rows else tf.zeros([0, table["dim"]], row_dtype if quantized
                                                                             else tf.float32)
            inputs[f"deleted_{i}"] = tf.concat(deleted, 0) if deleted else tf.zeros([0], tf.int64)
            if quantized:
                inputs[f"scale_bias_{i}"] = tf.concat(scale_bias, 0) if scale_bias else tf.zeros([0, 2])
        with self._readers_changed:  # predictions that may still read the slots this delta reuses
            self._readers_changed.wait_for(lambda: all(g >= self._generation for g in self._readers))
        if dense is not None:
            self._loaded.signatures["apply_dense"](**dense)
        self._loaded.signatures["apply_delta"](**inputs)
        with self._readers_changed:
            self._generation += 1
        self.sequence, self.applied_at = sequence, time.time()
        return True

    @contextlib.contextmanager
    def _reading(self):
        """The loaded model, registered as read under the current mapping generation."""
        with self._readers_changed:
            generation, loaded = self._generation, self._loaded
            self._readers[generation] = self._readers.get(generation, 0) + 1
        try:
            yield loaded
        finally:
            with self._readers_changed:
                self._readers[generation] -= 1
                if not self._readers[generation]:
                    del self._readers[generation]
                    self._readers_changed.notify_all()

    def predict(self, features):
        """The serving_default signature on `features` ({input name: array}); a dict of outputs."""
        if self._loaded is None:
            raise ValueError(f"DeltaFollower: no base version under {self.base} yet")
        features = {k: tf.convert_to_tensor(v) for k, v in features.items()}
        with self._reading() as loaded:
            return loaded.signatures["serving_default"](**features)

    def lookup(self, table, keys):
        """The rows served for `keys` (int64 [K]) of the table named `table`: float32 [K, dim]."""
        names = [t["name"] for t in self._info["tables"]]
        if table not in names:
            raise ValueError(f"DeltaFollower.lookup: no table {table!r} in base version {self.version}; it has {names}")
        keys = tf.convert_to_tensor(keys, tf.int64)
        inputs = {f"keys_{i}": keys if name == table else tf.zeros([0], tf.int64) for i, name in enumerate(names)}
        with self._reading() as loaded:
            return loaded.signatures["lookup"](**inputs)[f"rows_{names.index(table)}"]

    # -- helpers

    def _load(self, version):
        path = os.path.join(self.base, str(version))
        info = json.loads(read_text(os.path.join(path, SERVING_INFO)))
        loaded = tf.saved_model.load(path)
        with self._readers_changed:  # predictions already running keep the version they started on
            self._loaded, self._info = loaded, info  # the previous version is released after them
        self.version, self.sequence, self.refused = version, 0, None

    def _deltas(self):
        """[(sequence, folder)] of the current base's whole-named deltas, ascending."""
        folder = os.path.join(self.base, DELTAS, str(self.version))
        if not tf.io.gfile.isdir(folder):
            return []
        names = [name.rstrip("/") for name in tf.io.gfile.listdir(folder)]
        return sorted((int(name), os.path.join(folder, name)) for name in names if name.isdigit())

    def _read(self, path, part):
        """A part's three (or, dense, N) serialized tensors, after its checksum; None if refused."""
        blob = tf.io.read_file(os.path.join(path, part["file"]))
        if bytes(tf.fingerprint(tf.reshape(blob, [1]))[0].numpy()).hex() != part["fingerprint"]:
            return self._refuse(f"{path}/{part['file']}: checksum mismatch (a damaged or partly written file)") or None
        return tf.io.parse_tensor(blob, tf.string)

    def _refuse(self, reason):
        self.refused = reason
        print(f"ttf: DeltaFollower refuses {reason}; serving base {self.version} at sequence {self.sequence} until "
              f"the next base version", file=sys.stderr, flush=True)
        return False


def _manifest_problem(manifest):
    """What makes `manifest` unusable (a missing field, a part file that is not a plain name in
    the delta's folder), or None: a delta folder never makes the follower read outside it."""
    try:
        for field in ("format", "sequence", "base_version", "tables", "parts", "row_dtype"):
            manifest[field]  # noqa: B018  (presence)
        parts = list(manifest["parts"]) + ([manifest["dense"]] if manifest.get("dense") else [])
        for part in parts:
            name = part["file"]
            if not isinstance(name, str) or not name or name != os.path.basename(name) or name.startswith("."):
                return f"part file {name!r} is not a file name in the delta's folder (refused: never read outside it)"
            part["fingerprint"]  # noqa: B018
    except (KeyError, TypeError) as err:
        return f"malformed (missing or wrong field: {err!r})"
    return None
