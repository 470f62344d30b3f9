"""Parquet and TFRecord input: a schema's columns matched by name, encoded in C++.

Parquet's row groups are decoded by pyarrow (in tf.data's threads, pyarrow releasing the GIL
while it decodes) and one TtfEncodeColumns call turns a row group's columns into the text
reader's outputs; a plain TFRecord file is framed by TtfReadRecords (large reads, CRC32C checks,
the records left in one buffer) and its tf.train.Example records go to TtfParseExampleSpans,
which reads the protobuf wire format where it lies. Both by the text parser's value rules (ops/kernels/parse_values.h):
an integer is the value of its decimal text, a string the value of its bytes, so "05db9164" is
the same key in TSV, Parquet and TFRecord.

A unit is a Parquet row group (the unit of parallel decoding, of shares and of positions)
or a TFRecord file (read in windows of records).
"""
import contextlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from ttf._ops import ops
from ttf.data._one_line import one_line

INTS, FLOATS, ARROW_STRINGS, STRINGS, DICTIONARY = 0, 1, 2, 3, 4
_NUMERIC_KINDS = ("label", "dense")
_EMPTY = {np.uint8: np.zeros(0, np.uint8), np.int64: np.zeros(0, np.int64), np.float64: np.zeros(0, np.float64)}
_ARRAY_DTYPES = (tf.uint8, tf.int64, tf.int64, tf.float64, tf.int64, tf.uint8)  # valid splits ints floats offsets bytes


def _columns(schema):
    """(column, attr index) of the schema's columns that are read (all but Skip)."""
    return [(c, i) for i, c in enumerate(schema.columns) if c.kind != "skip"]


def _wanted(column):
    return "an integer, float or boolean" if column.kind in _NUMERIC_KINDS else "an integer or string"


class _Encoder:
    """The TtfEncodeColumns call of one schema and one layout of sources."""

    def __init__(self, schema, attrs, sources, row_word, strict):
        self.schema, self.sources, self.strict = schema, sources, strict
        read = _columns(schema)
        pick = lambda key: [attrs[key][i] for _, i in read]  # noqa: E731
        self.attrs = dict(kinds=pick("kinds"), sources=sources, slots=pick("slots"), value_modes=pick("value_modes"),
                          log1p=pick("log1p"), defaults=pick("defaults"), names=pick("names"),
                          num_dense=attrs["num_dense"], num_fields=attrs["num_fields"],
                          num_multi_hot=attrs["num_multi_hot"], row_word=row_word, schema_name=attrs["schema_name"],
                          strict=strict)

    def __call__(self, location, numbers, error, arrays, strings):
        """arrays: per column (valid, splits, ints, floats, offsets, bytes); strings: per column.
        Returns (labels, dense, ids, multi-hot values, multi-hot lengths, bad rows)."""
        lists = [list(group) for group in zip(*arrays)]
        return ops().ttf_encode_columns(location, numbers, error, *lists, strings, **self.attrs)


# ---------------------------------------------------------------------------------------- Parquet

class _GFileHandle:
    """A tf.io.gfile.GFile with what pyarrow.PythonFile asks of a file object (GFile has no `closed`)."""

    def __init__(self, path):
        self._file, self.closed = tf.io.gfile.GFile(path, "rb"), False

    def read(self, n=-1):
        return self._file.read(n)

    def seek(self, offset, whence=0):
        return self._file.seek(offset, whence)

    def tell(self):
        return self._file.tell()

    def close(self):
        self._file.close()
        self.closed = True


@contextlib.contextmanager
def _parquet_file(path, dictionary_columns=(), metadata=None):
    """pyarrow's ParquetFile of a local path, or of a file on another of TensorFlow's file systems
    (gs://, s3://, hdfs://, ram://) through tf.io.gfile: pyarrow reads the footer (unless its
    `metadata` is given) and each column chunk it decodes with seek and read, so memory stays a row
    group's, not the file's. Closed on leaving: a file object must not outlive the call, since a
    tf.data thread's Python state (and what it holds) is torn down after each numpy_function."""
    source = pa.PythonFile(_GFileHandle(path), mode="r") if "://" in path else path
    try:
        try:
            # No read-ahead on pyarrow's I/O threads: a row group is read whole by one tf.data thread.
            f = pq.ParquetFile(source, metadata=metadata, read_dictionary=list(dictionary_columns) or None,
                               pre_buffer=False)
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0]}); a truncated or "
                             "corrupt file: write or copy it again") from None
        with contextlib.closing(f):
            yield f
    finally:
        if not isinstance(source, str):
            source.close()


