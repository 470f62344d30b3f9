"""TtfParseExamples, the tf.train.Example parser, against stock TensorFlow: records written by
tf.io.TFRecordWriter (and some encoded by hand: unpacked lists, repeated and unknown fields)
parsed by tf.io.parse_example, then mapped to keys by ttf.data.field_key (the contract in
Python), must give the op's outputs exactly. Bad records are one line naming file, record and
feature; corrupt bytes never crash the op."""
import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.data._one_line import one_line
from ttf.data._reader import _op_attrs

SCHEMA = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Dense("price", transform="none", default=-1.0),
                          ttf.data.Dense("count"), ttf.data.Categorical("user", values="int"),
                          ttf.data.Categorical("item"), ttf.data.Hour("hour"),
                          ttf.data.MultiHot("tags"), ttf.data.MultiHot("cats", values="int")], name="shop")


def parse(records, numbers=None, strict=True, location="f.tfrecord"):
    attrs = _op_attrs(SCHEMA)
    attrs = {k: v for k, v in attrs.items() if k not in ("separators", "delimiter")}
    numbers = np.arange(len(records), dtype=np.int64) if numbers is None else numbers
    return ops().ttf_parse_examples(tf.constant(records, tf.string), location, numbers, strict=strict, **attrs)


def feature(values):
    if values and isinstance(values[0], bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if values and isinstance(values[0], float):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def example(**features):
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in features.items() if v is not None})).SerializeToString()


def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        item = [b"05db9164", b"abc", b"12", "\u00fc".encode(), b"", b"FFFF"][int(rng.integers(6))]
        out.append(dict(
            click=[int(rng.integers(2))] if i % 3 else [float(rng.integers(2))],
            price=None if i % 7 == 0 else [float(np.float32(rng.normal()))] if i % 2 else [int(rng.integers(-5, 50))],
            count=None if i % 5 == 0 else [] if i % 5 == 1 else [int(rng.integers(0, 10_000))],
            user=None if i % 11 == 0 else [int(rng.integers(0, 1 << 40))],
            item=None if i % 13 == 0 else [item] if i % 4 else [int(rng.integers(0, 1 << 34))],
            hour=None if i % 17 == 0 else [int(rng.choice([14102100, 14102923, 16022912]))] if i % 2 else [b"14102100"],
            tags=None if i % 4 == 0 else [bytes(t, "ascii") for t in rng.choice(["a", "b", "7f", "z z"],
                                                                                int(rng.integers(1, 4)))],
            cats=[int(c) for c in rng.integers(0, 1000, int(rng.integers(0, 3)))] or None,
            unknown=[b"ignored"] if i % 2 else [1.5]))
    return out


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def reference(records):
    """The op's outputs from stock tf.io.parse_example (RaggedFeatures) and field_key. Records are
    grouped by their features' list types (a column takes int64 or float, or int64 or bytes), each
    group parsed by one parse_example call with those types."""
    kinds = {"int64_list": tf.int64, "float_list": tf.float32, "bytes_list": tf.string}
    names = ("click", "price", "count", "user", "item", "hour", "tags", "cats")
    groups = {}
    for i, r in enumerate(records):
        feature = tf.train.Example.FromString(r).features.feature
        groups.setdefault(tuple((n, feature[n].WhichOneof("kind")) for n in names
                                if n in feature and feature[n].WhichOneof("kind")), []).append(i)
    parsed = {n: [None] * len(records) for n in names}
    for signature, rows_of in groups.items():
        got = tf.io.parse_example([records[i] for i in rows_of],
                                  {n: tf.io.RaggedFeature(kinds[kind]) for n, kind in signature})
        for n, values in got.items():
            for i, v in zip(rows_of, values.to_list()):
                parsed[n][i] = v
    labels, dense, ids, tags, cats = [], [], [], [], []
    for i in range(len(records)):
        get = {k: v[i] for k, v in parsed.items()}
        labels.append(get["click"][0])
        dense.append([get["price"][0] if get["price"] else -1.0,
                      np.log1p(max(get["count"][0], 0)) if get["count"] else 0.0])
        user = ttf.data.field_key(0, text(get["user"][0]) if get["user"] else "", "int")
        item = ttf.data.field_key(1, text(get["item"][0]) if get["item"] else "")
        hour = text(get["hour"][0]) if get["hour"] else None
        if hour is None:
            hour_keys = [(2 << 56) | ttf.data.MISSING_VALUE, (3 << 56) | ttf.data.MISSING_VALUE]
        else:
            day = np.datetime64(f"20{hour[:2]}-{hour[2:4]}-{hour[4:6]}")
            weekday = int((day.astype("datetime64[D]").astype(np.int64) + 3) % 7)
            hour_keys = [(2 << 56) | int(hour[6:]), (3 << 56) | weekday]
        ids.append([user, item] + hour_keys)
        # None: stock TF refused the list's type, an empty list here (the op: an empty list of any type is missing)
        tags.append([ttf.data.field_key(4, text(t)) for t in get["tags"] or []])
        cats.append([ttf.data.field_key(5, text(c), "int") for c in get["cats"] or []])
    return (np.array(labels, np.float32), np.array(dense, np.float32), np.array(ids, np.int64), tags, cats)


