"""Schema-driven input: CTR log files (delimited text, plain or gzip; Parquet; TFRecord of
tf.train.Example) parsed in C++.

The pipeline reads each file as blocks of `block_lines` consecutive lines (so every
per-element tf.data step runs once per block, not once per line), numbers the lines,
parses each block with one TtfParseLines call (in parallel over blocks and over lines),
shuffles, and cuts batches of exactly `batch_size` rows with `Dataset.rebatch`. Parquet and
TFRecord files come as columns (ttf/data/_columnar.py) and join the same pipeline after
their decode.
"""
import gzip
import os
import sys
import zlib

import tensorflow as tf

from ttf._ops import ops
from ttf.data import _columnar, _files, _shares
from ttf.data._one_line import OneLineErrors
from ttf.data._schema import CRITEO, load_schema

NUM_DENSE = CRITEO.num_dense
NUM_FIELDS = CRITEO.num_fields
CSV_HEADER = CRITEO.header_line(",")
_KIND_CODES = {"skip": 0, "label": 1, "dense": 2, "categorical": 3, "multi_hot": 4, "hour": 5}
_VALUE_CODES = {"auto": 0, "int": 1, "string": 2}


def _op_attrs(schema):
    """The schema flattened into TtfParseLines' per-column attrs."""
    kinds, slots, value_modes, log1p, defaults, separators = [], [], [], [], [], ""
    dense = field = multi_hot = 0
    for column in schema.columns:
        kinds.append(_KIND_CODES[column.kind])
        slot = 0
        if column.kind == "dense":
            slot, dense = dense, dense + 1
        elif column.kind == "categorical":
            slot, field = field, field + 1
        elif column.kind == "hour":
            slot, field = field, field + 2
        elif column.kind == "multi_hot":
            slot, multi_hot = multi_hot, multi_hot + 1
        slots.append(slot)
        value_modes.append(_VALUE_CODES[getattr(column, "values", "auto")])
        log1p.append(getattr(column, "transform", "none") == "log1p")
        defaults.append(float(getattr(column, "default", 0.0)))
        separators += getattr(column, "separator", " ")
    return dict(kinds=kinds, slots=slots, value_modes=value_modes, log1p=log1p, defaults=defaults,
                separators=separators, names=[c.name for c in schema.columns],
                delimiter="" if schema.delimiter == "auto" else schema.delimiter,
                num_dense=schema.num_dense, num_fields=schema.num_fields, num_multi_hot=len(schema.multi_hot),
                schema_name=schema.name)


def parse_lines(lines, filenames, line_numbers, schema="criteo", strict=True):
    """Parses lines (a string tensor [N], no header lines) by `schema` with the C++ op.

    Args:
      lines: string [N]. filenames: a string, or string [N] (only named in errors).
      line_numbers: int64 [N], the lines' 1-based numbers in their files (for errors).
      schema: a Schema, "criteo", "avazu" or a JSON file.
      strict: fail on a bad line (InvalidArgumentError `file:line: bad <schema> line: why`)
        or skip and count it.

    Returns:
      (features, labels, bad_lines): features as the reader yields them (see Reader),
      labels float32 [kept rows], bad_lines an int64 scalar (skipped lines).

    Example:
      >>> import ttf
      >>> features, labels, bad = ttf.data.parse_lines(["1\\t5" + "\\t" * 38 + "abc"], "x.tsv", [1])
      >>> features["ids"].shape, features["dense"].shape, labels.numpy(), int(bad)
      (TensorShape([1, 26]), TensorShape([1, 13]), array([1.], dtype=float32), 0)
    """
    schema = load_schema(schema)
    out = ops().ttf_parse_lines(lines, filenames, line_numbers, strict=strict, **_op_attrs(schema))
    labels, dense, ids, values, lengths, bad = out
    return _features(schema, ids, dense, values, lengths), labels, bad


def _open(path):
    """A file through TensorFlow's file systems (any scheme tf.io.gfile reads), gunzipped for .gz."""
    f = tf.io.gfile.GFile(path, "rb")
    return gzip.GzipFile(fileobj=f, mode="rb") if path.endswith(".gz") else f


def _check_gzip(path):
    """Reads a gzip file to its end: a truncated or corrupt file is a ValueError naming it
    (TensorFlow's reader would stop at the cut without a word)."""
    try:
        with _open(path) as f:
            while f.read(1 << 24):
                pass
    except EOFError:
        raise ValueError(f"{path}: truncated gzip file (it ends before the end of its compressed stream); "
                         "copy or download it again") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise ValueError(f"{path}: corrupt gzip file ({err}); copy or download it again, or drop the .gz suffix "
                         "if it is plain text") from None


