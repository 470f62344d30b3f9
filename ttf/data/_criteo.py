"""Criteo-format input: raw Kaggle TSV or CSV-with-header, plain or gzip, parsed in C++.

The pipeline reads each file as blocks of `block_lines` consecutive lines (so every
per-element tf.data step runs once per block, not once per line), numbers the lines,
parses each block with one TtfParseCriteo call (in parallel over blocks and over lines),
shuffles, and cuts batches of exactly `batch_size` rows with `Dataset.rebatch`.
"""
import gzip
import os
import sys

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

    key = (field << 56) | v, where v is the value itself for up to 8 hex digits (Criteo's
    form: exact, no collisions; case-insensitive), a 64-bit FNV-1a hash of the UTF-8 bytes
    folded into [2^32, 2^56 - 1) for any other string, and 2^56 - 1 (MISSING_VALUE) for a
    missing (empty) value. The field in the top byte keeps fields apart, so all 26 fields
    can share one embedding table.

    Raises:
      ValueError: field is not in [0, 26).

    Example:
      >>> import ttf
      >>> hex(ttf.data.field_key(2, "05db9164"))
      '0x200000005db9164'
      >>> ttf.data.field_key(0, "") == ttf.data.MISSING_VALUE
      True
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


def _has_header(path):
    """True when the file's first line is a header (first field `label`): the CSV form."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        first = f.readline()
    return first.split(",")[0].split("\t")[0].strip() == "label"


class CriteoReader:
    """Reads Criteo files into batches for training.

    Each file may be the raw Kaggle form (tab separated, no header: label, I1..I13,
    C1..C26) or the CSV form with the header `label,I1,...,C26`; `.gz` files are read as
    gzip. Elements are `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])`:
    ids are keys tagged by field (see `field_key`), dense = log(1 + max(x, 0)) with a
    missing value as 0, label 0 or 1.

    strict=True (default) fails on the first bad line (wrong field count, label not 0/1,
    integer column not a number) with InvalidArgumentError `file:line: bad Criteo line: why`.
    strict=False skips bad lines and counts them: `bad_lines` (all datasets of this reader,
    all passes so far), `report()`, and a line `ttf.data: skipped K more bad line(s), N in
    all, ...` printed to stderr at the end of every pass that skipped lines. Nothing is
    dropped silently.

    Args:
      paths: a file name or a list of them (str or os.PathLike).
      strict: fail on a bad line (True) or skip and count it (False).

    Raises:
      ValueError: no paths. FileNotFoundError: a file does not exist.

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
        self._first_lines = [2 if _has_header(p) else 1 for p in self.paths]
        with tf.init_scope():
            self._bad_lines = tf.Variable(0, dtype=tf.int64, trainable=False, name="criteo_bad_lines")
            self._reported = tf.Variable(0, dtype=tf.int64, trainable=False, name="criteo_bad_lines_printed")

    @property
    def bad_lines(self):
        """Lines skipped so far (strict=False), over every dataset of this reader."""
        return int(self._bad_lines.numpy())

    def report(self):
        """Prints (and returns) the number of skipped bad lines."""
        message = f"[data] skipped {self.bad_lines} bad line(s) in {', '.join(self.paths)}"
        print(message, flush=True)
        return message

    def dataset(self, batch_size, shuffle=True, seed=0, num_epochs=1, drop_remainder=False,
                shuffle_buffer=100_000, split="all", holdout_every=5, block_lines=512, shuffle_window=65_536):
        """A tf.data.Dataset of parsed batches.

        Args:
          batch_size: rows per batch; every batch has exactly batch_size rows (also when
            bad lines were skipped) except the last, which drop_remainder=True drops.
          shuffle: shuffle in two stages, deterministic given seed and different in every
            pass: blocks of block_lines consecutive lines through a buffer of
            shuffle_buffer rows (and the file order), then rows within windows of
            shuffle_window rows, so a batch mixes rows of many distant blocks. Without
            shuffle, rows come in file order, files in the order given.
          seed: the shuffle seed.
          num_epochs: passes over the files; None repeats forever.
          split: "all"; or "eval" (lines whose 1-based number is a multiple of
            holdout_every) and "train" (the others): a deterministic held-out split.
          block_lines: lines per parse call (tf.data work is per block, not per line).
          shuffle_window: rows permuted together after the block shuffle.

        Raises:
          ValueError: a size is not positive or split is unknown. Iterating raises
          tf.errors.InvalidArgumentError naming file and line on a bad line (strict).
        """
        for name, value in (("batch_size", batch_size), ("shuffle_buffer", shuffle_buffer),
                            ("holdout_every", holdout_every), ("block_lines", block_lines),
                            ("shuffle_window", shuffle_window)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if num_epochs is not None and num_epochs <= 0:
            raise ValueError(f"num_epochs must be > 0 or None (forever), got {num_epochs}")
        if split not in ("all", "train", "eval"):
            raise ValueError(f"split must be 'all', 'train' or 'eval', got {split!r}")

        files = tf.data.Dataset.from_tensor_slices((
            self.paths, tf.constant(self._first_lines, tf.int64),
            ["GZIP" if p.endswith(".gz") else "" for p in self.paths]))
        if shuffle:
            files = files.shuffle(len(self.paths), seed=seed, reshuffle_each_iteration=True)

        def file_blocks(path, first_line, compression):
            """(path, line numbers [n], lines [n]) per block of one file."""
            lines = tf.data.TextLineDataset(path, compression_type=compression, buffer_size=1 << 20)
            blocks = lines.skip(first_line - 1).batch(block_lines).enumerate()

            def number(index, text):
                numbers = first_line + index * block_lines + tf.range(tf.size(text, out_type=tf.int64))
                if split != "all":
                    keep = tf.equal(numbers % holdout_every == 0, split == "eval")
                    numbers, text = tf.boolean_mask(numbers, keep), tf.boolean_mask(text, keep)
                return path, numbers, text

            return blocks.map(number)

        # When shuffling, up to 8 files are read at once; otherwise one after the other (in a
        # background thread), so rows keep file order.
        blocks = files.interleave(file_blocks, cycle_length=min(len(self.paths), 8) if shuffle else 1,
                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        strict, bad_lines = self.strict, self._bad_lines

        def parse(path, numbers, text):
            labels, dense, ids, bad = ops().ttf_parse_criteo(text, path, numbers, strict=strict)
            if not strict:
                bad_lines.assign_add(bad)
            return {"ids": ids, "dense": dense}, labels

        rows = blocks.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if not strict:
            rows = rows.concatenate(self._report_at_end())
        if shuffle:
            rows = rows.shuffle(max(1, shuffle_buffer // block_lines), seed=seed, reshuffle_each_iteration=True)
            rows = rows.rebatch(shuffle_window).enumerate().map(
                lambda index, element: _permute_rows(element, tf.stack([tf.cast(seed, tf.int64), index])),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Repeating after the shuffle keeps passes apart: every row once per pass, and every
        # pass (a new iteration of the shuffles above) in a new order.
        rows = rows.repeat(num_epochs)
        return rows.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)

    def _report_at_end(self):
        """One empty block whose making prints the lines skipped since the last such print
        (if any): concatenated after the parsed blocks, it runs once every parse of the pass
        has finished."""
        bad_lines, reported, where = self._bad_lines, self._reported, ", ".join(self.paths)

        def print_new():
            total = bad_lines.read_value()
            printed = tf.print("ttf.data: skipped", total - reported.read_value(), "more bad line(s),", total,
                               "in all, in", where, "(strict=False)", output_stream=sys.stderr)
            with tf.control_dependencies([printed]):
                return reported.assign(total)

        def report(_):
            done = tf.cond(bad_lines.read_value() > reported.read_value(), print_new, reported.read_value)
            with tf.control_dependencies([done]):
                return ({"ids": tf.zeros([0, NUM_FIELDS], tf.int64), "dense": tf.zeros([0, NUM_DENSE], tf.float32)},
                        tf.zeros([0], tf.float32))

        return tf.data.Dataset.range(1).map(report)


def _permute_rows(element, seed):
    features, labels = element
    order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(labels)[0]), seed=seed)
    return {name: tf.gather(value, order) for name, value in features.items()}, tf.gather(labels, order)


def criteo_dataset(paths, batch_size, *, shuffle=True, seed=0, num_epochs=1, strict=True, drop_remainder=False):
    """Shorthand for `CriteoReader(paths, strict).dataset(batch_size, ...)`: elements
    `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])`. With
    strict=False the skipped-line count is printed after every pass that skipped lines; keep a
    CriteoReader to read it as a number (`reader.bad_lines`).

    Example:
      >>> import ttf
      >>> ds = ttf.data.criteo_dataset("data/criteo_sample.txt", 64, shuffle=False)
      >>> [int(labels.shape[0]) for _, labels in ds]
      [64, 64, 64, 8]
    """
    return CriteoReader(paths, strict).dataset(batch_size, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
                                               drop_remainder=drop_remainder)
