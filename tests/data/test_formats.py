"""Parquet and TFRecord input (issue 48): files written by pyarrow, DuckDB and
tf.io.TFRecordWriter give key for key what the text reader gives for the same rows; bad
input is one line naming file, row group and row; folders, globs and format detection;
shares and positions read every row once."""
import gzip
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import ttf
from ttf.data import _columnar

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "data", "criteo_sample.txt")


def read_all(paths, schema="criteo", strict=True, batch_size=10_000):
    reader = ttf.data.Reader(paths, schema, strict=strict)
    batches = list(reader.dataset(batch_size, shuffle=False))
    features = {}
    for k in batches[0][0] if batches else []:
        if isinstance(batches[0][0][k], tf.RaggedTensor):
            features[k] = sum((f[k].to_list() for f, _ in batches), [])
        else:
            features[k] = np.concatenate([f[k].numpy() for f, _ in batches])
    labels = np.concatenate([l.numpy() for _, l in batches]) if batches else np.zeros([0])
    return reader, features, labels


def assert_same(a, b):
    (_, fa, la), (_, fb, lb) = a, b
    np.testing.assert_array_equal(la, lb)
    assert fa.keys() == fb.keys()
    for k in fa:
        if isinstance(fa[k], list):
            assert fa[k] == fb[k], k
        else:
            np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


@pytest.fixture(scope="module")
def text():
    return read_all([SAMPLE])


def test_parquet_by_pyarrow_gives_the_text_readers_keys(tmp_path, text):
    table = pacsv.read_csv(SAMPLE)  # pyarrow's own type inference: doubles, strings, some int64 columns
    path = str(tmp_path / "criteo.parquet")
    pq.write_table(table, path, row_group_size=37)
    assert pq.ParquetFile(path).metadata.num_row_groups > 4
    parquet = read_all([path])
    assert_same(parquet, text)
    ids = parquet[1]["ids"]
    assert ids[0, 0] == ttf.data.field_key(0, "05db9164")  # the contract, stated in Python


def test_parquet_by_duckdb_gives_the_text_readers_keys(tmp_path, text):
    path = str(tmp_path / "duck.parquet")
    duckdb.sql(f"COPY (SELECT * FROM read_csv('{SAMPLE}', header=true)) TO '{path}' (FORMAT parquet, "
               "ROW_GROUP_SIZE 64)")
    assert_same(read_all([path]), text)


def test_tfrecord_plain_and_gzip_give_the_text_readers_keys(tmp_path, text):
    table = pacsv.read_csv(SAMPLE, convert_options=pacsv.ConvertOptions(
        column_types={f"C{i}": pa.string() for i in range(1, 27)}))
    rows = table.to_pylist()
    paths = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord.gz")]
    for path, part in zip(paths, (rows[:120], rows[120:])):
        options = tf.io.TFRecordOptions(compression_type="GZIP" if path.endswith(".gz") else "")
        with tf.io.TFRecordWriter(path, options) as writer:
            for row in part:
                feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[row["label"]]))}
                for i in range(1, 14):  # absent when missing
                    if row[f"I{i}"] is not None:
                        feature[f"I{i}"] = tf.train.Feature(float_list=tf.train.FloatList(value=[row[f"I{i}"]]))
                for i in range(1, 27):
                    if row[f"C{i}"] is not None:
                        feature[f"C{i}"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[f"C{i}"].encode()]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    _, features, labels = read_all(paths)
    np.testing.assert_array_equal(labels, text[2])
    np.testing.assert_array_equal(features["ids"], text[1]["ids"])
    # float_list holds float32: the dense values are those of float32(x) (exact for Criteo's counts)
    np.testing.assert_allclose(features["dense"], text[1]["dense"], rtol=1e-6)


SHOP = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Dense("price", transform="none", default=-1.0),
                        ttf.data.Dense("count"), ttf.data.Categorical("user", values="int"),
                        ttf.data.Categorical("item"), ttf.data.Hour("hour"), ttf.data.Skip("note"),
                        ttf.data.MultiHot("tags", separator="|"), ttf.data.MultiHot("cats", values="int")],
                       delimiter=",", header=True, name="shop")


