"""Synthetic Criteo-schema data with Zipf-distributed keys and a planted logistic model.

Each field's values are Zipf-distributed ranks below `vocab_per_field` (rank 0 the most
frequent); each (field, rank) key has a weight that is a pure function of (model_seed,
key), so no weight table is stored even for millions of ids. A label is drawn from
sigmoid(bias + sum of the row's key weights + dense weights . centred dense features), so
the data are learnable and the best achievable AUC (the AUC of the true probabilities) is
known: `best_auc(sample["label"], sample["probability"])`.

Rows are drawn in chunks of 65,536 from a generator seeded by (seed, chunk index), so
`generate(n, seed)`, `synthetic_dataset(n, ..., seed=seed)` and a file written with
`write_synthetic_criteo(path, n, seed=seed)` hold the same rows, with no need to hold a
large file's rows in memory.

CLI (writes a file that ttf.data.CriteoReader reads back to the same ids):
    python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv
    python -m ttf.data.synthetic -h
"""
import argparse
import dataclasses
import gzip
import sys
import time

import numpy as np

from ttf.data._criteo import CSV_HEADER, FIELD_SHIFT, MISSING_VALUE, NUM_DENSE, NUM_FIELDS

_CHUNK_ROWS = 65_536
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
# Mean of each raw dense column (geometric counts): column j has mean 3 * (j + 1).
_DENSE_MEANS = np.arange(1, NUM_DENSE + 1) * 3.0


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

    Args:
      vocab_per_field: distinct values per field (ranks 0 .. vocab_per_field - 1, written
        as 8 hex digits, so < 2^32).
      zipf_exponent: > 1; rank r has probability ~ (r + 1)^-exponent (the tail beyond the
        vocabulary folds back into it).
      missing_rate: probability in [0, 1) that a field (categorical or dense) is missing.
      key_weight_std, dense_weight_std, bias: the planted logistic model.
      model_seed: fixes the planted weights (independent of the sample's seed).

    Raises:
      ValueError: a value out of range.

    Example:
      >>> from ttf.data import SyntheticCriteo, best_auc
      >>> sample = SyntheticCriteo(vocab_per_field=10_000).generate(20_000, seed=1)
      >>> sample["ids"].shape, sample["dense"].dtype
      ((20000, 26), dtype('float32'))
      >>> 0.75 < best_auc(sample["label"], sample["probability"]) < 0.99
      True
    """

    vocab_per_field: int = 1_000_000
    zipf_exponent: float = 1.1
    missing_rate: float = 0.0
    key_weight_std: float = 0.35
    dense_weight_std: float = 0.3
    bias: float = -1.2
    model_seed: int = 1234

    def __post_init__(self):
        if not 1 <= self.vocab_per_field <= 1 << 32:
            raise ValueError(f"vocab_per_field must be in [1, 2^32], got {self.vocab_per_field}")
        if not self.zipf_exponent > 1.0:
            raise ValueError(f"zipf_exponent must be > 1, got {self.zipf_exponent}")
        if not 0.0 <= self.missing_rate < 1.0:
            raise ValueError(f"missing_rate must be in [0, 1), got {self.missing_rate}")

    def key_weights(self, ids):
        """Planted weight of each field-tagged key (int64 array of any shape)."""
        bits = _mix64(ids.astype(np.uint64) ^ _mix64(np.array([self.model_seed], np.uint64)))
        return self.key_weight_std * _unit_normal(bits)

    def dense_weights(self):
        """Planted weights [13] of the centred dense features."""
        return np.random.default_rng(self.model_seed).normal(0.0, self.dense_weight_std, NUM_DENSE)

    def generate(self, num_rows, seed=0):
        """Draws num_rows rows.

        Returns:
          dict of NumPy arrays: ids int64 [N, 26] (field-tagged keys, what the reader
          yields), raw_dense int64 [N, 13] (counts as in Criteo's integer columns, -1
          where missing), dense float32 [N, 13] (log1p of raw_dense, 0 where missing:
          what the reader yields), label float32 [N], probability float64 [N] (the true
          click probability of the planted model).
        """
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        chunks = [self._chunk(min(_CHUNK_ROWS, num_rows - first), seed, index)
                  for index, first in enumerate(range(0, num_rows, _CHUNK_ROWS))] or [self._chunk(0, seed, 0)]
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}

    def _chunk(self, num_rows, seed, index):
        rng = np.random.default_rng([seed, index])
        ranks = (rng.zipf(self.zipf_exponent, size=(num_rows, NUM_FIELDS)) - 1) % self.vocab_per_field
        values = ranks.astype(np.int64)
        raw_dense = rng.geometric(p=1.0 / (1.0 + _DENSE_MEANS), size=(num_rows, NUM_DENSE)).astype(np.int64) - 1
        if self.missing_rate > 0:
            values[rng.random(values.shape) < self.missing_rate] = MISSING_VALUE
            raw_dense[rng.random(raw_dense.shape) < self.missing_rate] = -1  # written as an empty field
        ids = (np.arange(NUM_FIELDS, dtype=np.int64) << FIELD_SHIFT) | values
        dense = np.log1p(np.maximum(raw_dense, 0)).astype(np.float32)
        centred = dense - np.log1p(_DENSE_MEANS).astype(np.float32)
        logit = self.bias + self.key_weights(ids).sum(axis=1) + centred @ self.dense_weights()
        probability = 1.0 / (1.0 + np.exp(-logit))
        label = (rng.random(num_rows) < probability).astype(np.float32)
        return {"ids": ids, "raw_dense": raw_dense, "dense": dense, "label": label, "probability": probability}


def best_auc(labels, scores):
    """Area under the ROC curve of scores against 0/1 labels (Mann-Whitney statistic; tied
    scores count one half). With the planted probabilities as scores it is the best AUC any
    model can reach on that sample.

    Args:
      labels: [N] array of 0/1. scores: [N] array of floats.

    Raises:
      ValueError: the shapes differ, or labels hold only one class.

    Example:
      >>> import numpy as np
      >>> from ttf.data import best_auc
      >>> best_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
      0.75
    """
    labels, scores = np.asarray(labels).ravel(), np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores must have the same length, got {labels.shape} and {scores.shape}")
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes, got {n_pos} positive(s) and {n_neg} negative(s)")
    order = np.argsort(scores, kind="stable")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based, ties get their mean rank
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def synthetic_dataset(num_rows, batch_size, config=SyntheticCriteo(), seed=0, num_epochs=1, shuffle=True,
                      drop_remainder=False):
    """An in-memory tf.data.Dataset with the reader's element structure,
    `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])`, for benchmarks:
    the sample is drawn once (NumPy) and cut into batches without per-row tf.data work.

    Args:
      num_rows: rows in the sample (one pass). batch_size: rows per batch.
      config: a SyntheticCriteo. seed: the sample's seed (and the shuffle's).
      num_epochs: passes; None repeats forever. shuffle: permute the rows every pass.
      drop_remainder: drop a last batch smaller than batch_size.

    Example:
      >>> import ttf
      >>> ds = ttf.data.synthetic_dataset(1000, 256, ttf.data.SyntheticCriteo(vocab_per_field=1000))
      >>> [int(labels.shape[0]) for _, labels in ds]
      [256, 256, 256, 232]
    """
    import tensorflow as tf  # noqa: PLC0415  (the writer CLI does not need TensorFlow)

    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    sample = config.generate(num_rows, seed)
    ds = tf.data.Dataset.from_tensors(({"ids": sample["ids"], "dense": sample["dense"]}, sample["label"]))
    ds = ds.repeat(num_epochs)
    if shuffle:
        def permute(epoch, element):
            features, labels = element
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(labels)[0]), seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
            return {k: tf.gather(v, order) for k, v in features.items()}, tf.gather(labels, order)

        ds = ds.enumerate().map(permute)
    return ds.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_DIGITS = np.frombuffer(b"0123456789", np.uint8)


def _format_rows(sample, sep):
    """The rows of a sample as Criteo text (bytes), built as one byte matrix: each field
    gets a fixed-width slot, unused bytes are 0 and removed at the end."""
    n = len(sample["label"])
    raw_dense = sample["raw_dense"]
    width = max(1, len(str(int(raw_dense.max(initial=0)))))
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (np.maximum(raw_dense, 0)[:, :, None] // powers) % 10  # [N, 13, width]
    num_digits = 1 + (np.maximum(raw_dense, 0)[:, :, None] >= powers[None, None, :-1]).sum(axis=2)
    dense_bytes = np.where(np.arange(width) >= width - num_digits[:, :, None], _DIGITS[digits], 0)
    dense_bytes[raw_dense < 0] = 0  # missing: an empty field
    values = sample["ids"] & MISSING_VALUE
    # The 4 bytes of each value, most significant first, split into 8 nibbles.
    value_bytes = values.astype(">u4").view(np.uint8).reshape(n, NUM_FIELDS, 4)
    hex_bytes = np.empty((n, NUM_FIELDS, 8), np.uint8)
    hex_bytes[:, :, 0::2] = _HEX[value_bytes >> 4]
    hex_bytes[:, :, 1::2] = _HEX[value_bytes & 0xF]
    hex_bytes[values == MISSING_VALUE] = 0
    sep_byte = ord(sep)
    line = np.zeros((n, 2 + NUM_DENSE * (width + 1) + NUM_FIELDS * 9), np.uint8)
    line[:, 0] = np.where(sample["label"] > 0.5, ord("1"), ord("0"))
    line[:, 1] = sep_byte
    dense_part = line[:, 2:2 + NUM_DENSE * (width + 1)].reshape(n, NUM_DENSE, width + 1)
    dense_part[:, :, :width] = dense_bytes
    dense_part[:, :, width] = sep_byte
    cat_part = line[:, 2 + NUM_DENSE * (width + 1):].reshape(n, NUM_FIELDS, 9)
    cat_part[:, :, :8] = hex_bytes
    cat_part[:, :, 8] = sep_byte
    cat_part[:, -1, 8] = ord("\n")
    flat = line.ravel()
    return flat[flat != 0].tobytes()


def write_synthetic_criteo(path, num_rows, config=SyntheticCriteo(), seed=0, csv=False, progress=False):
    """Writes num_rows synthetic rows to a Criteo file: the raw TSV form (label, 13 ints,
    26 8-hex-digit values, empty where missing), or with csv=True the CSV form with the
    header `label,I1..I13,C1..C26`; gzip when path ends with .gz. The rows are those of
    `config.generate(num_rows, seed)`.

    Returns:
      The best achievable AUC on what was written (AUC of the planted probabilities).

    Example:
      >>> import ttf
      >>> auc = ttf.data.write_synthetic_criteo("/tmp/synthetic_example.tsv", 1000)
      >>> reader = ttf.data.CriteoReader("/tmp/synthetic_example.tsv")
      >>> sum(int(labels.shape[0]) for _, labels in reader.dataset(512, shuffle=False))
      1000
    """
    if num_rows <= 0:
        raise ValueError(f"num_rows must be > 0, got {num_rows}")
    path = str(path)
    labels, probabilities = [], []
    start = time.time()
    opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if path.endswith(".gz") else (lambda p: open(p, "wb"))
    with opener(path) as f:
        if csv:
            f.write((CSV_HEADER + "\n").encode())
        for index, first in enumerate(range(0, num_rows, _CHUNK_ROWS)):
            sample = config._chunk(min(_CHUNK_ROWS, num_rows - first), seed, index)
            f.write(_format_rows(sample, "," if csv else "\t"))
            labels.append(sample["label"])
            probabilities.append(sample["probability"])
            if progress:
                done = first + len(sample["label"])
                print(f"[synthetic] {done:,}/{num_rows:,} rows ({time.time() - start:.1f}s)", flush=True)
    labels, probabilities = np.concatenate(labels), np.concatenate(probabilities)
    return best_auc(labels, probabilities) if 0 < labels.sum() < len(labels) else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ttf.data.synthetic",
        description="Write synthetic Criteo-format data with Zipf-distributed keys and a planted logistic "
                    "model; prints the best achievable AUC (the AUC of the planted probabilities).",
        epilog="example: python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv\n"
               "         python -m ttf.data.synthetic --rows 100000 --csv --out /tmp/synthetic.csv.gz",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SyntheticCriteo()
    parser.add_argument("--rows", type=int, required=True, help="number of rows to write (required)")
    parser.add_argument("--out", required=True,
                        help="output file (required); raw Criteo TSV, gzip when it ends with .gz")
    parser.add_argument("--csv", action="store_true", help="write the CSV form with a header instead of TSV")
    parser.add_argument("--vocab-per-field", type=int, default=defaults.vocab_per_field,
                        help=f"distinct values per field (default {defaults.vocab_per_field:,})")
    parser.add_argument("--zipf", type=float, default=defaults.zipf_exponent,
                        help=f"Zipf exponent of value frequencies, > 1 (default {defaults.zipf_exponent})")
    parser.add_argument("--missing-rate", type=float, default=defaults.missing_rate,
                        help=f"probability that a field is empty (default {defaults.missing_rate})")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    parser.add_argument("--model-seed", type=int, default=defaults.model_seed,
                        help=f"seed of the planted model's weights (default {defaults.model_seed})")
    args = parser.parse_args(argv)
    if args.rows <= 0:
        parser.error(f"--rows must be > 0, got {args.rows}")
    try:
        config = SyntheticCriteo(vocab_per_field=args.vocab_per_field, zipf_exponent=args.zipf,
                                 missing_rate=args.missing_rate, model_seed=args.model_seed)
    except ValueError as err:
        parser.error(str(err))
    start = time.time()
    try:
        auc = write_synthetic_criteo(args.out, args.rows, config, seed=args.seed, csv=args.csv, progress=True)
    except OSError as err:
        print(f"[synthetic] cannot write {args.out}: {err}", file=sys.stderr)
        return 1
    print(f"[synthetic] wrote {args.rows:,} rows to {args.out} in {time.time() - start:.1f}s; "
          f"best achievable AUC {auc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