def _first_lines(path):
    """The file's first two lines (bytes, without line ends); fewer for a short file."""
    lines = []
    with _open(path) as f:
        for line in f:
            lines.append(line.rstrip(b"\r\n"))
            if len(lines) == 2:
                break
    return lines


def _check_file(path, schema):
    """Checks one data file against the schema's header rule; returns the number of its
    first data line (2 after a header, else 1). Raises a one-line error naming the file."""
    if path.endswith(".gz"):
        _check_gzip(path)
    lines = _first_lines(path)
    if not lines:
        raise ValueError(f"{path}: empty file, no data lines")
    first = lines[0].decode("utf-8", errors="replace")
    delimiter = schema.delimiter if schema.delimiter != "auto" else "\t" if "\t" in first else ","
    names = first.split(delimiter)
    header = schema.header is True or (schema.header == "auto" and names[0] == schema.columns[0].name)
    if header:
        expected = [c.name for c in schema.columns]
        if names != expected:
            where = next((i for i, (a, b) in enumerate(zip(names, expected)) if a != b), min(len(names), len(expected)))
            got = repr(names[where]) if where < len(names) else "nothing"
            want = repr(expected[where]) if where < len(expected) else "no more columns"
            raise ValueError(f"{path}:1: header column {where + 1} is {got}, schema {schema.name!r} expects {want} "
                             f"(header {len(names)} columns, schema {len(expected)})")
        if len(lines) < 2:
            raise ValueError(f"{path}: only a header line, no data lines")
    return 2 if header else 1