def assert_outputs(out, want):
    labels, dense, ids, (tags_v, cats_v), (tags_n, cats_n), bad = out
    np.testing.assert_array_equal(labels.numpy(), want[0])
    np.testing.assert_allclose(dense.numpy(), want[1], rtol=1e-6)
    np.testing.assert_array_equal(ids.numpy(), want[2])
    assert tf.RaggedTensor.from_row_lengths(tags_v, tags_n).to_list() == want[3]
    assert tf.RaggedTensor.from_row_lengths(cats_v, cats_n).to_list() == want[4]
    assert int(bad) == 0


def varint(x):
    out = b""
    while True:
        b, x = x & 0x7f, x >> 7
        out += bytes([b | (0x80 if x else 0)])
        if not x:
            return out


def field(number, wire, payload):
    if wire == 2:
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    return varint(number << 3 | wire) + payload


def entry(name, feature_bytes):
    return field(1, 2, field(1, 2, name.encode()) + field(2, 2, feature_bytes))


def test_records_written_by_tensorflow_match_parse_example(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for row in rows(300):
            writer.write(example(**row))
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    assert_outputs(parse(records), reference(records))


def test_unpacked_lists_repeated_and_unknown_fields_match_parse_example():
    unpacked_ints = field(3, 2, field(1, 0, varint(7)) + field(1, 0, varint(300)))  # Int64List, not packed
    unpacked_floats = field(2, 2, field(1, 5, np.float32(2.5).tobytes()))
    records = [
        field(1, 2, entry("click", field(3, 2, field(1, 0, varint(1)))) + entry("cats", unpacked_ints)
              + entry("price", unpacked_floats) + entry("zzz", field(1, 2, field(1, 2, b"x")))),
        # a feature given twice: the last entry wins (protobuf's map); unknown fields of every wire type
        field(1, 2, entry("click", field(3, 2, field(1, 2, varint(0)))) + entry("tags", field(1, 2, field(1, 2, b"a")))
              + entry("tags", field(1, 2, field(1, 2, b"b") + field(1, 2, b"c")))
              + field(9, 0, varint(5)) + field(10, 1, b"\0" * 8) + field(11, 5, b"\0" * 4))
        + field(7, 2, b"unknown"),
        # empty lists of any type and an empty Feature are missing
        example(click=[0], price=[], count=[], user=[], item=[], tags=[], cats=[])
        + field(1, 2, entry("hour", b"") + entry("item", field(2, 2, b""))),
    ]
    # stock parse_example refuses unknown non-bytes fields; protobuf (and the op) skip them: the reference
    # parses what protobuf reads (its map keeps a repeated key's last entry, as parse_example does)
    canonical = []
    for r in records:
        message = tf.train.Example.FromString(r)
        message.DiscardUnknownFields()
        canonical.append(message.SerializeToString())
    assert_outputs(parse(records), reference(canonical))


def test_bad_records_are_one_line_naming_file_record_and_feature_and_are_counted():
    good = example(click=[1], item=[b"abc"])
    cases = {
        example(click=[1], item=[1.5]): "feature 'item' is a float_list; a categorical column takes an int64_list "
                                        "or bytes_list",
        example(click=[1], count=[b"x"]): "feature 'count' is a bytes_list; a dense column takes",
        example(click=[2]): "label feature 'click' must be 0 or 1",
        example(item=[b"a"]): "label feature 'click' is absent",
        example(click=[1], item=[b"a", b"b"]): "feature 'item' holds 2 values; a categorical column takes one",
        example(click=[1], user=[-3]): "categorical feature 'user' is not an integer in",
        example(click=[1], hour=[b"14133100"]): "feature 'hour' is not a YYMMDDHH time stamp",
        example(click=[1], price=[float("inf")]): "dense feature 'price' is not a finite number",
        good[:-3]: "is not a tf.train.Example",
    }
    for i, (record, message) in enumerate(cases.items()):
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            parse([good, record], np.array([40, 41 + i]))
        assert f"f.tfrecord, record {41 + i}: bad shop record: {message}" in err.value.message, err.value.message
        assert "\n" not in err.value.message
    out = parse([good] + list(cases) + [good], strict=False)
    assert out[0].numpy().tolist() == [1.0, 1.0] and int(out[-1]) == len(cases)


def test_corrupt_bytes_never_crash():
    rng = np.random.default_rng(5)
    base = [example(**row) for row in rows(40, seed=1)]
    corrupt = []
    for r in base:
        b = bytearray(r)
        for _ in range(3):
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        corrupt.append(bytes(b[:int(rng.integers(1, len(b) + 1))]))
    corrupt += [b"", b"\xff" * 20, b"\x0a\xff\xff\xff\xff\x0f", bytes(rng.integers(0, 256, 500, np.uint8))]
    out = parse(corrupt, strict=False)
    assert int(out[-1]) + int(out[0].shape[0]) == len(corrupt)


def test_a_type_changing_after_the_sampled_records_is_one_line_through_the_reader(tmp_path):
    path = str(tmp_path / "late.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(1500):
            writer.write(example(click=[i % 2], item=[1.5] if i == 1200 else [b"abc"]))
    schema = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Categorical("item")], name="late")
    reader = ttf.data.Reader(path, schema)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:  # the one line, no TensorFlow frame around it
        list(reader.dataset(512, shuffle=False))
    assert err.value.message.startswith(f"{path}, record 1200: bad late record: feature 'item' is a float_list; "
                                        "a categorical column takes an int64_list or bytes_list"), err.value.message
    assert "\n" not in err.value.message and "function_node" not in err.value.message
    skipping = ttf.data.Reader(path, schema, strict=False)
    assert sum(int(l.shape[0]) for _, l in skipping.dataset(512, shuffle=False)) == 1499
    assert skipping.bad_lines == 1


