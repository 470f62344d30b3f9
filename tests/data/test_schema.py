"""Schemas (declared in Python or JSON), the schema-driven C++ parser against a plain-Python
reference for every column kind, and the reader's errors on files that do not match."""
import datetime
import gzip
import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.data import Categorical, Dense, Hour, Label, MultiHot, Schema, Skip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "criteo_sample.txt")

SHOP = Schema([Skip("row"), Label("click"), Dense("price", transform="none", default=-1.5), Dense("views"),
               Categorical("user", values="int"), Categorical("item"), Categorical("shop", values="string"),
               MultiHot("tags", separator="|"), MultiHot("seen", separator=";", values="int", combiner="sum"),
               Hour("hour")], delimiter=",", header=True, name="shop")


def reference(schema, line):
    """(label, dense, ids, {multi-hot name: keys}) of one line in plain Python, or None when bad."""
    fields = line.rstrip("\r\n").split(schema.delimiter)
    if len(fields) != len(schema.columns):
        return None
    label, dense, ids, bags = None, [], [], {}
    for column, text in zip(schema.columns, fields):
        try:
            if column.kind == "label":
                label = float(text)
                if label not in (0.0, 1.0):
                    return None
            elif column.kind == "dense":
                x = float(text) if text else column.default
                dense.append(math.log1p(max(x, 0.0)) if column.transform == "log1p" else x)
            elif column.kind == "categorical":
                ids.append(ttf.data.field_key(schema.field_index(column.name), text, column.values))
            elif column.kind == "hour":
                if text:
                    stamp = datetime.datetime.strptime("20" + text, "%Y%m%d%H")
                    values = [stamp.hour, stamp.weekday()]
                ids += [ttf.data.field_key(schema.field_index(name), "" if not text else str(v), "int")
                        for name, v in zip(column.fields, values if text else [0, 0])]
            elif column.kind == "multi_hot":
                field = schema.field_index(column.name)
                bags[column.name] = [ttf.data.field_key(field, v, column.values)
                                     for v in text.split(column.separator) if v]
        except ValueError:
            return None
    return label, dense, ids, bags


def check_against_reference(schema, lines, features, labels):
    parsed = [p for p in (reference(schema, line) for line in lines) if p is not None]
    np.testing.assert_array_equal(labels, [p[0] for p in parsed])
    if schema.num_dense:
        np.testing.assert_allclose(features["dense"], np.array([p[1] for p in parsed], np.float32), rtol=1e-6)
    if schema.num_fields:
        np.testing.assert_array_equal(features["ids"], np.array([p[2] for p in parsed], np.int64))
    for name in schema.multi_hot_names:
        assert features[name].to_list() == [p[3][name] for p in parsed], name
    return len(parsed)


SHOP_LINES = [
    "r1,1,2.5,3,42,05db9164,05db9164,a|b|c,1;2;3,14102100",
    "r2,0,,,0,,,,,",                                   # every value missing: defaults, missing keys, empty lists
    "r3,1,-7e1,-2,72057594037927934,zz top,é,x||y|,7;;8;,14103123",  # empty items skipped; largest int value
    "r4,0,.5,12,7,ABCDEF01,abcdef01,9,10,16022923",   # 2016-02-29 (a leap day), a Monday
    "r5,1,1,1,1,1,1,,,14102223\r",                    # a Windows line end
]


def write(path, text):
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def read(path, schema, strict=True, batch_size=2):
    reader = ttf.data.Reader(path, schema, strict=strict)
    batches = list(reader.dataset(batch_size, shuffle=False))
    features = {name: (tf.concat([f[name] for f, _ in batches], 0)) for name in batches[0][0]}
    labels = np.concatenate([y.numpy() for _, y in batches])
    return reader, {k: v if isinstance(v, tf.RaggedTensor) else v.numpy() for k, v in features.items()}, labels


