"""The C++ Criteo parser and the reader against a pure-Python reference parser."""
import gzip
import hashlib
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import ttf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "criteo_sample.txt")
NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_criteo(lines, filenames, line_numbers, strict=True):
    """(labels, dense, ids, bad) of the schema parser with the criteo schema."""
    features, labels, bad = ttf.data.parse_lines(lines, filenames, line_numbers, "criteo", strict=strict)
    return labels, features["dense"], features["ids"], bad


def reference_number(text):
    """The parser's number grammar in plain Python: None when not a number."""
    if text == "":
        return 0.0
    if not NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def reference_parse(line):
    """(label, dense [13], ids [26]) of one line in plain Python, or None for a bad line."""
    fields = line.rstrip("\r\n").split("\t" if "\t" in line else ",")
    if len(fields) != 40:
        return None
    label = reference_number(fields[0]) if fields[0] else None
    numbers = [reference_number(x) for x in fields[1:14]]
    if label not in (0.0, 1.0) or any(x is None for x in numbers):
        return None
    dense = [math.log1p(max(x, 0.0)) for x in numbers]
    return label, dense, [ttf.data.field_key(f, v) for f, v in enumerate(fields[14:])]


def expected_from(lines):
    parsed = [p for p in map(reference_parse, lines) if p is not None]
    return (np.array([p[2] for p in parsed], np.int64).reshape(-1, 26),
            np.array([p[1] for p in parsed], np.float32).reshape(-1, 13), np.array([p[0] for p in parsed], np.float32))


def collect(dataset):
    batches = list(dataset)
    return (np.concatenate([f["ids"].numpy() for f, _ in batches]), np.concatenate([f["dense"].numpy() for f, _ in batches]),
            np.concatenate([y.numpy() for _, y in batches]))


def read_all(paths, batch_size=64, **kwargs):
    reader = ttf.data.CriteoReader(paths, **kwargs)
    return (reader,) + collect(reader.dataset(batch_size, shuffle=False))


def write(path, lines, header=False):
    text = (ttf.data.CSV_HEADER + "\n" if header else "") + "\n".join(lines) + "\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def row(label="0", ints=None, cats=None, sep="\t"):
    ints = ["1"] * 13 if ints is None else ints
    cats = ["a1"] * 26 if cats is None else cats
    return sep.join([label] + list(ints) + list(cats))


# Hand-written lines: empty fields, negative ints and -1, decimals and exponents, values
# that are not 8-hex-digit strings (hashed), upper-case hex, and a Windows line end.
HAND_ROWS = [
    (["1", "", "-1", "0", "-5", "3.0", "1e3", "+7", ".5", "5.", "12345678901234567890", "", "2"],
     ["05db9164", "", "ABCDEF01", "abcdef01", "0", "123456789", "zz top", "é-ü", "-1", "ffffffff"] + ["7"] * 16),
    ([""] * 13, [""] * 26),
    (["0"] * 13, ["68fd1e64"] * 26),
]


def hand_lines(sep):
    lines = [row(str(i % 2), ints, cats, sep) for i, (ints, cats) in enumerate(HAND_ROWS)]
    return lines[:-1] + [lines[-1] + "\r"]


