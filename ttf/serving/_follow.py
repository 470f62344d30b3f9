"""DeltaFollower: serves the newest base version and applies its deltas in place (pure TF).

It never imports ttf's op library: the SavedModel holds stock TF ops only, and a delta is
read with tf.io.read_file / tf.fingerprint / tf.io.parse_tensor and applied through the
model's own `apply_delta` / `apply_dense` signatures (see ttf/serving/_publish.py for the
layout and docs/serving.md).
"""
import json
import os
import sys

import tensorflow as tf

from ttf.serving._export import SERVING_INFO, versions
from ttf.serving._publish import DELTAS, FORMAT, FORMAT_INT8, MANIFEST


class DeltaFollower:
    """Follows a Publisher's folder: loads the newest base version, applies its deltas in
    order without reloading, and serves `predict(features)` (the serving_default signature).

    `sync()` (call it every few seconds) loads a newer base when one appears (the only
    reload: a new base arrives every rebase_every seconds), then applies every whole delta
    after `sequence`. A delta is applied only when its manifest is there and every part's
    checksum matches; a folder without its manifest is not complete yet and is waited for.
    A gap (the next sequence is missing while a later one is there), a duplicate (a
    sequence already applied) or a delta of another base version is refused with one line
    on stderr: the follower keeps serving what it has (`refused` says why) until the next
    base version, which it then loads (re-sync).

    Args:
      base: the Publisher's folder (TF Serving's base path).

    Attributes:
      version: the base version served (None before one exists).
      sequence: the last delta applied (0: the base alone).
      refused: why deltas stopped being applied, until the next base; else None.

    Example:
      >>> follower = ttf.serving.DeltaFollower("/models/ctr")  # doctest: +SKIP
      >>> follower.sync()  # doctest: +SKIP
      3
      >>> follower.predict({"ids": ids, "dense": dense})["probability"]  # doctest: +SKIP
    """

    def __init__(self, base):
        self.base = os.fspath(base)
        self.version, self.sequence, self.refused = None, 0, None
        self._loaded = self._info = None
        self.sync()

    def sync(self):
        """Loads a newer base if there is one, then applies the whole deltas that follow;
        returns how many deltas were applied."""
        found = versions(self.base)
        if found and (self.version is None or found[-1] > self.version):
            self._load(found[-1])
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
        if self._loaded is None:
            raise ValueError(f"DeltaFollower: no base version under {self.base} yet")
        if self.refused is not None:
            return False
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            return False  # the manifest is written last: not whole yet
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
        if manifest.get("dense"):
            fields = self._read(path, manifest["dense"])
            if fields is None:
                return False
            dense = self._info["dense"]
            self._loaded.signatures["apply_dense"](**{
                f"dense_{j}": tf.io.parse_tensor(blob, tf.dtypes.as_dtype(spec["dtype"]))
                for j, (blob, spec) in enumerate(zip(fields, dense))})
        inputs = {"sequence": tf.constant(sequence, tf.int64), "base_version": tf.constant(version, tf.int64)}
        for i, (name, table) in enumerate(zip(names, self._info["tables"])):
            keys, rows, deleted, scale_bias = tables[name]
            inputs[f"keys_{i}"] = tf.concat(keys, 0) if keys else tf.zeros([0], tf.int64)
            inputs[f"rows_{i}"] = tf.concat(rows, 0) if rows else tf.zeros([0, table["dim"]], row_dtype if quantized
                                                                             else tf.float32)
            inputs[f"deleted_{i}"] = tf.concat(deleted, 0) if deleted else tf.zeros([0], tf.int64)
            if quantized:
                inputs[f"scale_bias_{i}"] = tf.concat(scale_bias, 0) if scale_bias else tf.zeros([0, 2])
        self._loaded.signatures["apply_delta"](**inputs)
        self.sequence = sequence
        return True

    def predict(self, features):
        """The serving_default signature on `features` ({input name: array}); a dict of outputs."""
        if self._loaded is None:
            raise ValueError(f"DeltaFollower: no base version under {self.base} yet")
        return self._loaded.signatures["serving_default"](**{k: tf.convert_to_tensor(v) for k, v in features.items()})

    def lookup(self, table, keys):
        """The rows served for `keys` (int64 [K]) of the table named `table`: float32 [K, dim]."""
        names = [t["name"] for t in self._info["tables"]]
        if table not in names:
            raise ValueError(f"DeltaFollower.lookup: no table {table!r} in base version {self.version}; it has {names}")
        keys = tf.convert_to_tensor(keys, tf.int64)
        inputs = {f"keys_{i}": keys if name == table else tf.zeros([0], tf.int64) for i, name in enumerate(names)}
        return self._loaded.signatures["lookup"](**inputs)[f"rows_{names.index(table)}"]

    # -- helpers

    def _load(self, version):
        path = os.path.join(self.base, str(version))
        with open(os.path.join(path, SERVING_INFO)) as f:
            info = json.load(f)
        loaded = tf.saved_model.load(path)
        self._loaded, self._info = loaded, info  # the previous version is released here
        self.version, self.sequence, self.refused = version, 0, None

    def _deltas(self):
        """[(sequence, folder)] of the current base's whole-named deltas, ascending."""
        folder = os.path.join(self.base, DELTAS, str(self.version))
        if not os.path.isdir(folder):
            return []
        return sorted((int(name), os.path.join(folder, name)) for name in os.listdir(folder) if name.isdigit())

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
