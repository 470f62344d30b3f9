"""The synthetic generator: schema, determinism, Zipf-distributed keys, a learnable planted
model, and files that the reader parses back to the same ids."""
import numpy as np

import ttf
from ttf.data import SyntheticCriteo


def test_schema_and_determinism():
    gen = SyntheticCriteo(vocab_per_field=5000)
    a, b = gen.generate(1000, seed=3), gen.generate(1000, seed=3)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert a["ids"].shape == (1000, 26) and a["ids"].dtype == np.int64
    assert a["dense"].shape == (1000, 13) and a["dense"].dtype == np.float32
    assert set(np.unique(a["label"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(a["ids"] >> 56, np.broadcast_to(np.arange(26), (1000, 26)))
    assert (a["ids"] & ((1 << 56) - 1)).max() < 5000
    assert not np.array_equal(gen.generate(1000, seed=4)["ids"], a["ids"])


def test_keys_are_zipf_distributed():
    ids = SyntheticCriteo(vocab_per_field=1_000_000).generate(20000, seed=0)["ids"][:, 0]
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    # Zipf(1.1): the top id takes a large share, and frequency falls roughly as rank^-1.1.
    assert counts[0] / len(ids) > 0.05
    assert 1.5 < counts[0] / counts[1] < 3.0
    assert len(counts) > 2000  # and a long tail of rare ids


def test_planted_model_is_learnable():
    sample = SyntheticCriteo().generate(50000, seed=1)
    auc = ttf.data.best_auc(sample["label"], sample["probability"])
    assert 0.75 < auc < 0.99
    assert 0.1 < sample["label"].mean() < 0.6
    # A random score has AUC about 0.5 (the AUC helper itself is sound).
    assert abs(ttf.data.best_auc(sample["label"], np.random.default_rng(0).random(50000)) - 0.5) < 0.02


def test_written_file_reads_back_to_the_same_ids(tmp_path):
    path = tmp_path / "synthetic.tsv"
    gen = SyntheticCriteo(vocab_per_field=10000)
    assert ttf.data.synthetic.main(["--rows", "300", "--out", str(path), "--vocab-per-field", "10000"]) == 0
    expected = gen.generate(300, seed=0)
    reader = ttf.data.CriteoReader([str(path)])
    batches = list(reader.dataset(batch_size=128, shuffle=False))
    ids = np.concatenate([f["ids"].numpy() for f, _ in batches])
    dense = np.concatenate([f["dense"].numpy() for f, _ in batches])
    np.testing.assert_array_equal(ids, expected["ids"])
    np.testing.assert_allclose(dense, expected["dense"], rtol=1e-6)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in batches]), expected["label"])


def test_in_memory_dataset_structure():
    features, labels = next(iter(ttf.data.synthetic_dataset(256, batch_size=64, shuffle=False)))
    assert features["ids"].shape == (64, 26) and features["dense"].shape == (64, 13) and labels.shape == (64,)
