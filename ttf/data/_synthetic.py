"""Synthetic data of any schema with Zipf-distributed keys and a planted logistic model.

Each categorical field's values are Zipf-distributed ranks below `vocab_per_field` (rank 0
the most frequent); each key has a weight that is a pure function of (model_seed, key), so
no weight table is stored even for millions of ids. A label is drawn from sigmoid(bias +
sum of the row's one-hot key weights + the combined (mean or sum) key weights of each
multi-hot list + dense weights . centred dense features), so the data are learnable and
the best achievable AUC (the AUC of the true probabilities) is known:
`best_auc(sample["label"], sample["probability"])`.

The schema decides the columns (ttf.data.Schema; "criteo" by default, "avazu", or your
own): Dense columns are geometric counts, Hour stamps fall in the 10 days from
2014-10-21, MultiHot lists hold 0 to `max_multi_hot` values, Skip columns are empty.

Rows are drawn in chunks of 65,536 from a generator seeded by (seed, chunk index), so
`generate(n, seed)`, `synthetic_dataset(n, ..., seed=seed)` and a file written with
`write_synthetic(path, n, seed=seed)` hold the same rows, with no need to hold a large
file's rows in memory.

CLI (writes a file that ttf.data.Reader reads back to the same ids):
    python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv
    python -m ttf.data.synthetic --schema avazu --rows 100000 --out /tmp/avazu.csv
    python -m ttf.data.synthetic -h
"""
import argparse
import dataclasses
import gzip
import sys
import time

import numpy as np

from ttf.data._schema import FIELD_SHIFT, MISSING_VALUE, Schema, _fnv1a64, load_schema

_CHUNK_ROWS = 65_536
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_FIRST_DAY = 16364  # 2014-10-21 (Avazu's first day) in days since 1970-01-01; a Tuesday


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


def _hex8(values):
    """uint8 [..., 8]: each value (< 2^32) as 8 lower-case hex digits."""
    value_bytes = values.astype(">u4").view(np.uint8).reshape(values.shape + (4,))
    out = np.empty(values.shape + (8,), np.uint8)
    out[..., 0::2] = _HEX[value_bytes >> 4]
    out[..., 1::2] = _HEX[value_bytes & 0xF]
    return out