class Reader:
    """Reads CTR log files by a schema into batches for training.

    Each file is delimited text, plain or gzip (`.gz`), Parquet, or TFRecord of
    tf.train.Example (plain or `.gz`), with the columns the schema declares (by position in
    text, by name in Parquet and TFRecord: docs/data.md, "Your data") (ttf.data.Schema: label, dense, categorical, multi-hot, hour stamp, skipped
    columns; header; delimiter). Elements are `(features, label float32 [B])` with features
    `{"ids": int64 [B, F], "dense": float32 [B, D], <multi-hot name>: ragged int64 [B, None]}`
    ("ids" and "dense" only when the schema has such columns): ids are keys tagged by field
    (see `field_key`).

    strict=True (default) fails on the first bad line (wrong column count, label not 0/1,
    a dense value that is not a number, a header where none is declared, ...) with
    InvalidArgumentError `file:line: bad <schema> line: why`. strict=False skips bad lines
    and counts them: `bad_lines` (all datasets of this reader, all passes so far),
    `report()`, and a line `ttf.data: skipped K more bad line(s), N in all, ...` printed to
    stderr at the end of every pass that skipped lines. Nothing is dropped silently.

    Files are checked when the reader is made, in both modes: a missing file, a folder
    without data files, files of mixed formats, an empty file (or a header alone), a header that does not match the schema, and a
    truncated or corrupt gzip file (read to its end once, here) each raise one clear error
    naming the file.

    Args:
      paths: a file, a glob, a folder of part files (hidden, `_*` and `*.crc` files skipped),
        or a list of them (str or os.PathLike; any scheme tf.io.gfile reads): see
        ttf.data.expand_paths.
      schema: a Schema, "criteo" (default), "avazu", or a JSON schema file.
      strict: fail on a bad line (True) or skip and count it (False).

    Raises:
      ValueError: no paths, an empty file, a bad header or gzip file, an unknown schema, mixed
        formats, a Parquet or TFRecord file without a column the schema reads or with a type
        it cannot read, a truncated or corrupt file.
      FileNotFoundError: a path is missing.

    Example:
      >>> import ttf
      >>> reader = ttf.data.Reader(["data/criteo_sample.txt"], schema="criteo")
      >>> features, labels = next(iter(reader.dataset(batch_size=32, shuffle=False)))
      >>> features["ids"].shape, features["dense"].shape, labels.shape
      (TensorShape([32, 26]), TensorShape([32, 13]), TensorShape([32]))
    """

    def __init__(self, paths, schema="criteo", strict=True):
        if not isinstance(paths, (str, os.PathLike)):
            paths = list(paths)
            if not paths:
                raise ValueError("a Reader needs at least one file")
        self.paths = _files.expand_paths(paths)
        self.format = _files.data_format(self.paths)
        self.schema = load_schema(schema)
        self.strict = strict
        self._attrs = _op_attrs(self.schema)
        self._source = None  # Parquet or TFRecord: the files' units, checked against the schema
        if self.format == _files.TEXT:
            self._first_lines = [_check_file(p, self.schema) for p in self.paths]
        else:
            source = _columnar.ParquetSource if self.format == _files.PARQUET else _columnar.TFRecordSource
            self._source = source(self.paths, self.schema, self._attrs, strict)
        self._plans = {}  # num_shares -> the split of the files (share_dataset)
        with tf.init_scope():
            self._bad_lines = tf.Variable(0, dtype=tf.int64, trainable=False, name="reader_bad_lines")
            self._reported = tf.Variable(0, dtype=tf.int64, trainable=False, name="reader_bad_lines_printed")

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
        if self._source is not None:
            units = tf.data.Dataset.range(len(self._source.units))
            if shuffle:
                units = units.shuffle(len(self._source.units), seed=seed, reshuffle_each_iteration=True)
            rows = _columnar.unit_rows(self._source, units, self._finish, split, holdout_every, block_lines)
            return self._batches(rows, batch_size, shuffle, seed, num_epochs, drop_remainder, shuffle_buffer,
                                 block_lines, shuffle_window)

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
        strict, attrs = self.strict, self._attrs

        def parse(path, numbers, text):
            return self._finish(*ops().ttf_parse_lines(text, path, numbers, strict=strict, **attrs))

        rows = blocks.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return self._batches(rows, batch_size, shuffle, seed, num_epochs, drop_remainder, shuffle_buffer, block_lines,
                             shuffle_window)

    def _finish(self, labels, dense, ids, values, lengths, bad):
        """Decoded columns -> (features, labels), counting bad rows (strict=False)."""
        deps = [self._bad_lines.assign_add(bad)] if not self.strict else []
        with tf.control_dependencies(deps):
            return _features(self.schema, ids, dense, values, lengths), tf.identity(labels)

    def _batches(self, rows, batch_size, shuffle, seed, num_epochs, drop_remainder, shuffle_buffer, block_lines,
                 shuffle_window):
        """Parsed blocks of rows -> shuffled batches of batch_size rows (dataset())."""
        if not self.strict:
            rows = rows.concatenate(self._report_at_end())
        if shuffle:
            rows = rows.shuffle(max(1, shuffle_buffer // block_lines), seed=seed, reshuffle_each_iteration=True)
            rows = rows.rebatch(shuffle_window).enumerate().map(
                lambda index, element: _permute_rows(element, tf.stack([tf.cast(seed, tf.int64), index])),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Repeating after the shuffle keeps passes apart: every row once per pass, and every
        # pass (a new iteration of the shuffles above) in a new order.
        rows = rows.repeat(num_epochs)
        return OneLineErrors(rows.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE))

    def share_dataset(self, batch_size, share=0, num_shares=1, position=None, seed=0, num_epochs=1, split="all",
                      holdout_every=5, window_lines=65_536, shuffle=True):
        """Batches of one share of the input (split, not copied), with their place in it.

        The files are split into `num_shares` disjoint shares of about equal bytes (plain
        files by line-aligned byte range, a gzip file whole: see ttf.data.plan_shares); this
        reads share `share` only, so N workers with shares 0..N-1 read every row once per
        epoch. Rows are read in windows of `window_lines` consecutive lines, each window's rows
        permuted (a deterministic seed of seed, epoch and window), and cut into batches that
        never cross a window (so a window's last batch may have fewer rows).

        Elements: `(features, labels, position)`: features and labels as dataset(); position
        int64 [9] (ttf.data.POSITION_FIELDS). Train on the batch, then
        `position_tracker.record(position, rows)` (InputPosition): a checkpoint of the tracker
        holds where the share continues.

        Args:
          batch_size: rows per batch.
          share, num_shares: which share of how many (a worker's index and the worker count).
          position: an InputPosition (restored from a checkpoint or new): the share starts
            where it says (a seek to the window's byte offset, then the window's batches
            already trained are dropped); None: from the start.
          seed, num_epochs (None: forever), split, holdout_every: as dataset().
          window_lines: lines read, parsed and permuted together.
          shuffle: permute each window's rows (False: file order).

        Returns:
          the tf.data.Dataset; an empty one when this share holds no data or (num_epochs)
          its position is past its last epoch.

        Raises:
          ValueError: a size is not positive, share out of range, or a position made for
            another number of shares.
        """
        for name, value in (("batch_size", batch_size), ("num_shares", num_shares), ("window_lines", window_lines),
                            ("holdout_every", holdout_every)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not 0 <= share < num_shares:
            raise ValueError(f"share must be in [0, {num_shares}), got {share}")
        if split not in ("all", "train", "eval"):
            raise ValueError(f"split must be 'all', 'train' or 'eval', got {split!r}")
        if position is not None and position.num_shares != num_shares:
            raise ValueError(f"the InputPosition has {position.num_shares} share(s), the split {num_shares}")
        key = (num_shares,)
        if key not in self._plans:
            self._plans[key] = (_columnar.plan_units(self._source, num_shares) if self._source is not None
                                else _shares.plan_shares(self.paths, self._first_lines, num_shares))
        plan = self._plans[key]
        layout = (_shares.layout_id(plan) if self._source is None
                  else _shares.layout_id([[dict(path=str(self._source.layout()[u]), size=0, begin=0, end=0)
                                           for u in units] for units in plan]))
        start = None
        if position is not None:
            with tf.init_scope():  # eager even while a dataset function is traced (parameter-server workers)
                start = position.start_of(share, layout)
                position.layout.assign(layout)
        strict, attrs = self.strict, self._attrs

        def parse_window(path, numbers, text, permute_seed):
            element = self._finish(*ops().ttf_parse_lines(text, path, numbers, strict=strict, **attrs))
            return _permute_rows(element, permute_seed) if shuffle else element

        if self._source is not None:
            data = _columnar.share_rows(self._source, plan[share], share, self._finish, batch_size, seed=seed,
                                        num_epochs=num_epochs, start=start, window_lines=window_lines, split=split,
                                        holdout_every=holdout_every, shuffle=shuffle)
            return self._share_tail(data, batch_size)
        keep_line = None if split == "all" else (lambda numbers: tf.equal(numbers % holdout_every == 0,
                                                                          split == "eval"))
        data = _shares.share_dataset(plan[share], share, parse_window, batch_size, seed=seed, num_epochs=num_epochs,
                                     start=start, window_lines=window_lines, keep_line=keep_line)
        return self._share_tail(data, batch_size)

    def _share_tail(self, data, batch_size):
        if data is None:  # nothing (left) to read in this share: the element structure, no element
            empty = self.dataset(batch_size, shuffle=False).take(0)
            data = empty.map(lambda f, l: (f, l, tf.zeros([len(_shares.POSITION_FIELDS)], tf.int64)))
        # No autotune thread: deleting the iterator waited for it (absl Notification in
        # ~RootDataset::Iterator, the model thread in Model::OptimizeLoop) 45-59 s in about half of
        # the 2-rank Horovod jobs measured, with the other rank waiting in a collective; 0 of 4
        # without it. Its parallelism falls back to the cores (the parse is one op per window).
        options = tf.data.Options()
        options.autotune.enabled = False
        return OneLineErrors(data.prefetch(tf.data.AUTOTUNE).with_options(options))

    def _report_at_end(self):
        """One empty block whose making prints the lines skipped since the last such print
        (if any): concatenated after the parsed blocks, it runs once every parse of the pass
        has finished."""
        bad_lines, reported, where, schema = self._bad_lines, self._reported, ", ".join(self.paths), self.schema

        def print_new():
            total = bad_lines.read_value()
            printed = tf.print("ttf.data: skipped", total - reported.read_value(), "more bad line(s),", total,
                               "in all, in", where, "(strict=False)", output_stream=sys.stderr)
            with tf.control_dependencies([printed]):
                return reported.assign(total)

        def report(_):
            done = tf.cond(bad_lines.read_value() > reported.read_value(), print_new, reported.read_value)
            with tf.control_dependencies([done]):
                empty = [tf.zeros([0], tf.int64)] * len(schema.multi_hot)
                return (_features(schema, tf.zeros([0, schema.num_fields], tf.int64),
                                  tf.zeros([0, schema.num_dense], tf.float32), empty, empty),
                        tf.zeros([0], tf.float32))

        return tf.data.Dataset.range(1).map(report)


def _features(schema, ids, dense, values, lengths):
    features = {}
    if schema.num_fields:
        features["ids"] = ids
    if schema.num_dense:
        features["dense"] = dense
    for column, v, n in zip(schema.multi_hot, values, lengths):
        features[column.name] = tf.RaggedTensor.from_row_lengths(v, n, validate=False)
    return features


def _permute_rows(element, seed):
    features, labels = element
    order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(labels)[0]), seed=seed)
    return {name: tf.gather(value, order) for name, value in features.items()}, tf.gather(labels, order)


class CriteoReader(Reader):
    """`Reader(paths, schema="criteo", strict)`: Criteo's raw Kaggle TSV (no header) or the
    CSV form with the header `label,I1,...,I13,C1,...,C26`, plain or gzip, into
    `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])` with
    dense = log(1 + max(x, 0)) (missing: 0).

    Example:
      >>> import ttf
      >>> reader = ttf.data.CriteoReader(["data/criteo_sample.txt"])
      >>> features, labels = next(iter(reader.dataset(batch_size=32, shuffle=False)))
      >>> features["ids"].shape, features["dense"].shape, labels.shape
      (TensorShape([32, 26]), TensorShape([32, 13]), TensorShape([32]))
    """

    def __init__(self, paths, strict=True):
        super().__init__(paths, schema="criteo", strict=strict)


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