def test_schema_outputs_and_field_numbers():
    assert SHOP.fields == ("user", "item", "shop", "hour_hour", "hour_weekday")
    assert SHOP.dense_names == ("price", "views") and SHOP.multi_hot_names == ("tags", "seen")
    assert SHOP.field_index("tags") == 5 and SHOP.field_index("seen") == 6 and SHOP.label == "click"
    criteo = ttf.data.load_schema("criteo")
    assert criteo.num_fields == 26 and criteo.num_dense == 13 and criteo.header == "auto"
    avazu = ttf.data.load_schema("avazu")
    assert avazu.num_fields == 23 and avazu.num_dense == 0 and avazu.header is True and avazu.delimiter == ","
    assert avazu.fields[:2] == ("hour_hour", "hour_weekday") and avazu.columns[0].kind == "skip"


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_every_column_kind_matches_the_reference(tmp_path, suffix):
    path = write(tmp_path / f"shop.csv{suffix}", SHOP.header_line() + "\n" + "\n".join(SHOP_LINES) + "\n")
    _, features, labels = read(path, SHOP)
    assert check_against_reference(SHOP, SHOP_LINES, features, labels) == 5
    assert features["ids"].shape == (5, 5) and features["dense"].shape == (5, 2)
    assert features["dense"][1].tolist() == [-1.5, 0.0]  # defaults, transformed
    hour = features["ids"][:, 3] & ttf.data.MISSING_VALUE
    weekday = features["ids"][:, 4] & ttf.data.MISSING_VALUE
    assert hour.tolist()[:1] + hour.tolist()[2:] == [0, 23, 23, 23]
    assert weekday.tolist()[0] == 1 and weekday.tolist()[3] == 0  # 2014-10-21 a Tuesday, 2016-02-29 a Monday
    assert features["seen"].to_list()[0] == [(6 << 56) | 1, (6 << 56) | 2, (6 << 56) | 3]


def test_json_schema_round_trip_and_reader(tmp_path):
    path = tmp_path / "shop.json"
    SHOP.to_json(path)
    loaded = ttf.data.load_schema(str(path))
    assert loaded == SHOP
    data = write(tmp_path / "shop.csv", SHOP.header_line() + "\n" + "\n".join(SHOP_LINES) + "\n")
    _, features, labels = read(data, str(path))
    assert check_against_reference(SHOP, SHOP_LINES, features, labels) == 5