def test_files_of_another_layout_fail_when_the_reader_is_made_or_read_naming_the_file(tmp_path):
    """The Reader checks the first file's first 1,000 records and each further file's first 16 when
    made (a folder of part files is not read twice); a layout change past those is the parse op's
    one line, naming the file and record."""
    schema = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Categorical("item")], name="late")
    first, ints, late = (str(tmp_path / f"{n}.tfrecord") for n in ("a", "b", "c"))
    write_records(first, [example(click=[i % 2], item=[b"abc"]) for i in range(100)])
    write_records(ints, [example(click=[1], item=[7])] + [example(click=[1], item=[b"x"])] * 10)
    with pytest.raises(ValueError) as err:
        ttf.data.Reader([first, ints], schema)
    assert str(err.value) == (f"{ints}: feature 'item' is a int64_list here and another list in {first}; give files "
                              "of one layout")
    write_records(late, [example(click=[0], item=[2.5] if i == 20 else [b"y"]) for i in range(40)])
    reader = ttf.data.Reader([first, late], schema)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        list(reader.dataset(512, shuffle=False))
    assert err.value.message.startswith(f"{late}, record 20: bad late record: feature 'item' is a float_list"), \
        err.value.message


# ---- TtfReadRecords: the TFRecord framing read in the op, then TtfParseExampleSpans on the block