def test_bundled_sample_is_the_documented_file():
    with open(SAMPLE, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == "08b84f12a22438fb534e989a5e4fa245726b2bda001983556bc2aea2f094f724"


def test_real_sample_matches_reference():
    _, ids, dense, labels = read_all([SAMPLE])
    lines = open(SAMPLE).read().splitlines()[1:]  # without the header
    exp_ids, exp_dense, exp_labels = expected_from(lines)
    np.testing.assert_array_equal(ids, exp_ids)
    np.testing.assert_array_equal(labels, exp_labels)
    np.testing.assert_allclose(dense, exp_dense, rtol=1e-6)  # float32 of the same double log1p
    assert len(labels) == 200 and labels.sum() == 49  # label rate 0.245 (data/README.md)


@pytest.mark.parametrize("sep,header", [("\t", False), (",", True)])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_hand_written_lines_match_reference(tmp_path, sep, header, suffix):
    lines = hand_lines(sep)
    path = write(tmp_path / f"hand.txt{suffix}", lines, header=header)
    _, ids, dense, labels = read_all([path])
    exp_ids, exp_dense, exp_labels = expected_from(lines)
    assert len(labels) == len(lines)
    np.testing.assert_array_equal(ids, exp_ids)
    np.testing.assert_allclose(dense, exp_dense, rtol=1e-6)
    np.testing.assert_array_equal(labels, exp_labels)
    assert dense[0, 1] == 0.0 and dense[0, 2] == 0.0  # missing is 0, -1 clips to 0
    assert ids[0, 2] == (2 << 56) | 0xABCDEF01 and ids[0, 3] == (3 << 56) | 0xABCDEF01


def test_tsv_csv_and_gzip_forms_of_the_sample_read_the_same(tmp_path):
    lines = open(SAMPLE).read().splitlines()[1:]
    tsv = write(tmp_path / "day_0.tsv", [line.replace(",", "\t") for line in lines])
    tsv_gz = write(tmp_path / "day_0.tsv.gz", [line.replace(",", "\t") for line in lines])
    csv_gz = write(tmp_path / "day_0.csv.gz", lines, header=True)
    _, ids_csv, dense_csv, labels_csv = read_all([SAMPLE])
    for path in (tsv, tsv_gz, csv_gz):
        _, ids, dense, labels = read_all([path])
        np.testing.assert_array_equal(ids, ids_csv)
        np.testing.assert_array_equal(dense, dense_csv)
        np.testing.assert_array_equal(labels, labels_csv)


def test_parse_op_matches_reference_with_scalar_or_per_line_filenames():
    lines = hand_lines("\t") + hand_lines(",")
    exp_ids, exp_dense, exp_labels = expected_from(lines)
    for filenames in ("one.tsv", ["one.tsv"] * len(lines)):
        labels, dense, ids, bad = parse_criteo(lines, filenames, np.arange(1, len(lines) + 1))
        np.testing.assert_array_equal(ids.numpy(), exp_ids)
        np.testing.assert_allclose(dense.numpy(), exp_dense, rtol=1e-6)
        np.testing.assert_array_equal(labels.numpy(), exp_labels)
        assert int(bad) == 0
    labels, dense, ids, bad = parse_criteo(tf.zeros([0], tf.string), "x", tf.zeros([0], tf.int64))
    assert ids.shape == (0, 26) and dense.shape == (0, 13) and labels.shape == (0,) and int(bad) == 0


def test_key_contract():
    key = ttf.data.field_key
    assert key(0, "05db9164") == 0x05DB9164
    assert key(3, "05db9164") == (3 << 56) | 0x05DB9164
    assert key(3, "ABCDEF01") == key(3, "abcdef01")  # hex is case-insensitive
    missing = [key(f, "") for f in range(26)]
    assert len(set(missing)) == 26 and all(k & ((1 << 56) - 1) == ttf.data.MISSING_VALUE for k in missing)
    assert all(k >> 56 == f for f, k in enumerate(missing))
    for value in ("not-hex-value", "123456789", "-1", "é"):
        hashed = key(5, value)
        assert (1 << 32) <= hashed & ((1 << 56) - 1) < ttf.data.MISSING_VALUE and hashed >> 56 == 5
    with pytest.raises(ValueError, match="field must be in"):
        key(128, "a")
    # The same strings in every field give 26 * len(values) distinct keys, and the C++
    # parser agrees with field_key on each of them.
    values = ["", "0", "7", "ffffffff", "05db9164", "123456789", "zz top", "é-ü", "x" * 300]
    lines = [row("1", cats=[v] * 26) for v in values]
    _, _, ids, _ = parse_criteo(lines, "x", np.arange(1, len(lines) + 1))
    ids = ids.numpy()
    assert len(set(ids.ravel().tolist())) == 26 * len(values)
    np.testing.assert_array_equal(ids, expected_from(lines)[0])


BAD_NUMBERS = [" 5", "5 ", "1_0", "0x10", "nan", "inf", "1e", "--1", ".", "1.2.3", "1e999", "abc"]
GOOD_NUMBERS = ["+3", ".5", "5.", "1e3", "-2", "1E-400", "007"]


def test_number_grammar():
    lines = [row(ints=[v] + ["1"] * 12) for v in BAD_NUMBERS + GOOD_NUMBERS]
    labels, dense, _, bad = parse_criteo(lines, "x", np.arange(1, len(lines) + 1), strict=False)
    assert int(bad) == len(BAD_NUMBERS)
    assert all(reference_number(v) is None for v in BAD_NUMBERS)
    expected = [math.log1p(max(reference_number(v), 0.0)) for v in GOOD_NUMBERS]
    np.testing.assert_allclose(dense.numpy()[:, 0], expected, rtol=1e-6)
    for label in ("2", "-1", "", "0.5", "yes"):
        _, _, _, bad = parse_criteo([row(label)], "x", [1], strict=False)
        assert int(bad) == 1, label
    labels, _, _, _ = parse_criteo([row("1.0"), row("0.0"), row("+1")], "x", [1, 2, 3])
    np.testing.assert_array_equal(labels.numpy(), [1, 0, 1])


def test_strict_mode_names_file_and_line(tmp_path):
    good = row()
    path = write(tmp_path / "bad.tsv", [good, good, "1\t2\t3", good])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad\.tsv:3: bad criteo line: has 3 columns, the schema declares 40"):
        read_all([path])
    path = write(tmp_path / "bad2.tsv", [good, row(ints=["x"] + ["1"] * 12)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad2\.tsv:2: .*dense column I1 is not a number: 'x'"):
        read_all([path])
    # CSV with a header: the header is line 1. Gzip, a second file, and shuffling: the
    # number is still the line's own in its own file.
    csv_path = write(tmp_path / "day.csv.gz", [row(sep=",")] * 700 + [row("7", sep=",")], header=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"day\.csv\.gz:702: bad criteo line: label column label must be 0 or 1, got '7'"):
        read_all([write(tmp_path / "ok.tsv", [good] * 5), csv_path])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"day\.csv\.gz:702: "):
        list(ttf.data.CriteoReader([csv_path]).dataset(32, shuffle=True, seed=3))
    extra = write(tmp_path / "extra.tsv", [good + "\tmore"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"extra\.tsv:1: bad criteo line: has 41 columns, the schema declares 40"):
        read_all([extra])


def test_lenient_mode_skips_and_counts_exactly_the_bad_lines(tmp_path, capfd):
    good = row("1", ints=["2"] * 13, cats=["b2"] * 26)
    bad = ["1\t2", row("7"), good + "\textra", row(ints=["nan?"] + ["1"] * 12), ""]
    lines = [good, bad[0], good, bad[1], bad[2], good, bad[3], good, bad[4], good] * 30  # 150 bad, 150 good
    path = write(tmp_path / "mixed.tsv", lines)
    reader = ttf.data.CriteoReader([path], strict=False)
    batches = list(reader.dataset(batch_size=64, shuffle=False))
    assert [int(y.shape[0]) for _, y in batches] == [64, 64, 22]  # exact batch sizes after skipping
    ids, _, labels = collect(batches)
    assert len(labels) == 150 and reader.bad_lines == 150
    np.testing.assert_array_equal(ids, expected_from([good] * 150)[0])
    assert "skipped 150 bad line(s)" in reader.report()
    assert "ttf.data: skipped 150 more bad line(s), 150 in all, in" in capfd.readouterr().err  # printed at the end
    list(reader.dataset(batch_size=64, shuffle=True, num_epochs=2))  # every pass counts again
    assert reader.bad_lines == 450
    err = capfd.readouterr().err
    assert "skipped 150 more bad line(s), 300 in all" in err and "skipped 150 more bad line(s), 450 in all" in err
    clean = ttf.data.CriteoReader([SAMPLE], strict=False)
    list(clean.dataset(64))
    assert clean.bad_lines == 0 and "ttf.data: skipped" not in capfd.readouterr().err  # nothing to say


def test_shuffle_is_seeded_complete_and_changes_every_pass(tmp_path):
    lines = [row(str(i % 2), ints=[str(i)] + ["1"] * 12) for i in range(3000)]
    path = write(tmp_path / "many.tsv", lines)
    reader = ttf.data.CriteoReader([path])

    def first_column(dataset):
        return collect(dataset)[1][:, 0]

    a = first_column(reader.dataset(100, seed=1, block_lines=64, shuffle_window=2048, num_epochs=2))
    b = first_column(reader.dataset(100, seed=1, block_lines=64, shuffle_window=2048, num_epochs=2))
    c = first_column(reader.dataset(100, seed=2, block_lines=64, shuffle_window=2048, num_epochs=2))
    ordered = first_column(reader.dataset(100, shuffle=False))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a[:3000], a[3000:])
    np.testing.assert_array_equal(np.sort(a[:3000]), ordered)  # every row once per pass
    np.testing.assert_array_equal(np.sort(a[3000:]), ordered)
    # A batch mixes rows from many distant parts of the file.
    first_batch = np.expm1(a[:100]).round().astype(int)
    assert len(set(first_batch // 64)) > 10


def test_split_drop_remainder_and_multiple_files(tmp_path):
    lines = [row(ints=[str(i)] + ["1"] * 12) for i in range(1, 101)]
    path = write(tmp_path / "a.tsv", lines)
    reader = ttf.data.CriteoReader([path, SAMPLE])
    _, dense_eval, _ = collect(reader.dataset(16, shuffle=False, split="eval"))
    _, dense_train, _ = collect(reader.dataset(16, shuffle=False, split="train"))
    assert len(dense_eval) == 20 + 40 and len(dense_train) == 80 + 160  # sample: lines 2..201
    np.testing.assert_allclose(np.expm1(dense_eval[:20, 0]), np.arange(5, 101, 5), rtol=1e-5)
    ds = reader.dataset(64, drop_remainder=True, num_epochs=2)
    assert ds.element_spec[1].shape == (64,) and ds.element_spec[0]["ids"].shape == (64, 26)
    assert sum(int(y.shape[0]) for _, y in ds) == (600 // 64) * 64


def test_criteo_dataset_shorthand():
    ds = ttf.data.criteo_dataset(SAMPLE, 64, shuffle=False)
    assert [int(y.shape[0]) for _, y in ds] == [64, 64, 64, 8]
    features, labels = ds.element_spec
    assert features["ids"].dtype == tf.int64 and features["dense"].dtype == tf.float32 and labels.dtype == tf.float32


def test_parse_op_bad_input_is_a_clear_error():
    with pytest.raises(tf.errors.InvalidArgumentError, match="lines must be rank 1"):
        parse_criteo([["a"]], [["x"]], [[1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="filenames must be a scalar or have the shape of lines"):
        parse_criteo(["a", "b"], ["x"], [1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="line_numbers must have the shape of lines"):
        parse_criteo(["a", "b"], "x", [1])
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        parse_criteo([1, 2], ["x", "y"], [1, 2])
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        parse_criteo(["a"], "x", [1.5])
    # In a graph, the shape function rejects a wrong rank before anything runs.
    with pytest.raises(ValueError, match="must be rank 1"):
        tf.function(lambda: parse_criteo(tf.constant([["a"]]), "x", tf.constant([[1]], tf.int64))).get_concrete_function()
    with pytest.raises(FileNotFoundError, match="not found"):
        ttf.data.CriteoReader(["/no/such/file.tsv"])
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        ttf.data.CriteoReader(SAMPLE).dataset(0)


def test_random_lines_match_the_reference_on_fast_and_general_paths():
    """The parser reads plain counts and up-to-8-hex-digit values in a fast path and the rest
    in a general one: random lines mixing both, and cut or extended lines, match the reference."""
    rng = np.random.default_rng(7)
    ints = ["", "0", "7", "123456789012345678", "1234567890123456789", "-1", "+3", "1.5", "1e3", "x", "0x1", " 1"]
    cats = ["", "a", "0", "ffffffff", "FFFFFFFF", "123456789", "abcdefg", "12345678", "1234567", "-1", "é", "g"]
    lines = []
    for _ in range(3000):
        fields = ([str(rng.integers(0, 2))] + [ints[i] for i in rng.integers(0, len(ints), 13)]
                  + [cats[i] for i in rng.integers(0, len(cats), 26)])
        if rng.random() < 0.1:
            fields = fields[: rng.integers(1, 40)] if rng.random() < 0.5 else fields + ["5"]
        lines.append(("\t" if rng.random() < 0.5 else ",").join(fields))
    labels, dense, ids, bad = parse_criteo(lines, "x", np.arange(1, len(lines) + 1), strict=False)
    exp_ids, exp_dense, exp_labels = expected_from(lines)
    assert int(bad) == len(lines) - len(exp_labels) and int(bad) > 300
    np.testing.assert_array_equal(ids.numpy(), exp_ids)
    np.testing.assert_allclose(dense.numpy(), exp_dense, rtol=1e-6)
    np.testing.assert_array_equal(labels.numpy(), exp_labels)