def _decimal(values, width=None):
    """uint8 [..., width]: non-negative integers as decimal digits, right-aligned, 0 bytes
    (removed when written) in front."""
    values = np.maximum(values, 0)
    width = width or max(1, len(str(int(values.max(initial=0)))))
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (values[..., None] // powers) % 10
    num_digits = 1 + (values[..., None] >= powers[:-1]).sum(axis=-1)
    return np.where(np.arange(width) >= width - num_digits[..., None], _DIGITS[digits], 0).astype(np.uint8)


def _string_keys(ranks):
    """Low 56 bits of the key of each rank written as 8 hex digits in values="string" mode."""
    unique, inverse = np.unique(ranks, return_inverse=True)
    hashed = np.array([(1 << 32) + _fnv1a64(b"%08x" % r) % (MISSING_VALUE - (1 << 32)) for r in unique.tolist()],
                      np.int64)
    return hashed[inverse].reshape(ranks.shape)


@dataclasses.dataclass(frozen=True)
class Synthetic:
    """The generator's configuration; `generate(num_rows, seed)` draws a sample.

    Args:
      schema: the columns to make: a Schema, "criteo" (default), "avazu" or a JSON file.
      vocab_per_field: distinct values per categorical field (ranks 0 .. vocab_per_field - 1,
        written as 8 hex digits (values "auto" or "string") or in decimal ("int")).
      zipf_exponent: > 1; rank r has probability ~ (r + 1)^-exponent (the tail beyond the
        vocabulary folds back into it).
      missing_rate: probability in [0, 1) that a field (categorical, dense, hour) is empty.
      key_weight_std, dense_weight_std, bias: the planted logistic model.
      max_multi_hot: a MultiHot list holds 0 .. max_multi_hot values (uniform).
      model_seed: fixes the planted weights (independent of the sample's seed).

    Raises:
      ValueError: a value out of range.

    Example:
      >>> from ttf.data import Synthetic, best_auc
      >>> sample = Synthetic(vocab_per_field=10_000).generate(20_000, seed=1)
      >>> sample["ids"].shape, sample["dense"].dtype
      ((20000, 26), dtype('float32'))
      >>> 0.75 < best_auc(sample["label"], sample["probability"]) < 0.99
      True
      >>> Synthetic(schema="avazu").generate(10)["ids"].shape
      (10, 23)
    """

    vocab_per_field: int = 1_000_000
    zipf_exponent: float = 1.1
    missing_rate: float = 0.0
    key_weight_std: float = 0.35
    dense_weight_std: float = 0.3
    bias: float = -1.2
    model_seed: int = 1234
    schema: Schema = "criteo"
    max_multi_hot: int = 5

    def __post_init__(self):
        object.__setattr__(self, "schema", load_schema(self.schema))
        if not 1 <= self.vocab_per_field <= 1 << 32:
            raise ValueError(f"vocab_per_field must be in [1, 2^32], got {self.vocab_per_field}")
        if not self.zipf_exponent > 1.0:
            raise ValueError(f"zipf_exponent must be > 1, got {self.zipf_exponent}")
        if not 0.0 <= self.missing_rate < 1.0:
            raise ValueError(f"missing_rate must be in [0, 1), got {self.missing_rate}")
        if self.max_multi_hot < 0:
            raise ValueError(f"max_multi_hot must be >= 0, got {self.max_multi_hot}")

    def key_weights(self, ids):
        """Planted weight of each field-tagged key (int64 array of any shape)."""
        bits = _mix64(ids.astype(np.uint64) ^ _mix64(np.array([self.model_seed], np.uint64)))
        return self.key_weight_std * _unit_normal(bits)

    def dense_weights(self):
        """Planted weights [D] of the centred dense features."""
        return np.random.default_rng(self.model_seed).normal(0.0, self.dense_weight_std, self.schema.num_dense)

    def _population(self, field, ranks):
        """The value (< 2^32) written for each popularity rank of a field: the rank itself
        (DriftingSynthetic maps ranks to ids that change over time)."""
        del field
        return ranks

    def generate(self, num_rows, seed=0):
        """Draws num_rows rows.

        Returns:
          dict of NumPy arrays, what the reader yields for the written rows: ids int64
          [N, F] (field-tagged keys), dense float32 [N, D] (transformed; a missing value
          is the column's transformed default), for each MultiHot column `<name>` int64
          [total] (keys) and `<name>_lengths` int64 [N]; label float32 [N]; probability
          float64 [N] (the true click probability of the planted model); raw_dense int64
          [N, D] (the counts written, -1 where missing).
        """
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        chunks = [self._chunk(min(_CHUNK_ROWS, num_rows - first), seed, index)
                  for index, first in enumerate(range(0, num_rows, _CHUNK_ROWS))] or [self._chunk(0, seed, 0)]
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0] if not name.startswith("_")}

    def _chunk(self, num_rows, seed, index):
        schema = self.schema
        rng = np.random.default_rng([seed, index])
        n, tag = num_rows, lambda field, v: (np.int64(field) << FIELD_SHIFT) | v  # noqa: E731
        ids = np.empty((n, schema.num_fields), np.int64)
        raw_dense = np.empty((n, schema.num_dense), np.int64)
        dense = np.empty((n, schema.num_dense), np.float32)
        out, text = {}, {}  # text: per column, what the writer writes
        logit = np.full(n, self.bias)
        field = dense_index = multi_index = 0
        dense_weights = self.dense_weights()
        for column in schema.columns:
            missing = (rng.random(n) < self.missing_rate) if self.missing_rate > 0 else np.zeros(n, bool)
            if column.kind == "categorical":
                ranks = ((rng.zipf(self.zipf_exponent, size=n) - 1) % self.vocab_per_field).astype(np.int64)
                ranks = self._population(field, ranks)
                values = _string_keys(ranks) if column.values == "string" else ranks
                ids[:, field] = tag(field, np.where(missing, MISSING_VALUE, values))
                text[column.name] = ("int" if column.values == "int" else "hex", ranks, missing)
                field += 1
            elif column.kind == "hour":
                day, hour = rng.integers(0, 10, n), rng.integers(0, 24, n)
                weekday = (_FIRST_DAY + day + 3) % 7  # 1970-01-01 was a Thursday
                ids[:, field] = tag(field, np.where(missing, MISSING_VALUE, hour))
                ids[:, field + 1] = tag(field + 1, np.where(missing, MISSING_VALUE, weekday))
                text[column.name] = ("hour", 14102100 + day * 100 + hour, missing)
                field += 2
            elif column.kind == "dense":
                mean = 3.0 * (dense_index + 1)
                counts = rng.geometric(p=1.0 / (1.0 + mean), size=n).astype(np.int64) - 1
                counts[missing] = -1  # written as an empty field
                raw = np.where(missing, column.default, counts).astype(np.float64)
                value = np.log1p(np.maximum(raw, 0)) if column.transform == "log1p" else raw
                dense[:, dense_index], raw_dense[:, dense_index] = value, counts
                centred = value - (np.log1p(mean) if column.transform == "log1p" else mean)
                scale = 1.0 if column.transform == "log1p" else 1.0 / mean
                logit += dense_weights[dense_index] * scale * centred
                text[column.name] = ("count", counts, missing)
                dense_index += 1
            elif column.kind == "multi_hot":
                lengths = rng.integers(0, self.max_multi_hot + 1, n)
                ranks = ((rng.zipf(self.zipf_exponent, size=int(lengths.sum())) - 1) % self.vocab_per_field)
                ranks = self._population(schema.num_fields + multi_index, ranks.astype(np.int64))
                values = _string_keys(ranks) if column.values == "string" else ranks
                keys = tag(schema.num_fields + multi_index, values)
                weights = np.bincount(np.repeat(np.arange(n), lengths), self.key_weights(keys), minlength=n)
                logit += weights / np.maximum(lengths, 1) if column.combiner == "mean" else weights
                out[column.name], out[column.name + "_lengths"] = keys, lengths.astype(np.int64)
                text[column.name] = ("list", ranks, lengths, column.separator, column.values == "int")
                multi_index += 1
        logit += self.key_weights(ids).sum(axis=1)
        probability = 1.0 / (1.0 + np.exp(-logit))
        label = (rng.random(n) < probability).astype(np.float32)
        out.update(ids=ids, dense=dense, raw_dense=raw_dense, label=label, probability=probability, _text=text)
        return out

    def format_rows(self, sample, delimiter=None):
        """The rows of a chunk as text (bytes), one line each, built as byte matrices: each
        column gets a fixed-width slot per row, unused bytes are 0 and removed at the end."""
        schema = self.schema
        delimiter = delimiter or ("\t" if schema.delimiter == "auto" else schema.delimiter)
        n = len(sample["label"])
        parts = []
        for column in schema.columns:
            entry = sample["_text"].get(column.name)
            if column.kind == "label":
                part = np.where(sample["label"] > 0.5, ord("1"), ord("0")).astype(np.uint8)[:, None]
            elif column.kind == "skip":
                part = np.zeros((n, 0), np.uint8)
            elif entry[0] == "hex":
                part = _hex8(entry[1])
                part[entry[2]] = 0
            elif entry[0] in ("int", "count", "hour"):
                part = _decimal(entry[1])
                part[entry[2] | (entry[1] < 0)] = 0
            else:  # a list: item j is [separator if j > 0] + its digits, absent items all 0
                _, ranks, lengths, separator, decimal = entry
                width = max(1, int(lengths.max(initial=0)))
                slots = np.zeros((n, width), np.int64)
                present = np.arange(width) < lengths[:, None]
                slots[present] = ranks
                digits = _decimal(slots, 10) if decimal else _hex8(slots)
                item = np.concatenate([np.full((n, width, 1), ord(separator), np.uint8), digits], axis=2)
                item[:, 0, 0] = 0
                item[~present] = 0
                part = item.reshape(n, -1)
            parts.append(part)
            parts.append(np.full((n, 1), ord(delimiter), np.uint8))
        parts[-1] = np.full((n, 1), ord("\n"), np.uint8)
        line = np.concatenate(parts, axis=1)
        flat = line.ravel()
        return flat[flat != 0].tobytes()