def write_records(path, records, compression=""):
    with tf.io.TFRecordWriter(path, compression) as writer:
        for r in records:
            writer.write(r)


def read_blocks(path, max_records, max_bytes=1 << 26, strict=True, offset=0, record=0):
    """Every block of one file, chained by (next_offset, next_record): [(block outputs), ...]."""
    blocks = []
    while True:
        out = ops().ttf_read_records(path, offset, record, max_records, max_bytes=max_bytes, strict=strict)
        blocks.append(out)
        offset, record = int(out[4]), int(out[5])
        if bool(out[7]):
            return blocks


def block_records(block):
    data = block[0].numpy()
    return [data[b:e] for b, e in zip(block[1].numpy().tolist(), block[2].numpy().tolist())]


def test_framing_in_the_op_reads_what_tfrecorddataset_reads_and_parses_like_parse_example(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    records = [example(**row) for row in rows(300, seed=3)] + [b""]  # an empty record too
    write_records(path, records)
    for max_records, max_bytes in ((1000, 1 << 26), (7, 1 << 26), (1000, 500), (1, 1)):
        blocks = read_blocks(path, max_records, max_bytes)
        got = [r for b in blocks for r in block_records(b)]
        assert got == [r.numpy() for r in tf.data.TFRecordDataset(path)] == records
        numbers = np.concatenate([b[3].numpy() for b in blocks])
        assert numbers.tolist() == list(range(len(records))) and all(int(b[6]) == 0 for b in blocks)
        assert max(len(block_records(b)) for b in blocks) <= max_records
    # a block from a position in the middle (a resume): the next block's offset and record number
    first = read_blocks(path, 120)[0]
    rest = read_blocks(path, 1000, offset=int(first[4]), record=int(first[5]))
    assert [r for b in rest for r in block_records(b)] == records[120:]
    block = ops().ttf_read_records(path, 0, 0, 1000)
    good = records[:-1]
    out = ops().ttf_parse_example_spans(block[0], block[1][:-1], block[2][:-1], path, block[3][:-1],
                                        **{k: v for k, v in _op_attrs(SCHEMA).items()
                                           if k not in ("separators", "delimiter")})
    assert_outputs(out, reference(good))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"record span 0 \[5, 3\) is not inside data"):
        ops().ttf_parse_example_spans(block[0], [5], [3], path, [0], **{k: v for k, v in _op_attrs(SCHEMA).items()
                                                                        if k not in ("separators", "delimiter")})


def damaged(tmp_path, how):
    """A file of 20 records written by TensorFlow, damaged: a data byte flipped (record 5), a length
    byte flipped (record 5), or cut inside record 5's header or data. (path, bytes before record 5)."""
    path = str(tmp_path / f"{how}.tfrecord")
    records = [example(click=[i % 2], item=[b"x%d" % i]) for i in range(20)]
    write_records(path, records)
    before = sum(16 + len(r) for r in records[:5])
    data = bytearray(open(path, "rb").read())
    if how == "data":
        data[before + 12 + 3] ^= 0x40
    elif how == "length":
        data[before] ^= 0x01
    elif how == "header":
        data = data[:before + 7]
    else:
        data = data[:before + 12 + 4]
    with open(path, "wb") as f:
        f.write(bytes(data))
    return path, before