def shop_rows():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(300):
        rows.append(dict(click=int(rng.integers(2)), price=None if i % 7 == 0 else float(rng.normal()),
                         count=None if i % 5 == 0 else int(rng.integers(-3, 10_000)),
                         user=None if i % 11 == 0 else int(rng.integers(0, 1 << 40)),
                         item=None if i % 13 == 0 else str(rng.choice(["05db9164", "abc", "12", "ü", "", "FFFF"])),
                         hour=None if i % 17 == 0 else int(rng.choice([14102100, 14102923, 16022912])),
                         note="x",
                         tags=None if i % 4 == 0 else [str(t) for t in rng.choice(["a", "b", "7f", "z z"],
                                                                                  int(rng.integers(0, 4)))],
                         cats=[int(c) for c in rng.integers(0, 1000, int(rng.integers(0, 3)))]))
    return rows


def text_of(rows, path):
    def field(v):
        return "" if v is None else "|".join(map(str, v)) if isinstance(v, list) else repr(v) if \
            isinstance(v, float) else str(v)
    with open(path, "w") as f:
        f.write(SHOP.header_line() + "\n")
        for row in rows:
            f.write(",".join(field(row[c.name]) for c in SHOP.columns) + "\n")
    return path


def test_nulls_ints_hours_and_lists_match_text(tmp_path):
    rows = shop_rows()
    path = str(tmp_path / "shop.parquet")
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("click", pa.int8()), ("price", pa.float64()), ("count", pa.int32()), ("user", pa.int64()),
        ("item", pa.string()), ("hour", pa.int64()), ("note", pa.string()), ("tags", pa.list_(pa.string())),
        ("cats", pa.large_list(pa.int64()))]))
    pq.write_table(table, path, row_group_size=50, use_dictionary=["item"])
    assert_same(read_all([path], SHOP), read_all([text_of(rows, tmp_path / "shop.csv")], SHOP))


def test_bad_rows_name_file_row_group_and_row_and_are_counted(tmp_path):
    path = str(tmp_path / "bad.parquet")
    labels = [0, 1, 0, 1] * 25
    labels[57] = 2
    labels[90] = None
    table = pa.table({"click": pa.array(labels, pa.float32()), "price": np.arange(100.0), "count": np.arange(100),
                      "user": np.arange(100), "item": ["a"] * 100, "hour": [14102100] * 100, "tags": [["a"]] * 100,
                      "cats": [[1]] * 100})
    pq.write_table(table, path, row_group_size=40)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"bad.parquet: row group 1, row 17: bad shop row: label column click must be 0 or 1"):
        read_all([path], SHOP)
    reader, _, got = read_all([path], SHOP, strict=False)
    assert len(got) == 98 and reader.bad_lines == 2


def test_file_errors_are_one_line(tmp_path):
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"label": [0, 1], "I1": [1.0, 2.0]}), path)
    with pytest.raises(ValueError, match=r"x.parquet: no column 'I2', which schema 'criteo' reads"):
        ttf.data.Reader(path)
    schema = ttf.data.Schema([ttf.data.Label("label"), ttf.data.Categorical("I1")])
    with pytest.raises(ValueError, match=r"x.parquet: column 'I1' is double; a Categorical column takes an integer "
                                         r"or string$"):
        ttf.data.Reader(path, schema)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"x.parquet: not a readable Parquet file .*truncated or corrupt"):
        ttf.data.Reader(path, schema)
    record = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(record) as writer:
        writer.write(b"not an example" * 10)
    with open(record, "r+b") as f:
        f.truncate(30)
    with pytest.raises(ValueError, match=r"x.tfrecord: not a readable TFRecord file"):
        ttf.data.Reader(record)