def _parquet_source(path, column, arrow_schema, schema_name):
    """The source code of one schema column in a Parquet file; ValueError when it cannot be read."""
    if arrow_schema.get_field_index(column.name) < 0:
        names = arrow_schema.names
        raise ValueError(f"{path}: no column {column.name!r}, which schema {schema_name!r} reads (the file has "
                         f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")
    kind = arrow_schema.field(column.name).type
    shown = kind
    if column.kind == "multi_hot":
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise ValueError(f"{path}: column {column.name!r} is {shown}; a MultiHot column takes a list of "
                             "integers or strings")
        kind = kind.value_type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if column.kind in _NUMERIC_KINDS:
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return INTS
        if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            return FLOATS
    elif pa.types.is_integer(kind):
        return INTS
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        return ARROW_STRINGS
    raise ValueError(f"{path}: column {column.name!r} is {shown}; a {type(column).__name__} column takes "
                     f"{_wanted(column)}{' list' if column.kind == 'multi_hot' else ''}")


def _arrow_arrays(array, source, multi_hot):
    """One column of a row group as the op's (valid, splits, ints, floats, offsets, bytes)."""
    splits = _EMPTY[np.int64]
    if multi_hot:  # a null list is an empty list; list_flatten drops null lists' items
        lengths = pc.list_value_length(array).fill_null(0).to_numpy()
        splits = np.zeros(len(array) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        array = pc.list_flatten(array)
    if pa.types.is_dictionary(array.type):
        if source == DICTIONARY:
            return _dictionary_arrays(array)
        array = array.dictionary_decode()
    valid = array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8) if array.null_count else _EMPTY[np.uint8]
    ints, floats, offsets, data = _EMPTY[np.int64], _EMPTY[np.float64], _EMPTY[np.int64], _EMPTY[np.uint8]
    if source in (INTS, FLOATS):  # no fill_null copy when nothing is null
        values = array.cast(pa.int64() if source == INTS else pa.float64())
        values = (values.fill_null(0) if array.null_count else values).to_numpy()
        ints, floats = (values, floats) if source == INTS else (ints, values)
    else:
        offsets, data = _binary_buffers(array)
    return valid, splits, ints, floats, offsets, data


def _binary_buffers(array):
    """(offsets int64 [n + 1], bytes uint8) of a string or binary array."""
    array = array.cast(pa.large_binary())
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[array.offset:array.offset + len(array) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None and buffers[2].size else _EMPTY[np.uint8]
    return offsets, data


def _dictionary_arrays(array):
    """A dictionary-encoded string column (one value per row) as the op's arrays: indices and entries."""
    valid = array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8) if array.null_count else _EMPTY[np.uint8]
    indices = array.indices.cast(pa.int64())
    indices = (indices.fill_null(0) if array.null_count else indices).to_numpy()
    offsets, data = _binary_buffers(array.dictionary)
    return valid, _EMPTY[np.int64], indices, _EMPTY[np.float64], offsets, data


class ParquetSource:
    """The row groups of Parquet files, checked against a schema when made."""

    row_word = "row"

    def __init__(self, paths, schema, attrs, strict):
        self.schema, self.paths = schema, paths
        self.read_columns = [c for c, _ in _columns(schema)]
        self.units = []  # (path, row group, first row of the group in its file, rows)
        self._metadata = {}  # path: its footer, read once
        sources, first = None, None
        for path in paths:
            with _parquet_file(path) as f:
                metadata = self._metadata[path] = f.metadata
                found = [_parquet_source(path, c, f.schema_arrow, schema.name) for c in self.read_columns]
            if sources is None:
                sources, first = found, path
            elif found != sources:
                c = next(c for c, a, b in zip(self.read_columns, found, sources) if a != b)
                raise ValueError(f"{path}: column {c.name!r} has another type than in {first}; give files of one "
                                 "layout")
            row = 0
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                if rows:
                    self.units.append((path, group, row, rows))
                row += rows
        if not self.units:
            raise ValueError(f"{', '.join(paths)}: no rows in the Parquet file(s)")
        # Categorical strings are read as dictionaries (as Parquet stores them): a key per distinct value.
        sources = [DICTIONARY if s == ARROW_STRINGS and c.kind == "categorical" else s
                   for c, s in zip(self.read_columns, sources)]
        self.dictionary_columns = [c.name for c, s in zip(self.read_columns, sources) if s == DICTIONARY]
        self.encode = _Encoder(schema, attrs, sources, self.row_word, strict)

    def weight(self, unit):
        return self.units[unit][3]

    def layout(self):
        return [(path, group, rows) for path, group, _, rows in self.units]

    def _read(self, unit, keep_mode, holdout_every):
        """numpy: row numbers (in the group), error, and the columns of the kept rows of one unit."""
        path, group, first_row, rows = self.units[unit]
        numbers = np.arange(rows, dtype=np.int64)
        keep = None
        if keep_mode:  # the held-out split: rows whose 1-based number in the file is a multiple of holdout_every
            keep = ((first_row + numbers + 1) % holdout_every == 0) == (keep_mode == 2)
            numbers = numbers[keep]
        try:
            with _parquet_file(path, self.dictionary_columns, self._metadata[path]) as f:
                table = f.read_row_group(group, columns=[c.name for c in self.read_columns], use_threads=False)
            if keep is not None:
                table = table.filter(pa.array(keep))
            if any(table.column(n).num_chunks > 1 for n in self.dictionary_columns):
                table = table.unify_dictionaries()
            out = [numbers, b""]
            for column, source in zip(self.read_columns, self.encode.sources):
                out += _arrow_arrays(table.column(column.name).combine_chunks(), source, column.kind == "multi_hot")
            return out
        except (pa.ArrowException, OSError, ValueError) as err:
            empties = [_EMPTY[np.uint8], _EMPTY[np.int64], _EMPTY[np.int64], _EMPTY[np.float64], _EMPTY[np.int64],
                       _EMPTY[np.uint8]]
            reason = f"cannot decode the row group ({str(err).splitlines()[0]}): a corrupt file"
            return [numbers, reason.encode()] + empties * len(self.read_columns)

    def decode(self, unit, split="all", holdout_every=5):
        """(labels, dense, ids, values, lengths, bad) of one unit (a tensor index), in a graph."""
        keep_mode = {"all": 0, "train": 1, "eval": 2}[split]
        n = len(self.read_columns)
        out = tf.numpy_function(lambda u: self._read(int(u), keep_mode, holdout_every), [unit],
                                [tf.int64, tf.string] + list(_ARRAY_DTYPES) * n, stateful=False)
        for t in out:
            t.set_shape([] if t.dtype == tf.string else [None])
        arrays = [out[2 + 6 * c:8 + 6 * c] for c in range(n)]
        paths = tf.constant([u[0] for u in self.units])
        groups = tf.constant([u[1] for u in self.units], tf.int64)
        location = tf.strings.join([tf.gather(paths, unit), ": row group ",
                                    tf.strings.as_string(tf.gather(groups, unit))])
        return self.encode(location, out[0], out[1], arrays, [tf.zeros([0], tf.string)] * n)


# --------------------------------------------------------------------------------------- TFRecord

_FEATURE_SOURCES = {"int64_list": INTS, "float_list": FLOATS, "bytes_list": STRINGS}
# Records checked when a source is made: the first file's first 1,000, each further file's first
# 16 (a folder of 200 part files took 20 s to check at 1,000 each; TtfParseExampleSpans checks every
# record as it reads, naming the file and record, so this only fails a wrong layout early).
_SAMPLE_RECORDS = 1000
_SAMPLE_RECORDS_LATER_FILES = 16
_RECORD_BLOCK = 4096  # records per TtfParseExampleSpans call at least: a tf.data step and an op call per block
_WINDOW_BYTES = 64 << 20  # a window of records ends once it holds this many bytes (one record at least)


def compression_of(path):
    return "GZIP" if path.endswith(".gz") else ""


def _sample_records(path, strict, count):
    """Up to `count` records of one file (bytes); ValueError on a corrupt file (a plain file's
    corrupt records are skipped when not strict, as reading does)."""
    try:
        if not compression_of(path):
            data, starts, ends = ops().ttf_read_records(path, 0, 0, count, strict=strict)[:3]
            data = data.numpy()
            return [data[b:e] for b, e in zip(starts.numpy().tolist(), ends.numpy().tolist())]
        sample = tf.data.TFRecordDataset(path, "GZIP").take(count).batch(count)
        return [r for batch in sample for r in batch.numpy().tolist()]  # one tf.data step, not one per record
    except tf.errors.DataLossError as err:  # the op's line: "<path>, record N (byte B): why (fix)"
        line = one_line(err.message)
        raise ValueError(f"{path}: not a readable TFRecord file: {line[len(path) + 2:]}") from None
    except tf.errors.InvalidArgumentError as err:
        raise ValueError(f"{path}: not a readable TFRecord file ({err.message.splitlines()[0]}); a truncated or "
                         "corrupt file, or a GZIP file without the .gz suffix") from None


class TFRecordSource:
    """TFRecord files of tf.train.Example, checked against a schema when made (each file's first
    records: the label is there, every feature's list type can hold its column's values), framed
    by TtfReadRecords (plain files) or TFRecordDataset (GZIP), and parsed by TtfParseExampleSpans
    (ops/kernels/parse_examples_kernels.cc), which checks every record."""

    row_word = "record"

    def __init__(self, paths, schema, attrs, strict):
        self.schema, self.paths = schema, paths
        self.read_columns = [c for c, _ in _columns(schema)]
        seen = {}
        for i, path in enumerate(paths):
            records = _sample_records(path, strict, _SAMPLE_RECORDS_LATER_FILES if i else _SAMPLE_RECORDS)
            if not records:
                raise ValueError(f"{path}: empty TFRecord file, no records")
            for raw in records:
                example = tf.train.Example.FromString(raw)
                for column in self.read_columns:
                    feature = example.features.feature.get(column.name)
                    if feature is not None and feature.WhichOneof("kind") is not None:
                        kind = _FEATURE_SOURCES[feature.WhichOneof("kind")]
                        if seen.setdefault(column.name, (kind, path))[0] != kind:
                            raise ValueError(f"{path}: feature {column.name!r} is a {feature.WhichOneof('kind')} "
                                             f"here and another list in {seen[column.name][1]}; give files of one "
                                             "layout")
        for column in self.read_columns:
            if column.name not in seen:
                if column.kind == "label":
                    raise ValueError(f"{paths[0]}: no feature {column.name!r} (the label of schema {schema.name!r}) "
                                     f"in its first {_SAMPLE_RECORDS} records or the first {_SAMPLE_RECORDS_LATER_FILES} "
                                     "of any other file")
                continue
            source, path = seen[column.name]
            if (source == FLOATS) != (column.kind in _NUMERIC_KINDS) and source != INTS:
                raise ValueError(f"{path}: feature {column.name!r} is a {'float' if source == FLOATS else 'bytes'}"
                                 f"_list; a {type(column).__name__} column takes {_wanted(column)}")
        self.units = [(path, 0, 0, tf.io.gfile.stat(path).length) for path in paths]
        self.strict = strict
        read = _columns(schema)
        self.attrs = {key: [attrs[key][i] for _, i in read]
                      for key in ("kinds", "slots", "value_modes", "log1p", "defaults", "names")}
        self.attrs.update(num_dense=attrs["num_dense"], num_fields=attrs["num_fields"],
                          num_multi_hot=attrs["num_multi_hot"], schema_name=attrs["schema_name"], strict=strict)

    def weight(self, unit):
        return self.units[unit][3]

    def layout(self):
        # A plain file's positions are byte offsets, a GZIP file's record indices.
        return [(path, size, "records" if compression_of(path) else "bytes") for path, _, _, size in self.units]

    def windows(self, unit, size, offset=0, record=0):
        """Windows of up to `size` records of one file (a tensor index) from record number `record`
        at byte `offset`, as a dataset of (begin, begin record, end, end record, numbers, data,
        starts, ends, bad): record i of a window is data[starts[i]:ends[i]], its number numbers[i];
        bad counts records skipped as corrupt (strict=False). Plain files are framed by
        TtfReadRecords (begin, end: byte offsets), GZIP files by TFRecordDataset (begin, end:
        record indices, and `offset` is one)."""
        gzip = [bool(compression_of(p)) for p in self.paths]
        path = tf.gather(tf.constant(self.paths), unit)
        if not any(gzip):
            return self._plain_windows(path, size, offset, record)
        if all(gzip):
            return self._gzip_windows(path, size, record)
        # Both kinds in one source: the other kind's dataset takes no element (and opens no file).
        is_gzip = tf.gather(tf.constant(gzip), unit)
        none, every = tf.constant(0, tf.int64), tf.constant(-1, tf.int64)
        return (self._plain_windows(path, size, offset, record).take(tf.where(is_gzip, none, every))
                .concatenate(self._gzip_windows(path, size, record).take(tf.where(is_gzip, every, none))))

    def _plain_windows(self, path, size, offset, record):
        strict = self.strict

        def read(state, _):
            begin, number, finished = state
            data, starts, ends, numbers, end, next_number, bad, done = ops().ttf_read_records(
                path, tf.where(finished, tf.constant(-1, tf.int64), begin), number, size, max_bytes=_WINDOW_BYTES,
                strict=strict)
            return (end, next_number, done), (finished, (begin, number, end, next_number, numbers, data, starts, ends,
                                                         bad))

        start = (tf.cast(offset, tf.int64), tf.cast(record, tf.int64), tf.constant(False))
        return (tf.data.Dataset.from_tensors(0).repeat().scan(start, read)
                .take_while(lambda finished, _: tf.logical_not(finished)).map(lambda _, window: window)
                .filter(lambda *w: tf.logical_or(tf.size(w[4]) > 0, w[8] > 0)))

    def _gzip_windows(self, path, size, record):
        def window(index, records):
            begin = record + index * size
            lengths = tf.cast(tf.strings.length(records), tf.int64)
            ends = tf.cumsum(lengths)
            end = begin + tf.size(records, out_type=tf.int64)
            return (begin, begin, end, end, tf.range(begin, end), tf.strings.reduce_join(records), ends - lengths,
                    ends, tf.constant(0, tf.int64))

        records = tf.data.TFRecordDataset(path, "GZIP", buffer_size=1 << 20).skip(record)
        return records.batch(size).enumerate().map(window)

    def decode_window(self, unit, numbers, data, starts, ends, bad):
        """(labels, dense, ids, values, lengths, bad) of the records numbered `numbers` (0-based) of one
        file, at data[starts[i]:ends[i]]: TtfParseExampleSpans reads the tf.train.Example wire format
        where it lies and hashes values in place."""
        location = tf.gather(tf.constant(self.paths), unit)
        out = ops().ttf_parse_example_spans(data, starts, ends, location, numbers, **self.attrs)
        return tuple(out[:-1]) + (out[-1] + bad,)


def kept_window(window, split, holdout_every):
    """(numbers, data, starts, ends, bad) of a window's records in the split."""
    numbers, data, starts, ends, bad = window[4:]
    if split != "all":
        keep = _keep(numbers, split, holdout_every)
        numbers, starts, ends = (tf.boolean_mask(t, keep) for t in (numbers, starts, ends))
    return numbers, data, starts, ends, bad


# ------------------------------------------------------------------------------ datasets and shares

def _keep(numbers, split, holdout_every):
    """The held-out split by 1-based row number: eval keeps multiples of holdout_every."""
    return tf.equal((numbers + 1) % holdout_every == 0, split == "eval")


def unit_rows(source, units, finish, split="all", holdout_every=5, block_records=4096):
    """(features, labels) per decoded piece of the units in `units` (a dataset of unit indices)."""
    parallel = dict(num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if isinstance(source, ParquetSource):
        return units.map(lambda u: finish(*source.decode(u, split, holdout_every)), **parallel)

    block_records = max(block_records, _RECORD_BLOCK)

    def blocks(unit):
        return source.windows(unit, block_records).map(lambda *w: (unit,) + kept_window(w, split, holdout_every))

    return (units.interleave(blocks, cycle_length=min(len(source.units), 8), **parallel)
            .map(lambda u, *window: finish(*source.decode_window(u, *window)), **parallel))


def plan_units(source, num_shares):
    """Units dealt to `num_shares` shares of about equal weight (rows or bytes), each in file order."""
    shares, loads = [[] for _ in range(num_shares)], [0] * num_shares
    for unit in sorted(range(len(source.units)), key=lambda u: -source.weight(u)):
        share = loads.index(min(loads))
        shares[share].append(unit)
        loads[share] += source.weight(unit)
    return [sorted(share) for share in shares]


def share_rows(source, unit_ids, share_index, finish, batch_size, *, seed, num_epochs, start, window_lines,
               split, holdout_every, shuffle):
    """Batches of one share of units with their position (the layout of _shares.POSITION_FIELDS).

    A window is a whole row group (Parquet) or window_lines records (TFRecord). Its start and end
    stand in the byte and line fields: a row index in both (Parquet), the byte offset and the
    record index (plain TFRecord), a record index in both (GZIP TFRecord).
    """
    epoch0, piece0, byte0, line0, skip0 = (0, 0, -1, -1, 0) if start is None else [int(v) for v in start]
    if not unit_ids or (num_epochs is not None and epoch0 >= num_epochs):
        return None
    units = tf.constant(unit_ids, tf.int64)
    parquet = isinstance(source, ParquetSource)

    def batches(epoch, piece, begin, begin_line, end, end_line, skip, element):
        features, labels = element
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(labels)[0]), seed=tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + epoch,
                                                               piece * (1 << 40) + begin]))
            features = {k: tf.gather(v, order) for k, v in features.items()}
            labels = tf.gather(labels, order)
        last = (tf.cast(tf.size(labels), tf.int64) + batch_size - 1) // batch_size - 1

        def with_position(index, element):
            position = tf.stack([tf.cast(share_index, tf.int64), epoch, piece, begin, begin_line, index,
                                 tf.cast(index == last, tf.int64), end, end_line])
            return element[0], element[1], position

        return (tf.data.Dataset.from_tensors((features, labels)).rebatch(batch_size).enumerate()
                .map(with_position).skip(skip))

    def epoch_batches(epoch, restored):
        first = piece0 if restored else 0
        if parquet:  # whole row groups, decoded ahead in parallel; a finished first group (start at its end) is past
            first += 1 if restored and byte0 > 0 else 0
            pieces = tf.data.Dataset.range(first, len(unit_ids))
            rows = tf.constant([source.units[u][3] for u in unit_ids], tf.int64)
            decoded = pieces.map(lambda p: (p, finish(*source.decode(units[p], split, holdout_every))),
                                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            skip_first, zero = tf.constant(skip0 if restored else 0, tf.int64), tf.constant(0, tf.int64)
            return decoded.flat_map(lambda p, e: batches(epoch, p, zero, zero, tf.gather(rows, p), tf.gather(rows, p),
                                                         tf.where(tf.equal(p, first), skip_first, zero), e))

        def piece_windows(piece):
            at_restored = tf.logical_and(tf.equal(piece, piece0), restored)
            zero = tf.constant(0, tf.int64)
            begin = tf.where(at_restored, tf.constant(max(byte0, 0), tf.int64), zero)
            begin_line = tf.where(at_restored, tf.constant(max(line0, 0), tf.int64), zero)
            skip = tf.where(at_restored, tf.constant(skip0, tf.int64), zero)
            unit = tf.gather(units, piece)

            def window(index, w):
                element = finish(*source.decode_window(unit, *kept_window(w, split, holdout_every)))
                return w[0], w[1], w[2], w[3], tf.where(index == 0, skip, zero), element

            windows = source.windows(unit, window_lines, begin, begin_line).enumerate().map(
                window, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return windows.flat_map(lambda b, bl, e, el, s, element: batches(epoch, piece, b, bl, e, el, s, element))

        return tf.data.Dataset.range(first, len(unit_ids)).flat_map(piece_windows)

    first = epoch_batches(tf.constant(epoch0, tf.int64), start is not None and byte0 >= 0)
    later = tf.data.Dataset.range(epoch0 + 1, num_epochs if num_epochs is not None else 1 << 62)
    return first.concatenate(later.flat_map(lambda e: epoch_batches(e, False)))
