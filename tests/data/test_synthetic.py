"""The synthetic generator: schema, determinism, Zipf-distributed keys, a learnable planted
model, files that the reader parses back to the same rows, and the CLI."""
import gzip
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import ttf
from ttf.data import SyntheticCriteo
from ttf.data import _synthetic as synthetic


def test_schema_and_determinism():
    gen = SyntheticCriteo(vocab_per_field=5000)
    a, b = gen.generate(1000, seed=3), gen.generate(1000, seed=3)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert a["ids"].shape == (1000, 26) and a["ids"].dtype == np.int64
    assert a["dense"].shape == (1000, 13) and a["dense"].dtype == np.float32
    assert a["label"].shape == (1000,) and a["label"].dtype == np.float32
    assert set(np.unique(a["label"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(a["ids"] >> 56, np.broadcast_to(np.arange(26), (1000, 26)))
    assert (a["ids"] & ((1 << 56) - 1)).max() < 5000
    assert not np.array_equal(gen.generate(1000, seed=4)["ids"], a["ids"])
    # The planted model depends on model_seed only, not on the sample's seed.
    np.testing.assert_array_equal(gen.key_weights(a["ids"]), SyntheticCriteo(vocab_per_field=5000).key_weights(a["ids"]))
    assert not np.array_equal(gen.key_weights(a["ids"]), SyntheticCriteo(model_seed=7).key_weights(a["ids"]))


def test_missing_values():
    sample = SyntheticCriteo(vocab_per_field=1000, missing_rate=0.2).generate(5000, seed=0)
    missing = (sample["ids"] & ((1 << 56) - 1)) == ttf.data.MISSING_VALUE
    assert 0.17 < missing.mean() < 0.23
    assert np.all(sample["dense"][sample["raw_dense"] < 0] == 0.0)
    with pytest.raises(ValueError, match="missing_rate"):
        SyntheticCriteo(missing_rate=1.0)


def test_keys_are_zipf_distributed():
    ids = SyntheticCriteo(vocab_per_field=1_000_000).generate(20000, seed=0)["ids"][:, 0]
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    # Zipf(1.1): the top value takes ~9% of the rows (1 / zeta(1.1) = 0.094), and frequency
    # falls roughly as rank^-1.1 (top / second = 2^1.1 = 2.14).
    assert 0.07 < counts[0] / len(ids) < 0.12
    assert 1.5 < counts[0] / counts[1] < 3.0
    assert len(counts) > 2000  # and a long tail of rare values


def test_planted_model_is_learnable():
    sample = SyntheticCriteo().generate(50000, seed=1)
    auc = ttf.data.best_auc(sample["label"], sample["probability"])
    assert 0.75 < auc < 0.99
    assert 0.1 < sample["label"].mean() < 0.6
    # A random score has AUC about 0.5 (the AUC helper itself is sound).
    assert abs(ttf.data.best_auc(sample["label"], np.random.default_rng(0).random(50000)) - 0.5) < 0.02


def test_best_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    scores = rng.integers(0, 10, 200).astype(float)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])
    assert ttf.data.best_auc(labels, scores) == pytest.approx(pairwise, rel=1e-12)
    with pytest.raises(ValueError, match="both classes"):
        ttf.data.best_auc(np.ones(4), np.arange(4.0))


def read_back(path, batch_size=128):
    batches = list(ttf.data.CriteoReader([str(path)]).dataset(batch_size, shuffle=False))
    return (np.concatenate([f["ids"].numpy() for f, _ in batches]), np.concatenate([f["dense"].numpy() for f, _ in batches]),
            np.concatenate([y.numpy() for _, y in batches]))


@pytest.mark.parametrize("name,csv", [("synthetic.tsv", False), ("synthetic.csv.gz", True)])
def test_written_file_reads_back_to_the_same_rows(tmp_path, name, csv):
    path = tmp_path / name
    gen = SyntheticCriteo(vocab_per_field=10000, missing_rate=0.1)
    auc = ttf.data.write_synthetic_criteo(path, 300, gen, seed=5, csv=csv)
    expected = gen.generate(300, seed=5)
    assert auc == ttf.data.best_auc(expected["label"], expected["probability"])
    if csv:
        with gzip.open(path, "rt") as f:
            assert f.readline().rstrip("\n") == ttf.data.CSV_HEADER
    ids, dense, labels = read_back(path)
    np.testing.assert_array_equal(ids, expected["ids"])
    np.testing.assert_allclose(dense, expected["dense"], rtol=1e-6)
    np.testing.assert_array_equal(labels, expected["label"])


def test_cli(tmp_path, capsys):
    path = tmp_path / "cli.tsv"
    assert synthetic.main(["--rows", "300", "--out", str(path), "--vocab-per-field", "10000"]) == 0
    assert "best achievable AUC" in capsys.readouterr().out
    ids, _, _ = read_back(path)
    np.testing.assert_array_equal(ids, SyntheticCriteo(vocab_per_field=10000).generate(300, seed=0)["ids"])
    with pytest.raises(SystemExit) as exit_info:
        synthetic.main(["-h"])
    assert exit_info.value.code == 0 and "--vocab-per-field" in capsys.readouterr().out
    for bad in (["--rows", "0", "--out", str(path)], ["--rows", "5", "--out", str(path), "--zipf", "0.9"]):
        with pytest.raises(SystemExit) as exit_info:
            synthetic.main(bad)
        assert exit_info.value.code == 2
    assert synthetic.main(["--rows", "5", "--out", str(tmp_path / "no" / "such" / "dir.tsv")]) == 1


def test_cli_as_a_module_prints_no_runpy_warning(tmp_path):
    path = tmp_path / "avazu.csv"
    proc = subprocess.run([sys.executable, "-m", "ttf.data.synthetic", "--schema", "avazu", "--rows", "50", "--out",
                           str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr and "found in sys.modules" not in proc.stderr, proc.stderr
    assert open(path).readline().startswith("id,click,hour,")


def test_in_memory_dataset():
    gen = SyntheticCriteo(vocab_per_field=1000)
    ds = ttf.data.synthetic_dataset(1000, 256, gen, seed=2, num_epochs=2)
    batches = list(ds)
    assert [int(y.shape[0]) for _, y in batches] == [256] * 7 + [208]  # batches run across passes
    features, labels = ds.element_spec
    assert features["ids"].shape.as_list() == [None, 26] and features["dense"].shape.as_list() == [None, 13]
    ids = np.concatenate([f["ids"].numpy() for f, _ in batches])
    expected = gen.generate(1000, seed=2)["ids"]
    # Each pass holds every row once, in a new order; the same seed gives the same order.
    for one_pass in (ids[:1000], ids[1000:]):
        np.testing.assert_array_equal(one_pass[np.lexsort(one_pass.T)], expected[np.lexsort(expected.T)])
    assert not np.array_equal(ids[:1000], ids[1000:])
    again = np.concatenate([f["ids"].numpy() for f, _ in ttf.data.synthetic_dataset(1000, 256, gen, seed=2, num_epochs=2)])
    np.testing.assert_array_equal(ids, again)
    fixed = ttf.data.synthetic_dataset(1000, 256, gen, shuffle=False, drop_remainder=True)
    assert fixed.element_spec[1].shape == (256,)


@pytest.mark.slow
def test_one_million_rows_write_and_read_back(tmp_path):
    path = tmp_path / "million.tsv"
    ttf.data.write_synthetic_criteo(path, 1_000_000, SyntheticCriteo(), seed=0)
    rows = sum(int(y.shape[0]) for _, y in ttf.data.CriteoReader(str(path)).dataset(65536, shuffle=True))
    assert rows == 1_000_000