def test_folders_globs_and_one_format(tmp_path):
    out = tmp_path / "spark"
    out.mkdir()
    table = pacsv.read_csv(SAMPLE)
    for i in range(3):
        pq.write_table(table.slice(i * 70, 70), str(out / f"part-{i:05d}-abc.snappy.parquet"))
    (out / "_SUCCESS").write_text("")
    (out / ".part-00000-abc.snappy.parquet.crc").write_bytes(b"crc")
    (out / "part-00000.crc").write_bytes(b"crc")
    (out / "noext").write_bytes(open(out / "part-00001-abc.snappy.parquet", "rb").read())  # PAR1 magic
    files = ttf.data.expand_paths([str(out)])
    assert [os.path.basename(f) for f in files] == ["noext"] + [f"part-{i:05d}-abc.snappy.parquet" for i in range(3)]
    assert ttf.data.data_format(files) == "parquet"
    assert ttf.data.expand_paths(str(out / "part-*.parquet")) == files[1:]
    _, features, _ = read_all([str(out / "part-*.parquet")])
    assert len(features["ids"]) == 200
    with pytest.raises(ValueError, match=r"the data files mix formats: parquet \(.*\), text \(.*criteo_sample"):
        ttf.data.Reader([str(out), SAMPLE])
    with pytest.raises(ValueError, match="no data files match"):
        ttf.data.expand_paths(str(tmp_path / "nothing-*.parquet"))


def position_rows(dataset, tracker, limit=None):
    """Fingerprints (first dense raw value) of the batches read, each recorded in tracker."""
    out = []
    for i, (features, labels, position) in enumerate(dataset):
        if limit is not None and i == limit:
            break
        out.append(np.round(features["dense"][:, 0].numpy()).astype(np.int64))
        tracker.record(position, tf.size(labels))
    return list(np.concatenate(out)) if out else []


def fingerprint_files(tmp_path):
    """Parquet (row groups of 50) and TFRecord (two files) of 400 rows whose 'price' is the row's index."""
    schema = ttf.data.Schema([ttf.data.Label("click"), ttf.data.Dense("price", transform="none"),
                              ttf.data.Categorical("user")], name="fp")
    parquet = str(tmp_path / "fp.parquet")
    pq.write_table(pa.table({"click": [i % 2 for i in range(400)], "price": np.arange(400.0),
                             "user": np.arange(400)}), parquet, row_group_size=50)
    records = []
    for name, part in (("a.tfrecord", range(0, 250)), ("b.tfrecord.gz", range(250, 400))):
        path = str(tmp_path / name)
        records.append(path)
        with tf.io.TFRecordWriter(path, "GZIP" if name.endswith(".gz") else "") as writer:
            for i in part:
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "click": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
                    "price": tf.train.Feature(float_list=tf.train.FloatList(value=[i])),
                    "user": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})).SerializeToString())
    return schema, [parquet], records


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_shares_and_a_restored_position_read_every_row_once(tmp_path, fmt):
    schema, parquet, records = fingerprint_files(tmp_path)
    reader = ttf.data.Reader(parquet if fmt == "parquet" else records, schema)
    shares = [position_rows(reader.share_dataset(16, i, 2, window_lines=60), ttf.data.InputPosition(2))
              for i in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(400)) and min(map(len, shares)) >= 150
    # Share 0 stops after 7 batches (a checkpoint), then resumes from the position: nothing again, nothing lost.
    tracker = ttf.data.InputPosition(2)
    first = position_rows(reader.share_dataset(16, 0, 2, position=tracker, window_lines=60, num_epochs=2),
                          tracker, limit=7)
    rest = position_rows(reader.share_dataset(16, 0, 2, position=tracker, window_lines=60, num_epochs=2), tracker)
    both = first + rest
    assert len(both) == 2 * len(shares[0]) and sorted(both) == sorted(shares[0] * 2)
    assert both[:len(shares[0])] == shares[0]  # the same order as an uninterrupted read
    assert int(tracker.examples[0]) == len(both)