@pytest.mark.parametrize("spec,message", [
    ({"columns": [{"name": "a", "type": "dense"}]}, "exactly one Label"),
    ({"columns": [{"name": "y", "type": "label"}, {"name": "y", "type": "categorical"}]}, "repeated: \\['y'\\]"),
    ({"columns": [{"name": "y", "type": "label"}, {"name": "x", "type": "weird"}]}, "column 1 needs a 'type'"),
    ({"columns": [{"name": "y", "type": "label"}, {"name": "x", "type": "dense", "transform": "sqrt"}]},
     "transform must be one of"),
    ({"columns": [{"name": "y", "type": "label"}, {"name": "x", "type": "dense", "scale": 2}]},
     "unknown key\\(s\\) \\['scale'\\]"),
    ({"columns": [{"name": "y", "type": "label"}, {"name": "t", "type": "multi_hot", "separator": ","}],
      "delimiter": ","}, "uses the file's delimiter"),
    ({"columns": [{"name": "y", "type": "label"}], "header": "maybe"}, "header must be True, False or 'auto'"),
    ({"columns": [{"name": "y", "type": "label"}], "delim": ","}, "unknown key\\(s\\) \\['delim'\\]"),
])
def test_bad_schemas_are_clear_errors(tmp_path, spec, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        ttf.data.load_schema(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json:1: not valid JSON"):
        ttf.data.load_schema(str(path))
    with pytest.raises(ValueError, match="unknown schema 'nope'"):
        ttf.data.load_schema("nope")
    with pytest.raises(ValueError, match="at most 128"):
        Schema([Label("y")] + [Categorical(f"c{i}") for i in range(129)])


def test_field_key_int_and_string_modes():
    key = ttf.data.field_key
    assert key(3, "1005", "int") == (3 << 56) | 1005
    assert key(3, "1005", "auto") == (3 << 56) | 0x1005
    assert key(3, "1005", "string") != key(3, "1005", "auto") and key(3, "1005", "string") >> 56 == 3
    for bad in ("-1", "1.5", "x", str(ttf.data.MISSING_VALUE)):
        with pytest.raises(ValueError, match="not an integer"):
            key(0, bad, "int")


def strict_error(schema, lines):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        ttf.data.parse_lines(lines, "f.csv", np.arange(2, len(lines) + 2), schema)
    return str(info.value)


@pytest.mark.parametrize("line,reason", [
    ("r,1,2,3,4,a,b,c,d", r"f.csv:2: bad shop line: has 9 columns, the schema declares 10"),
    ("r,1,2,3,4,a,b,c,5,14102100,extra,more", r"f.csv:2: bad shop line: has 12 columns, the schema declares 10"),
    ("r,1,x2,3,4,a,b,c,d,14102100", r"f.csv:2: bad shop line: dense column price is not a number: 'x2'"),
    # A finite double that overflows float32 is a bad value, not an inf fed to the model.
    ("r,1,1e39,3,4,a,b,c,d,14102100", r"f.csv:2: bad shop line: dense column price overflows float32 .*: '1e39'"),
    ("r,1,-4e38,3,4,a,b,c,d,14102100", r"dense column price overflows float32 .*: '-4e38'"),
    ("r,1,2,3,-4,a,b,c,d,14102100", r"categorical column user is not an integer in \[0, 2\^56 - 1\): '-4'"),
    ("r,1,2,3,4,a,b,c,1;x,14102100", r"multi-hot column seen holds a value that is not an integer .*: 'x'"),
    ("r,1,2,3,4,a,b,c,5,14023100", r"column hour is not a YYMMDDHH time stamp: '14023100'"),
    ("r,1,2,3,4,a,b,c,5,15022900", r"not a YYMMDDHH time stamp: '15022900'"),  # 2015 is no leap year
    ("r,2,2,3,4,a,b,c,d,14102100", r"label column click must be 0 or 1, got '2'"),
    ("r,\xff\xfe,2,3,4,a,b,c,d,14102100", r"label column click must be 0 or 1, got '\\xc3\\xbf\\xc3\\xbe'"),
])
def test_bad_lines_name_file_line_and_reason(line, reason):
    assert re.search(reason, strict_error(SHOP, [line]))
    _, labels, bad = ttf.data.parse_lines([line, SHOP_LINES[0]], "f.csv", [2, 3], SHOP, strict=False)
    assert int(bad) == 1 and labels.shape == (1,)


def test_undeclared_header_is_named():
    no_header = Schema(SHOP.columns, delimiter=",", header=False, name="shop")
    message = strict_error(no_header, [SHOP.header_line()])
    assert "f.csv:2: bad shop line: looks like a header (label column 'click' holds its own name), but the schema " \
           "declares no header" in message


def test_file_errors_name_the_file(tmp_path):
    header = SHOP.header_line() + "\n"
    with pytest.raises(ValueError, match=r"empty.csv: empty file, no data lines"):
        ttf.data.Reader(write(tmp_path / "empty.csv", ""), SHOP)
    with pytest.raises(ValueError, match=r"only.csv: only a header line, no data lines"):
        ttf.data.Reader(write(tmp_path / "only.csv", header), SHOP)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "_SUCCESS").write_text("")
    with pytest.raises(ValueError, match=r"folder .*folder holds no data files"):  # a folder is its part files
        ttf.data.Reader(str(tmp_path / "folder"), SHOP)
    with pytest.raises(FileNotFoundError, match=r"data file not found: .*nothing.csv"):
        ttf.data.Reader(str(tmp_path / "nothing.csv"), SHOP)
    wrong = write(tmp_path / "wrong.csv", header.replace("price", "cost") + SHOP_LINES[0] + "\n")
    with pytest.raises(ValueError, match=r"wrong.csv:1: header column 3 is 'cost', schema 'shop' expects 'price'"):
        ttf.data.Reader(wrong, SHOP)
    short = write(tmp_path / "short.csv", "row,click\n" + SHOP_LINES[0] + "\n")
    with pytest.raises(ValueError, match=r"short.csv:1: header column 3 is nothing, schema 'shop' expects 'price'"):
        ttf.data.Reader(short, SHOP)


def gzip_bytes(lines):
    return gzip.compress(("\n".join(lines) + "\n").encode())


@pytest.mark.parametrize("strict", [True, False])
def test_truncated_or_corrupt_gzip_is_an_error_in_both_modes(tmp_path, strict):
    lines = [f"{i % 2}\t{i}" + "\t" * 38 + "abc" for i in range(2000)]
    data = gzip_bytes(lines)
    truncated = tmp_path / "cut.tsv.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut.tsv.gz: truncated gzip file"):
        ttf.data.Reader(str(truncated), "criteo", strict=strict)
    corrupt = tmp_path / "corrupt.tsv.gz"
    corrupt.write_bytes(data[:20] + bytes(b ^ 0x55 for b in data[20:60]) + data[60:])
    with pytest.raises(ValueError, match=r"corrupt.tsv.gz: corrupt gzip file"):
        ttf.data.Reader(str(corrupt), "criteo", strict=strict)
    plain = tmp_path / "plain.tsv.gz"
    plain.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"plain.tsv.gz: corrupt gzip file .*drop the .gz suffix"):
        ttf.data.Reader(str(plain), "criteo", strict=strict)
    whole = tmp_path / "whole.tsv.gz"
    whole.write_bytes(data)
    _, features, labels = read(str(whole), "criteo", strict=strict, batch_size=512)
    assert len(labels) == 2000


