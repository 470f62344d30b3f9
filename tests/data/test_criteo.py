"""The C++ Criteo parser and the reader against a pure-Python reference parser."""
import gzip
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "criteo_sample.txt")


def reference_parse(line):
    """(label, dense [13], ids [26]) of one line, in plain Python."""
    fields = line.rstrip("\n").split("\t" if "\t" in line else ",")
    assert len(fields) == 40
    dense = [math.log1p(max(float(x), 0.0)) if x else 0.0 for x in fields[1:14]]
    ids = [ttf.data.field_key(f, v) for f, v in enumerate(fields[14:])]
    return float(fields[0]), dense, ids


def read_all(paths, **kwargs):
    reader = ttf.data.CriteoReader(paths, **kwargs)
    batches = list(reader.dataset(batch_size=64, shuffle=False))
    ids = np.concatenate([f["ids"].numpy() for f, _ in batches])
    dense = np.concatenate([f["dense"].numpy() for f, _ in batches])
    labels = np.concatenate([y.numpy() for _, y in batches])
    return reader, ids, dense, labels


def expected_from(lines):
    parsed = [reference_parse(line) for line in lines]
    return (np.array([p[2] for p in parsed], np.int64), np.array([p[1] for p in parsed], np.float32),
            np.array([p[0] for p in parsed], np.float32))


def test_real_sample_matches_reference():
    _, ids, dense, labels = read_all([SAMPLE])
    lines = open(SAMPLE).read().splitlines()[1:]  # without the header
    exp_ids, exp_dense, exp_labels = expected_from(lines)
    np.testing.assert_array_equal(ids, exp_ids)
    np.testing.assert_array_equal(labels, exp_labels)
    np.testing.assert_allclose(dense, exp_dense, rtol=1e-6)  # float32 log1p vs double, rounded
    assert len(labels) == 200 and labels.sum() == 49  # label rate 0.245 (data/README.md)


def test_tsv_and_gzip_forms_read_the_same(tmp_path):
    lines = open(SAMPLE).read().splitlines()[1:]
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("\n".join(line.replace(",", "\t") for line in lines) + "\n")
    gz = tmp_path / "day_0.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write(ttf.data.CSV_HEADER + "\n" + "\n".join(lines) + "\n")
    _, ids_csv, dense_csv, labels_csv = read_all([SAMPLE])
    for path in (tsv, gz):
        _, ids, dense, labels = read_all([str(path)])
        np.testing.assert_array_equal(ids, ids_csv)
        np.testing.assert_array_equal(dense, dense_csv)
        np.testing.assert_array_equal(labels, labels_csv)


def test_key_contract():
    assert ttf.data.field_key(0, "05db9164") == 0x05DB9164
    assert ttf.data.field_key(3, "05db9164") == (3 << 56) | 0x05DB9164
    missing = [ttf.data.field_key(f, "") for f in range(26)]
    assert len(set(missing)) == 26 and all(k & ((1 << 56) - 1) == ttf.data.MISSING_VALUE for k in missing)
    hashed = ttf.data.field_key(5, "not-hex-value")
    assert (1 << 32) <= hashed & ((1 << 56) - 1) < ttf.data.MISSING_VALUE and hashed >> 56 == 5
    # The same string in two fields never collides; the C++ parser agrees on every case.
    line = "1\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["abc", "", "zz top", "ffffffff", "123456789"] + ["7"] * 21)
    _, _, ids, _ = ops().ttf_parse_criteo([line], ["x"], [1])
    assert list(ids.numpy()[0]) == reference_parse(line)[2]
    assert len(set(ids.numpy()[0][5:])) == 21


def test_strict_mode_names_file_and_line(tmp_path):
    path = tmp_path / "bad.tsv"
    good = "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["a1"] * 26)
    path.write_text("\n".join([good, good, "1\t2\t3", good]) + "\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad\.tsv:3: bad Criteo line: has 3 fields, expected 40"):
        read_all([str(path)])
    path.write_text("\n".join([good, good.replace("0\t1\t1", "0\tx\t1", 1)]) + "\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad\.tsv:2: .*I1 is not a number: 'x'"):
        read_all([str(path)])


def test_lenient_mode_skips_and_counts_exactly_the_bad_lines(tmp_path, capsys):
    path = tmp_path / "mixed.tsv"
    good = "1\t" + "\t".join(["2"] * 13) + "\t" + "\t".join(["b2"] * 26)
    bad = ["1\t2", "7\t" + good[2:], good + "\textra", good.replace("\t2\t", "\tnan?\t", 1)]
    path.write_text("\n".join([good, bad[0], good, bad[1], bad[2], good, bad[3]]) + "\n")
    reader, ids, _, labels = read_all([str(path)], strict=False)
    assert len(labels) == 3 and reader.bad_lines == 4
    assert "skipped 4 bad line(s)" in reader.report()


def test_parse_op_bad_input_is_a_clear_error():
    with pytest.raises(tf.errors.InvalidArgumentError, match="lines must be rank 1"):
        ops().ttf_parse_criteo([["a"]], [["x"]], [[1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="line_numbers must have the shape of lines"):
        ops().ttf_parse_criteo(["a", "b"], ["x"], [1, 2])
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        ops().ttf_parse_criteo([1, 2], ["x", "y"], [1, 2])
    with pytest.raises(FileNotFoundError, match="not found"):
        ttf.data.CriteoReader(["/no/such/file.tsv"])