def test_folder_stream_reads_parquet_and_tfrecord_files_exactly_once(tmp_path):
    schema, parquet, records = fingerprint_files(tmp_path)
    for fmt, sources in (("parquet", parquet), ("tfrecord", records)):
        folder, ckpt = tmp_path / f"in-{fmt}", tmp_path / f"ckpt-{fmt}"
        folder.mkdir()
        for i, source in enumerate(sources):  # renamed into place whole, as a producer does
            os.rename(source, folder / f"part-{i:03d}{os.path.basename(source)[1:]}")
        (folder / "_SUCCESS").write_text("")

        def drain(stream, batch_size, rows):
            got = []
            while len(got) < rows:
                batch = stream.next_batch(batch_size, block=False)
                got += list(np.round(batch.features["dense"][:, 0].numpy()).astype(np.int64))
                stream.commit(batch)
            return got

        first = ttf.data.FolderStream(str(folder), schema, poll_seconds=0.05)
        before = drain(first, 70, 210)  # ends inside a file (TFRecord) or row group span (Parquet)
        saved = tf.train.Checkpoint(stream_position=first).save(str(ckpt / "c"))
        drain(first, 70, 70)  # trained after the checkpoint: lost with the process
        resumed = ttf.data.FolderStream(str(folder), schema, poll_seconds=0.05)
        tf.train.Checkpoint(stream_position=resumed).restore(saved).assert_existing_objects_matched()
        after = drain(resumed, 70, 190)
        assert before + after == list(range(400)), fmt  # neither skipped nor repeated, in file order
        assert resumed.next_batch(70, block=False) is None and int(resumed.examples.numpy()) == 400


def test_every_format_reads_through_tensorflows_file_systems(tmp_path, text):
    """ram:// (TensorFlow's in-process file system) stands for gs://, s3://, hdfs://: listing,
    globbing, format detection and reading all go through tf.io.gfile."""
    folder, columns = "ram://ttf_formats_test/text", "ram://ttf_formats_test/columns"  # ram:// lists by prefix:
    tf.io.gfile.makedirs(folder)  # no folder name may start another's
    tf.io.gfile.copy(SAMPLE, f"{folder}/part-0.csv", overwrite=True)
    local = str(tmp_path / "p.parquet")
    pq.write_table(pacsv.read_csv(SAMPLE), local, row_group_size=64)
    tf.io.gfile.makedirs(columns)
    tf.io.gfile.copy(local, f"{columns}/part-0", overwrite=True)  # no suffix: PAR1 magic
    tf.io.gfile.GFile(f"{columns}/_SUCCESS", "w").close()
    assert_same(read_all([folder]), text)
    assert_same(read_all([columns]), text)
    reader = ttf.data.Reader(f"{columns}/part-*")
    assert reader.format == "parquet" and sum(len(l) for _, l, _ in reader.share_dataset(64, 1, 2)) > 0


def test_parquet_on_another_file_system_is_read_in_place_a_row_group_at_a_time(tmp_path, monkeypatch):
    """A Parquet file on ram:// (as on gs://) is read through tf.io.gfile.GFile, not copied: reading
    one row group reads its column chunks, not the file, and gives what the local file gives."""
    local, remote = str(tmp_path / "p.parquet"), "ram://ttf_parquet_in_place/p.parquet"
    pq.write_table(pacsv.read_csv(SAMPLE), local, row_group_size=25)
    tf.io.gfile.makedirs("ram://ttf_parquet_in_place")
    tf.io.gfile.copy(local, remote, overwrite=True)
    read_bytes = []
    plain_read = _columnar._GFileHandle.read

    def counted(self, n=-1):
        data = plain_read(self, n)
        read_bytes.append(len(data))
        return data

    monkeypatch.setattr(_columnar._GFileHandle, "read", counted)
    reader = ttf.data.Reader(remote)
    source = reader._source  # the row groups; one decoded alone below
    assert len(source.units) == 8
    read_bytes.clear()
    source._read(3, 0, 5)
    assert 0 < sum(read_bytes) < os.path.getsize(local) / 4, (sum(read_bytes), os.path.getsize(local))
    assert_same(read_all([remote]), read_all([local]))