def test_binary_garbage_is_one_clear_error_or_counted(tmp_path):
    good = "1\t5" + "\t" * 38 + "abc"
    path = tmp_path / "garbage.tsv"
    path.write_bytes(good.encode() + b"\n" + bytes(range(11, 256)) + b"\n\xff\xfe\x00\x01\t\x80\n" + good.encode() + b"\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"garbage.tsv:2: bad criteo line: label column label .*got '\\x0b\\x0c"):
        read(str(path), "criteo")
    reader, _, labels = read(str(path), "criteo", strict=False)
    assert len(labels) == 2 and reader.bad_lines == 2


def test_multi_hot_batches_shuffle_and_lenient_end_marker(tmp_path, capfd):
    lines = [f"r{i},{i % 2},{i},1,{i},a,b,{'|'.join(str(j) for j in range(i % 4))},{i};{i},14102100" for i in range(300)]
    lines[7] = "r7,1,2"
    path = write(tmp_path / "many.csv", SHOP.header_line() + "\n" + "\n".join(lines) + "\n")
    reader = ttf.data.Reader(path, SHOP, strict=False)
    batches = list(reader.dataset(64, shuffle=True, seed=1, block_lines=32, shuffle_window=128))
    assert [int(y.shape[0]) for _, y in batches] == [64, 64, 64, 64, 43]
    assert isinstance(batches[0][0]["tags"], tf.RaggedTensor) and batches[0][0]["tags"].shape[0] == 64
    seen = np.concatenate([f["seen"].values.numpy() for f, _ in batches]) & ttf.data.MISSING_VALUE
    assert sorted(set(seen.tolist())) == sorted(set(range(300)) - {7})  # rows stay whole through the shuffle
    assert reader.bad_lines == 1 and "skipped 1 more bad line(s), 1 in all" in capfd.readouterr().err


def test_avazu_reader_on_synthetic_rows(tmp_path):
    config = ttf.data.Synthetic(schema="avazu", vocab_per_field=1000, missing_rate=0.05)
    path = tmp_path / "avazu.csv.gz"
    auc = ttf.data.write_synthetic(path, 3000, config, seed=4)
    expected = config.generate(3000, seed=4)
    _, features, labels = read(str(path), "avazu", batch_size=1024)
    assert set(features) == {"ids"} and 0.6 < auc < 1.0
    np.testing.assert_array_equal(features["ids"], expected["ids"])
    np.testing.assert_array_equal(labels, expected["label"])


def test_synthetic_any_schema_reads_back(tmp_path):
    config = ttf.data.Synthetic(schema=SHOP, vocab_per_field=500, missing_rate=0.1)
    path = tmp_path / "shop.csv"
    ttf.data.write_synthetic(path, 2000, config, seed=2)
    expected = config.generate(2000, seed=2)
    _, features, labels = read(str(path), SHOP, batch_size=700)
    np.testing.assert_array_equal(features["ids"], expected["ids"])
    np.testing.assert_allclose(features["dense"], expected["dense"], rtol=1e-6)
    np.testing.assert_array_equal(labels, expected["label"])
    for name in SHOP.multi_hot_names:
        np.testing.assert_array_equal(features[name].values.numpy(), expected[name])
        np.testing.assert_array_equal(features[name].row_lengths().numpy(), expected[name + "_lengths"])
    sample = config.generate(20000, seed=3)
    assert 0.7 < ttf.data.best_auc(sample["label"], sample["probability"]) < 0.99
    ds = ttf.data.synthetic_dataset(1000, 256, config, seed=1)
    assert isinstance(next(iter(ds))[0]["tags"], tf.RaggedTensor)


def test_bundled_avazu_sample_matches_the_reference():
    path = os.path.join(ROOT, "data", "avazu_sample.txt")
    lines = open(path).read().splitlines()
    assert lines[0] == ttf.data.AVAZU.header_line()
    _, features, labels = read(path, "avazu", batch_size=32)
    assert check_against_reference(ttf.data.AVAZU, lines[1:], features, labels) == 100
    assert labels.sum() == 20 and features["ids"].shape == (100, 23)
    hour, weekday = features["ids"][:, 0] & ttf.data.MISSING_VALUE, features["ids"][:, 1] & ttf.data.MISSING_VALUE
    assert set(hour.tolist()) == {0} and set(weekday.tolist()) == {1}  # 2014-10-21 00:00, a Tuesday
    # C20's -1 is hashed (not hex), the same key in every row that holds it.
    c20 = features["ids"][:, ttf.data.AVAZU.field_index("C20")]
    assert c20[0] == ttf.data.field_key(ttf.data.AVAZU.field_index("C20"), "-1")