@pytest.mark.parametrize("how, message, kept", [
    ("data", "the record's data does not match its CRC32C: a corrupt file", 19),
    ("length", "the record's length does not match its CRC32C: a corrupt file", 5),
    ("header", "the file ends inside the record's header (7 bytes left): a truncated file", 5),
    ("cut", "the file ends inside the record (", 5)])
def test_corrupt_and_truncated_files_are_one_line_naming_file_and_record_or_skipped_and_counted(
        tmp_path, how, message, kept):
    path, before = damaged(tmp_path, how)
    with pytest.raises(tf.errors.DataLossError) as err:
        read_blocks(path, 8)
    line = one_line(err.value.message)  # the op's message without TensorFlow's frame around it
    assert line.startswith(f"{path}, record 5 (byte {before}): {message}") and "\n" not in line, line
    assert "read with strict=False to skip and count bad records" in line
    blocks = read_blocks(path, 8, strict=False)
    numbers = [n for b in blocks for n in b[3].numpy().tolist()]
    assert numbers == [n for n in range(20) if n != 5][:kept] and sum(int(b[6]) for b in blocks) == 1
    # through the reader: the same line (a ValueError when the file is opened), or the record skipped and counted
    schema = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Categorical("item")], name="dmg")
    with pytest.raises(ValueError, match=rf"^{path}: not a readable TFRecord file: record 5 \(byte {before}\): "):
        ttf.data.Reader(path, schema)
    reader = ttf.data.Reader(path, schema, strict=False)
    assert sum(int(l.shape[0]) for _, l in reader.dataset(8, shuffle=False)) == kept
    assert reader.bad_lines == 1


def test_a_corrupt_record_past_the_sampled_ones_is_one_line_through_the_reader(tmp_path):
    path = str(tmp_path / "late.tfrecord")
    records = [example(click=[i % 2], item=[b"abc"]) for i in range(1500)]
    write_records(path, records)
    data = bytearray(open(path, "rb").read())
    at = sum(16 + len(r) for r in records[:1200])
    data[at + 12 + 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    schema = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Categorical("item")], name="late")
    with pytest.raises(tf.errors.DataLossError) as err:
        list(ttf.data.Reader(path, schema).dataset(512, shuffle=False))
    assert err.value.message.startswith(f"{path}, record 1200 (byte {at}): the record's data does not match"), \
        err.value.message
    assert "\n" not in err.value.message and "function_node" not in err.value.message
    skipping = ttf.data.Reader(path, schema, strict=False)
    assert sum(int(l.shape[0]) for _, l in skipping.dataset(512, shuffle=False)) == 1499
    assert skipping.bad_lines == 1


def test_records_are_read_through_tensorflows_file_systems():
    """ram:// stands for gs://, s3://: the op opens files through TensorFlow's Env, plain and GZIP."""
    records = [example(click=[i % 2], price=[i / 4], item=[b"v%d" % i], tags=[b"a", b"z"][:1 + i % 2])
               for i in range(50)]  # one list type per feature: the Reader reads files of one layout
    tf.io.gfile.makedirs("ram://ttf_read_records")
    plain, gz = "ram://ttf_read_records/a.tfrecord", "ram://ttf_read_records/b.tfrecord.gz"
    write_records(plain, records)
    write_records(gz, records, "GZIP")
    assert [r for b in read_blocks(plain, 16) for r in block_records(b)] == records
    reader = ttf.data.Reader([plain, gz], SCHEMA)
    batches = list(reader.dataset(100, shuffle=False))
    want = reference(records)
    np.testing.assert_array_equal(batches[0][1].numpy(), np.concatenate([want[0]] * 2))
    np.testing.assert_array_equal(batches[0][0]["ids"].numpy()[:, :2], np.concatenate([want[2][:, :2]] * 2))
    with pytest.raises(tf.errors.NotFoundError, match="ram://ttf_read_records/none.tfrecord: no such TFRecord file"):
        ops().ttf_read_records("ram://ttf_read_records/none.tfrecord", 0, 0, 10)
