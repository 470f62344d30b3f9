"""Criteo-format input: raw Kaggle TSV or CSV-with-header, plain or gzip, parsed in C++."""
import gzip
import os

import tensorflow as tf

from ttf._ops import ops

NUM_DENSE = 13
NUM_FIELDS = 26
FIELD_SHIFT = 56
MISSING_VALUE = (1 << FIELD_SHIFT) - 1
_HASH_BASE = 1 << 32
CSV_HEADER = ",".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])


def field_key(field, value):
    """The int64 key of categorical `value` (a string) in `field` (0..25): a pure-Python
    statement of the contract the C++ parser implements.

    (field << 56) | v, where v is the value itself for up to 8 hex digits (Criteo's form:
    exact, no collisions), a 64-bit FNV-1a hash folded into [2^32, 2^56 - 1) for any other
    string, and 2^56 - 1 for a missing (empty) value.
    """
    if not 0 <= field < NUM_FIELDS:
        raise ValueError(f"field must be in [0, {NUM_FIELDS}), got {field}")
    if value == "":
        v = MISSING_VALUE
    elif len(value) <= 8 and all(c in "0123456789abcdefABCDEF" for c in value):
        v = int(value, 16)
    else:
        h = 0xCBF29CE484222325
        for byte in value.encode():
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        v = _HASH_BASE + h % (MISSING_VALUE - _HASH_BASE)
    return (field << FIELD_SHIFT) | v


def _first_line(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        return f.readline()


class CriteoReader:
    """Reads Criteo files into batches for training.

    Each file may be the raw Kaggle form (tab separated, no header: label, I1..I13,
    C1..C26) or the CSV form with the header `label,I1,...,C26`; `.gz` files are read as
    gzip. Elements are `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])`
    with ids tagged by field (see field_key) and dense = log(1 + max(x, 0)), missing as 0.

    strict=True (default) fails on the first bad line with `file:line: reason`;
    strict=False skips bad lines and counts them in `bad_lines` (read it, or call
    `report()`, after the data was consumed).

    Example:
      >>> import ttf
      >>> reader = ttf.data.CriteoReader(["data/criteo_sample.txt"])
      >>> features, labels = next(iter(reader.dataset(batch_size=32, shuffle=False)))
      >>> features["ids"].shape, features["dense"].shape, labels.shape
      (TensorShape([32, 26]), TensorShape([32, 13]), TensorShape([32]))
    """

    def __init__(self, paths, strict=True):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("CriteoReader needs at least one file")
        for path in self.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Criteo data file not found: {path}")
        self.strict = strict
        with tf.init_scope():
            self._bad_lines = tf.Variable(0, dtype=tf.int64, trainable=False, name="criteo_bad_lines")

    @property
    def bad_lines(self):
        """Lines skipped so far (strict=False)."""
        return int(self._bad_lines.numpy())

    def report(self):
        """Prints (and returns) the number of skipped bad lines."""
        message = f"[data] skipped {self.bad_lines} bad line(s) in {', '.join(self.paths)}"
        print(message, flush=True)
        return message

    def _lines(self, path):
        """(filename, line number, line) for each data line of one file."""
        has_header = _first_line(path).startswith("label,")
        compression = "GZIP" if path.endswith(".gz") else None
        lines = tf.data.TextLineDataset(path, compression_type=compression)
        first = 1
        if has_header:
            lines, first = lines.skip(1), 2
        return lines.enumerate(start=first).map(lambda number, line: (tf.constant(path), number, line))

    def dataset(self, batch_size, shuffle=True, seed=0, num_epochs=1, drop_remainder=False,
                shuffle_buffer=100_000, split="all", holdout_every=5):
        """A tf.data.Dataset of parsed batches.

        Args:
          batch_size: lines per batch (batches may be smaller with strict=False when bad
            lines were skipped, and the last one when drop_remainder=False).
          shuffle: shuffle lines with a buffer of shuffle_buffer and the given seed.
          num_epochs: passes over the files; None repeats forever.
          split: "all"; or "eval" (every holdout_every-th line of each file, by line
            number) and "train" (the others): a deterministic held-out split.
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if split not in ("all", "train", "eval"):
            raise ValueError(f"split must be 'all', 'train' or 'eval', got {split!r}")
        files = [self._lines(p) for p in self.paths]
        lines = files[0]
        for more in files[1:]:
            lines = lines.concatenate(more)
        if split != "all":
            in_eval = split == "eval"
            lines = lines.filter(lambda path, number, line: tf.equal(number % holdout_every == 0, in_eval))
        if shuffle:
            lines = lines.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        lines = lines.repeat(num_epochs).batch(batch_size, drop_remainder=drop_remainder)
        strict, bad_lines = self.strict, self._bad_lines

        def parse(filenames, numbers, text):
            labels, dense, ids, bad = ops().ttf_parse_criteo(text, filenames, numbers, strict=strict)
            if not strict:
                bad_lines.assign_add(bad)
            return {"ids": ids, "dense": dense}, labels

        return lines.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def criteo_dataset(paths, batch_size, *, shuffle=True, seed=0, num_epochs=1, strict=True, drop_remainder=False):
    """Shorthand for CriteoReader(paths, strict).dataset(batch_size, ...)."""
    return CriteoReader(paths, strict).dataset(batch_size, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
                                               drop_remainder=drop_remainder)