SyntheticCriteo = Synthetic  # the Criteo schema is Synthetic's default; the older name of the same class


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


def synthetic_dataset(num_rows, batch_size, config=Synthetic(), seed=0, num_epochs=1, shuffle=True,
                      drop_remainder=False):
    """An in-memory tf.data.Dataset with the reader's element structure for config.schema
    (Criteo: `({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B])`), for
    benchmarks: the sample is drawn once (NumPy) and cut into batches without per-row
    tf.data work.

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
    schema, features = config.schema, {}
    if schema.num_fields:
        features["ids"] = sample["ids"]
    if schema.num_dense:
        features["dense"] = sample["dense"]
    for name in schema.multi_hot_names:
        features[name] = tf.RaggedTensor.from_row_lengths(sample[name], sample[name + "_lengths"])
    ds = tf.data.Dataset.from_tensors((features, sample["label"]))
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


def write_synthetic(path, num_rows, config=Synthetic(), seed=0, delimiter=None, header=None, progress=False):
    """Writes num_rows synthetic rows of config.schema to a file that ttf.data.Reader reads
    with that schema; gzip when path ends with .gz. The rows are those of
    `config.generate(num_rows, seed)`.

    Args:
      delimiter: the column delimiter; default the schema's (a tab for "auto").
      header: write a header line; default: when the schema's header is True.

    Returns:
      The best achievable AUC on what was written (AUC of the planted probabilities).

    Example:
      >>> import ttf
      >>> auc = ttf.data.write_synthetic("/tmp/avazu_example.csv", 1000, ttf.data.Synthetic(schema="avazu"))
      >>> reader = ttf.data.Reader("/tmp/avazu_example.csv", schema="avazu")
      >>> sum(int(labels.shape[0]) for _, labels in reader.dataset(512, shuffle=False))
      1000
    """
    labels, probabilities = _write(path, num_rows, config, seed, delimiter, header, progress)
    return _auc_or_nan(labels, probabilities)


def write_synthetic_criteo(path, num_rows, config=Synthetic(), seed=0, csv=False, progress=False):
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
    if config.schema.name != "criteo":
        raise ValueError(f"write_synthetic_criteo writes the criteo schema, got {config.schema.name!r}; "
                         "use write_synthetic")
    return write_synthetic(path, num_rows, config, seed, delimiter="," if csv else "\t", header=csv, progress=progress)


def _auc_or_nan(labels, probabilities):
    return best_auc(labels, probabilities) if 0 < labels.sum() < len(labels) else float("nan")


def _write(path, num_rows, config, seed, delimiter, header, progress):
    """Writes the file; returns the labels and planted probabilities of its rows."""
    if num_rows <= 0:
        raise ValueError(f"num_rows must be > 0, got {num_rows}")
    path = str(path)
    schema = config.schema
    delimiter = delimiter or ("\t" if schema.delimiter == "auto" else schema.delimiter)
    header = schema.header is True if header is None else header
    labels, probabilities = [], []
    start = time.time()
    opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if path.endswith(".gz") else (lambda p: open(p, "wb"))
    with opener(path) as f:
        if header:
            f.write((schema.header_line(delimiter) + "\n").encode())
        for index, first in enumerate(range(0, num_rows, _CHUNK_ROWS)):
            sample = config._chunk(min(_CHUNK_ROWS, num_rows - first), seed, index)
            f.write(config.format_rows(sample, delimiter))
            labels.append(sample["label"])
            probabilities.append(sample["probability"])
            if progress:
                done = first + len(sample["label"])
                print(f"[synthetic] {done:,}/{num_rows:,} rows ({time.time() - start:.1f}s)", flush=True)
    return np.concatenate(labels), np.concatenate(probabilities)


_CACHE_VERSION = 2  # bump when the generator's output for a given config changes


def cached_synthetic(directory, num_rows, config=Synthetic(), seed=0, holdout_every=5):
    """A synthetic file of config.schema under `directory`, written on first use and reused after.

    The file name holds a digest of (num_rows, config, seed), so another configuration
    gets its own file. Beside it, `<file>.json` holds the best achievable AUC (that of the
    planted probabilities) of all rows, of the held-out rows (those whose 1-based line
    number is a multiple of holdout_every: `CriteoReader.dataset(split="eval")`) and of
    the others. Written under temporary names and renamed, so an interrupted run leaves
    no half file behind.

    Returns:
      (path, info): info is the dict of the JSON file: rows, seed, config, best_auc_all,
      best_auc_eval, best_auc_train, label_rate, seconds (time it took to write),
      holdout_every; plus cached (False when this call wrote the file).

    Example:
      >>> import ttf
      >>> path, info = ttf.data.cached_synthetic("/tmp/ttf_cache_example", 2000)
      >>> 0.5 < info["best_auc_eval"] < 1.0
      True
    """
    import hashlib  # noqa: PLC0415
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415

    described = {**dataclasses.asdict(config), "schema": config.schema.to_dict()}
    key = json.dumps([_CACHE_VERSION, num_rows, seed, holdout_every, described], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    suffix = "csv" if config.schema.delimiter == "," else "txt"
    path = os.path.join(os.fspath(directory), f"synthetic-{config.schema.name}-{num_rows}rows-{digest}.{suffix}")
    info_path = path + ".json"
    if os.path.isfile(path) and os.path.isfile(info_path):
        with open(info_path) as f:
            return path, dict(json.load(f), cached=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    start = time.time()
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        labels, probabilities = _write(temporary, num_rows, config, seed, None, None, progress=False)
        # Line numbers count a header line: the reader's split does the same.
        first_line = 2 if config.schema.header is True else 1
        held_out = np.arange(first_line, num_rows + first_line) % holdout_every == 0
        info = {"rows": num_rows, "seed": seed, "holdout_every": holdout_every, "config": described,
                "best_auc_all": _auc_or_nan(labels, probabilities),
                "best_auc_eval": _auc_or_nan(labels[held_out], probabilities[held_out]),
                "best_auc_train": _auc_or_nan(labels[~held_out], probabilities[~held_out]),
                "label_rate": float(labels.mean()), "seconds": round(time.time() - start, 2)}
        with open(info_path + ".tmp", "w") as f:
            json.dump(info, f, indent=2)
        os.replace(temporary, path)
        os.replace(info_path + ".tmp", info_path)
    finally:
        for leftover in (temporary, info_path + ".tmp"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path, dict(info, cached=False)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ttf.data.synthetic",
        description="Write synthetic data of a schema (criteo, avazu or a JSON schema file) with Zipf-distributed "
                    "keys and a planted logistic model; prints the best achievable AUC (the AUC of the planted "
                    "probabilities).",
        epilog="example: python -m ttf.data.synthetic --rows 1000000 --out /tmp/synthetic.tsv\n"
               "         python -m ttf.data.synthetic --rows 100000 --csv --out /tmp/synthetic.csv.gz\n"
               "         python -m ttf.data.synthetic --schema avazu --rows 100000 --out /tmp/avazu.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Synthetic()
    parser.add_argument("--rows", type=int, required=True, help="number of rows to write (required)")
    parser.add_argument("--out", required=True,
                        help="output file (required); gzip when it ends with .gz")
    parser.add_argument("--schema", default="criteo",
                        help="criteo (default: raw TSV without header), avazu (CSV with header) or a JSON schema file")
    parser.add_argument("--csv", action="store_true",
                        help="comma separated with a header line (criteo's CSV form; other schemas: their own "
                             "delimiter and header rule)")
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
        config = Synthetic(vocab_per_field=args.vocab_per_field, zipf_exponent=args.zipf,
                           missing_rate=args.missing_rate, model_seed=args.model_seed, schema=args.schema)
    except ValueError as err:
        parser.error(str(err))
    start = time.time()
    try:
        if args.csv:
            auc = write_synthetic(args.out, args.rows, config, seed=args.seed, progress=True,
                                  delimiter="," if config.schema.delimiter == "auto" else None, header=True)
        else:
            auc = write_synthetic(args.out, args.rows, config, seed=args.seed, progress=True)
    except OSError as err:
        print(f"[synthetic] cannot write {args.out}: {err}", file=sys.stderr)
        return 1
    print(f"[synthetic] wrote {args.rows:,} rows to {args.out} in {time.time() - start:.1f}s; "
          f"best achievable AUC {auc:.4f}", flush=True)
    return 0
