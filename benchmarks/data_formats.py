"""The same rows as TSV, Parquet (written by DuckDB) and TFRecord (tf.io.TFRecordWriter):
the same keys, and one epoch of models/train.py on each to AUC and logloss (issue 48's
targets: keys equal, AUC and logloss within 0.005 of each other).

Synthetic Criteo-schema rows (a planted model, ttf.data.SyntheticCriteo), a train and an
eval file per format. Keys: every row's ids read by ttf.data.Reader (no shuffle) compared
element for element with the TSV's. Training: `models/train.py --tiacc --epochs 1
--data <train> --eval-data <eval>` in one process per format.

    .venv/bin/python benchmarks/data_formats.py --rows 200000
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ttf  # noqa: E402

NAMES = ttf.data.CRITEO.header_line(",").split(",")


def to_parquet(tsv, path):
    """DuckDB reads the TSV (column types given: counts BIGINT, categorical VARCHAR) and writes Parquet."""
    types = ", ".join(f"'{n}': '{'BIGINT' if n[0] in 'lI' else 'VARCHAR'}'" for n in NAMES)
    duckdb.sql(f"COPY (SELECT * FROM read_csv('{tsv}', delim='\\t', header=false, columns={{{types}}})) "
               f"TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 65536)")


def to_tfrecord(tsv, path):
    """One tf.train.Example per line: label int64, counts int64_list, categorical bytes_list; empty fields absent."""
    with open(tsv) as f, tf.io.TFRecordWriter(path) as writer:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            feature = {}
            for name, value in zip(NAMES, fields):
                if value == "":
                    continue
                if name[0] in "lI":
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
                else:
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def all_ids(path):
    return np.concatenate([f["ids"].numpy() for f, _ in ttf.data.Reader(path).dataset(65_536, shuffle=False)])


def train(data, eval_data, out):
    cmd = [sys.executable, os.path.join(ROOT, "models", "train.py"), "--tiacc", "--epochs", "1", "--batch-size",
           "4096", "--data", data, "--eval-data", eval_data, "--metrics-out", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="train rows (eval: a quarter as many)")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="ttf_data_formats_")
    files = {}
    for split, rows, seed in (("train", args.rows, 0), ("eval", args.rows // 4, 1)):
        tsv = os.path.join(directory, f"{split}.tsv")
        ttf.data.write_synthetic_criteo(tsv, rows, ttf.data.SyntheticCriteo(vocab_per_field=50_000), seed=seed)
        to_parquet(tsv, os.path.join(directory, f"{split}.parquet"))
        to_tfrecord(tsv, os.path.join(directory, f"{split}.tfrecord"))
        files[split] = tsv
    reference = {split: all_ids(files[split]) for split in files}
    print("| format | written by | keys equal to TSV's (train, eval) | AUC | logloss | examples trained |")
    print("|---|---|---|---|---|---|")
    for fmt, writer in (("tsv", "ttf.data.write_synthetic_criteo"), ("parquet", "DuckDB " + duckdb.__version__),
                        ("tfrecord", "tf.io.TFRecordWriter")):
        paths = {split: os.path.join(directory, f"{split}.{fmt}") for split in files}
        same = [bool(np.array_equal(all_ids(paths[s]), reference[s])) for s in ("train", "eval")]
        metrics = train(paths["train"], paths["eval"], os.path.join(directory, f"{fmt}.json"))
        print(f"| {fmt} | {writer} | {same[0]}, {same[1]} | {metrics['auc']:.4f} | {metrics['logloss']:.4f} | "
              f"{metrics['examples_trained']} |", flush=True)


if __name__ == "__main__":
    main()
