"""Where one delta publish spends its time: the export of the touched rows, the part files'
write, their checksums, fsync, and the manifest and rename, with the remainder (serialising
the parts, quantizing int8 rows, bookkeeping) by difference.

It times ttf.serving.Publisher itself, not a copy of it: the functions a publish calls are
wrapped with timers (EmbeddingTable.export, ttf.serving._publish._write_file, _fingerprint,
fsync_path, write_text, tf.io.gfile.rename), a DeepFM (models/ctr.py, ttf tables, dim --dim) trains one
step of --train-batch synthetic rows before each of --reps deltas, and the medians of each
part over the deltas are printed with the delta's rows and bytes. One process; the publish
folder is in the system's temporary folder (TMPDIR picks the disk).

Example:
  python benchmarks/publish_breakdown.py --rows fp32 --train-batch 1024 --reps 20
"""
import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def timed(spent, name, function):
    """`function`, adding each call's wall seconds to spent[name]."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
    return wrapper


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", choices=["fp32", "fp16", "int8"], default="fp32", help="published rows (default fp32)")
    p.add_argument("--dim", type=int, default=32, help="embedding dim (default 32)")
    p.add_argument("--train-batch", type=int, default=1024, help="training rows before each delta (default 1024)")
    p.add_argument("--reps", type=int, default=20, help="deltas timed (default 20)")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    import ttf  # noqa: PLC0415
    from benchmarks._ctr import deepfm_trainer  # noqa: PLC0415
    from ttf.embedding._table import EmbeddingTable  # noqa: PLC0415
    from ttf.serving import _publish  # noqa: PLC0415

    sample = ttf.data.Synthetic(vocab_per_field=200_000).generate(args.train_batch * (args.reps + 20), seed=5)
    model, step = deepfm_trainer(args.dim)

    def train(i):
        part = slice(i * args.train_batch, (i + 1) * args.train_batch)
        step({"ids": sample["ids"][part], "dense": sample["dense"][part]}, sample["label"][part])

    model({"ids": sample["ids"][:1], "dense": sample["dense"][:1]}, training=False)
    for i in range(20):
        train(i)
    base = tempfile.mkdtemp(prefix="publish_breakdown-")  # the system's temporary folder: say which disk it is on
    dtype = {"fp32": tf.float32, "fp16": tf.float16, "int8": tf.int8}[args.rows]
    publisher = ttf.serving.Publisher(model, base, dense_publish_every=1e9, row_dtype=dtype)
    try:
        publisher.publish()  # the base
        spent = collections.Counter()
        EmbeddingTable.export = timed(spent, "export touched rows", EmbeddingTable.export)
        _publish._write_file = timed(spent, "write part files", _publish._write_file)
        _publish._fingerprint = timed(spent, "checksum (farmhash64)", _publish._fingerprint)
        _publish.fsync_path = timed(spent, "fsync (parts, folders)", _publish.fsync_path)
        _publish.write_text = timed(spent, "manifest (write + fsync)", _publish.write_text)
        tf.io.gfile.rename = timed(spent, "rename", tf.io.gfile.rename)
        parts = collections.defaultdict(list)
        for i in range(args.reps):
            train(20 + i)
            spent.clear()
            start = time.perf_counter()
            publisher.publish_delta()
            total = time.perf_counter() - start
            manifest = json.load(open(os.path.join(ttf.serving.delta_folder(base, publisher.version,
                                                                            publisher.sequence), "manifest.json")))
            parts["total"].append(total)
            for name, seconds in spent.items():
                parts[name].append(seconds)
            parts["rest (serialise, quantize, manifest, bookkeeping)"].append(total - sum(spent.values()))
            parts["rows"].append(sum(p["rows"] for p in manifest["parts"]))
            parts["bytes"].append(sum(p["bytes"] for p in manifest["parts"]))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {"rows": args.rows, "dim": args.dim, "train_batch": args.train_batch, "deltas": args.reps,
              "median": {name: float(np.median(values)) for name, values in parts.items()}}
    result["median_ms"] = {name: 1e3 * value for name, value in result.pop("median").items()
                           if name not in ("rows", "bytes")}
    result["rows_per_delta"] = float(np.median(parts["rows"]))
    result["bytes_per_delta"] = float(np.median(parts["bytes"]))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
