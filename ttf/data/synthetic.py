"""Synthetic Criteo-schema data with Zipf-distributed keys and a planted logistic model.

Each field's ids are Zipf-distributed ranks below `vocab_per_field`; each (field, rank) has
a weight that is a pure function of (seed, field, rank), so no weight table is stored even
for millions of ids. A label is drawn from sigmoid(bias + sum of the example's key weights
+ dense weights . dense features), so the data are learnable and the best achievable AUC
(the AUC of the true probabilities) is known: `SyntheticCriteo.best_auc(...)`.

CLI (writes a raw Criteo TSV file that ttf.data.CriteoReader reads back to the same ids):
    python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv
"""
import argparse
import dataclasses
import sys
import time

import numpy as np

from ttf.data._criteo import FIELD_SHIFT, NUM_DENSE, NUM_FIELDS

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix64(x):
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _unit_normal(bits):
    """Approximately standard normal from 64 random bits (sum of four 16-bit uniforms)."""
    parts = [((bits >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.float64) / 65535.0 for i in range(4)]
    return (sum(parts) - 2.0) * np.sqrt(3.0)


@dataclasses.dataclass(frozen=True)
class SyntheticCriteo:
    """The generator's configuration; `generate(num_rows, seed)` draws a sample.

    vocab_per_field: distinct ids per field (ranks 0 .. vocab_per_field - 1).
    zipf_exponent: > 1; rank r has probability ~ r^-exponent (folded into the vocabulary).
    key_weight_std, dense_weight_std, bias: the planted logistic model.
    model_seed: fixes the planted weights (independent of the sample's seed).
    """

    vocab_per_field: int = 1_000_000
    zipf_exponent: float = 1.1
    key_weight_std: float = 0.35
    dense_weight_std: float = 0.3
    bias: float = -1.2
    model_seed: int = 1234

    def __post_init__(self):
        if not 1 <= self.vocab_per_field < 1 << 32:
            raise ValueError(f"vocab_per_field must be in [1, 2^32), got {self.vocab_per_field}")
        if not self.zipf_exponent > 1.0:
            raise ValueError(f"zipf_exponent must be > 1, got {self.zipf_exponent}")

    def key_weights(self, ids):
        """Planted weight of each field-tagged key (int64 array)."""
        bits = _mix64(ids.astype(np.uint64) ^ _mix64(np.full(ids.shape, self.model_seed, np.uint64)))
        return self.key_weight_std * _unit_normal(bits)

    def dense_weights(self):
        rng = np.random.default_rng(self.model_seed)
        return rng.normal(0.0, self.dense_weight_std, NUM_DENSE)

    def generate(self, num_rows, seed=0):
        """-> dict of NumPy arrays: ids int64 [N, 26] (field-tagged), raw_dense int64
        [N, 13] (counts as in Criteo's integer columns), dense float32 [N, 13]
        (log1p of raw_dense, what the reader yields), label float32 [N], probability [N]."""
        rng = np.random.default_rng(seed)
        ranks = (rng.zipf(self.zipf_exponent, size=(num_rows, NUM_FIELDS)) - 1) % self.vocab_per_field
        ids = (np.arange(NUM_FIELDS, dtype=np.int64) << FIELD_SHIFT) | ranks.astype(np.int64)
        raw_dense = rng.geometric(p=1.0 / (1.0 + np.arange(1, NUM_DENSE + 1) * 3.0), size=(num_rows, NUM_DENSE)) - 1
        dense = np.log1p(raw_dense).astype(np.float32)
        centered = dense - np.log1p(np.arange(1, NUM_DENSE + 1) * 3.0).astype(np.float32)
        logit = self.bias + self.key_weights(ids).sum(axis=1) + centered @ self.dense_weights()
        probability = 1.0 / (1.0 + np.exp(-logit))
        label = (rng.random(num_rows) < probability).astype(np.float32)
        return {"ids": ids, "raw_dense": raw_dense.astype(np.int64), "dense": dense, "label": label,
                "probability": probability}


def best_auc(labels, scores):
    """AUC of scores against 0/1 labels (Mann-Whitney rank statistic; continuous scores)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def synthetic_dataset(num_rows, batch_size, config=SyntheticCriteo(), seed=0, num_epochs=1, shuffle=True):
    """An in-memory tf.data.Dataset with the reader's element structure:
    ({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])."""
    import tensorflow as tf  # noqa: PLC0415  (the writer CLI does not need TensorFlow)

    sample = config.generate(num_rows, seed)
    ds = tf.data.Dataset.from_tensor_slices(({"ids": sample["ids"], "dense": sample["dense"]}, sample["label"]))
    if shuffle:
        ds = ds.shuffle(min(num_rows, 100_000), seed=seed)
    return ds.repeat(num_epochs).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def write_synthetic_criteo(path, num_rows, config=SyntheticCriteo(), seed=0, chunk_rows=200_000, progress=True):
    """Writes num_rows in the raw Criteo TSV form (label, 13 ints, 26 8-hex-digit values).
    Returns the best achievable AUC of what was written."""
    labels, probabilities = [], []
    start = time.time()
    with open(path, "w") as f:
        for chunk, first in enumerate(range(0, num_rows, chunk_rows)):
            sample = config.generate(min(chunk_rows, num_rows - first), seed=seed * 100_003 + chunk)
            values = sample["ids"] & ((1 << FIELD_SHIFT) - 1)
            rows = [
                "\t".join([str(int(label))] + [str(x) for x in dense] + [f"{v:08x}" for v in vals])
                for label, dense, vals in zip(sample["label"], sample["raw_dense"].tolist(), values.tolist())
            ]
            f.write("\n".join(rows) + "\n")
            labels.append(sample["label"])
            probabilities.append(sample["probability"])
            if progress:
                done = first + len(rows)
                print(f"[synthetic] {done:,}/{num_rows:,} rows ({time.time() - start:.1f}s)", flush=True)
    return best_auc(np.concatenate(labels), np.concatenate(probabilities))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Write synthetic Criteo-format data (raw TSV) with Zipf keys and a planted logistic model.",
        epilog="example: python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv")
    parser.add_argument("--rows", type=int, required=True, help="number of rows to write")
    parser.add_argument("--out", required=True, help="output file (raw Criteo TSV)")
    parser.add_argument("--vocab-per-field", type=int, default=1_000_000, help="distinct ids per field (default 1M)")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of id frequencies (default 1.1)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    args = parser.parse_args(argv)
    if args.rows <= 0:
        parser.error(f"--rows must be > 0, got {args.rows}")
    try:
        config = SyntheticCriteo(vocab_per_field=args.vocab_per_field, zipf_exponent=args.zipf)
    except ValueError as err:
        parser.error(str(err))
    auc = write_synthetic_criteo(args.out, args.rows, config, seed=args.seed)
    print(f"[synthetic] wrote {args.rows:,} rows to {args.out}; best achievable AUC {auc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
