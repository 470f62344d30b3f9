"""Serving lookups at scale: ttf's hashed export (ttf.serving.HashedTable, stock TF ops) vs
tf.lookup.StaticHashTable on the same keys, in one process, interleaved; and the RSS of a
stock TF process (no ttf) that loads the export, against its rows' bytes.

Each repetition looks up one batch of --batch x --fields ids (3/4 held, 1/4 never seen) and
gathers their rows, in a tf.function: the hashed table (bucket hash, one vectorised probe)
and StaticHashTable (id -> row index, then a gather). Medians over --reps repetitions (the
binary search the hashed export replaced is in benchmarks/results/scale_serving.md's earlier entry). The
StaticHashTable maps each id to its row in the export's own rows array, so both paths
gather from the same rows and only the finding of ids differs; the process holds one copy
of the rows, so 100M keys fit this machine.

With --rows fp16 or int8 the same keys and rows are also frozen in fp32 ("hashed_fp32", one
more interleaved path) and both exports are written and loaded: export bytes, the stock-TF
process's RSS growth and the lookup time of each, and the served rows' largest error against
fp32 (int8: checked within each row's scale / 2). --auc-rows N adds the quality of the
quantized rows: a DeepFM (models/ctr.py, ttf tables, dim --dim) trained one pass on N
synthetic Criteo rows (ttf.data.Synthetic), exported in fp32 and in --rows, both loaded, and
the AUC of each on N / 4 held-out rows, with the largest probability difference.

Examples:
  python benchmarks/scale_serving.py --keys 1000000
  python benchmarks/scale_serving.py --keys 10000000 --dim 8 --reps 30 --rows fp16
  python benchmarks/scale_serving.py --keys 10000000 --dim 32 --reps 20 --rows int8 --auc-rows 400000
"""
import argparse
import json
import shutil
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models (--auc-rows)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# The export is loaded by a process that never imports ttf: the RSS of TF alone, then after
# loading the SavedModel and running one lookup.
LOAD = r"""
import json, sys, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
tf.constant(1) + 1
before = rss()
loaded = tf.saved_model.load(sys.argv[1])
out = loaded.signatures["lookup"](keys=tf.constant(np.load(sys.argv[2])))
after = rss()
assert "ttf" not in sys.modules
np.save(sys.argv[3], out["rows"].numpy())
print(json.dumps({"rss_before": before, "rss_after": after}))
"""


def say(what):
    """A progress line on stderr (a 100M-key run takes many minutes)."""
    print(f"[scale_serving] {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="ids held by the table (default 1,000,000)")
    p.add_argument("--dim", type=int, default=8, help="row width (default 8)")
    p.add_argument("--batch", type=int, default=4096, help="examples per lookup (default 4096)")
    p.add_argument("--fields", type=int, default=26, help="ids per example (default 26)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per path (default 20)")
    p.add_argument("--rows", choices=["fp32", "fp16", "int8"], default="fp32",
                   help="exported row precision (default fp32); fp16 and int8 are also compared with fp32")
    p.add_argument("--auc-rows", type=int, default=0,
                   help="train a DeepFM on this many synthetic rows and compare the held-out AUC served in fp32 and "
                        "in --rows (default 0: skip)")
    p.add_argument("--no-load", action="store_true", help="skip the SavedModel write and stock-TF load")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    for name in ("keys", "dim", "batch", "fields", "reps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    if args.auc_rows < 0 or (args.auc_rows and args.rows == "fp32"):
        p.error("--auc-rows must be >= 0, and compares --rows fp16 or int8 with fp32")
    return args


def write_and_load(shard, probe, expected, dim, count):
    """Writes `shard` as a SavedModel with a `lookup` signature, loads it in a stock TF process
    (no ttf) and checks its rows; returns export bytes, RSS growth and its ratios."""
    row_bytes = int(shard.rows.shape[1]) * shard.rows.dtype.size  # int8: dim codes + a float32 scale and bias
    with tempfile.TemporaryDirectory() as scratch:
        module = tf.Module()
        module.table = shard
        lookup = tf.function(lambda keys: {"rows": shard.lookup(keys)},
                             input_signature=[tf.TensorSpec([None], tf.int64, name="keys")])
        say(f"writing the {shard.rows.dtype.name} export as a SavedModel")
        t0 = time.perf_counter()
        tf.saved_model.save(module, os.path.join(scratch, "1"), signatures={"lookup": lookup})
        save_seconds = time.perf_counter() - t0
        export_bytes = sum(os.path.getsize(os.path.join(folder, name))
                           for folder, _, names in os.walk(os.path.join(scratch, "1")) for name in names)
        np.save(os.path.join(scratch, "probe.npy"), probe.numpy())
        del module, lookup
        say("loading it in a stock TF process")
        env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
        proc = subprocess.run([sys.executable, "-c", LOAD, os.path.join(scratch, "1"),
                               os.path.join(scratch, "probe.npy"), os.path.join(scratch, "out.npy")],
                              capture_output=True, text=True, env=env, cwd=scratch, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        loaded = json.loads(proc.stdout.strip().splitlines()[-1])
        np.testing.assert_array_equal(np.load(os.path.join(scratch, "out.npy")), expected)
    extra = loaded["rss_after"] - loaded["rss_before"]
    rows_bytes = count * row_bytes
    return {"export_bytes": export_bytes, "save_seconds": save_seconds, "rss_growth_bytes": extra,
            "rows_bytes": rows_bytes, "rss_growth_vs_rows": extra / rows_bytes,
            "rss_growth_vs_keys_and_rows": extra / (rows_bytes + 8 * count)}


def served_auc(args, dtype):
    """A DeepFM trained one pass on args.auc_rows synthetic rows, exported in fp32 and in
    `dtype`, both loaded: held-out AUC of each and the largest probability difference."""
    from benchmarks._ctr import deepfm_trainer  # noqa: PLC0415 (only this part trains: the rest stays stock TF)
    import ttf  # noqa: PLC0415
    say(f"training a DeepFM (dim {args.dim}) on {args.auc_rows:,} synthetic rows")
    sample = ttf.data.Synthetic(vocab_per_field=100_000).generate(args.auc_rows + args.auc_rows // 4, seed=7)
    train, held = slice(0, args.auc_rows), slice(args.auc_rows, None)
    model, step = deepfm_trainer(args.dim)

    for start in range(0, args.auc_rows, 512):
        part = slice(start, min(args.auc_rows, start + 512))
        step({"ids": sample["ids"][train][part], "dense": sample["dense"][train][part]}, sample["label"][train][part])
    model({"ids": sample["ids"][:1], "dense": sample["dense"][:1]}, training=False)  # export needs a called model
    result = {"train_rows": args.auc_rows, "heldout_rows": len(sample["label"][held]),
              "table_keys": int(model.sparse.size())}
    probabilities = {}
    scratch = tempfile.mkdtemp()
    try:
        for name, rows in (("fp32", tf.float32), (args.rows, dtype)):
            serve = tf.saved_model.load(ttf.export_for_serving(model, os.path.join(scratch, name),
                                                               row_dtype=rows)).signatures["serving_default"]
            probabilities[name] = np.concatenate([
                serve(ids=tf.constant(sample["ids"][held][i:i + 8192]),
                      dense=tf.constant(sample["dense"][held][i:i + 8192]))["probability"].numpy().ravel()
                for i in range(0, result["heldout_rows"], 8192)])
            result[f"auc_{name}"] = float(ttf.data.best_auc(sample["label"][held], probabilities[name]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["auc_difference"] = result[f"auc_{args.rows}"] - result["auc_fp32"]
    result["max_probability_difference"] = float(np.abs(probabilities[args.rows] - probabilities["fp32"]).max())
    return result


def main(argv=None):
    args = parse_args(argv)
    import ttf  # noqa: F401  (after argparse: -h without loading TensorFlow's op library)
    rng = np.random.default_rng(0)
    # Field-tagged ids, as ttf.data makes them: (field << 56) | value.
    keys = np.unique((rng.integers(0, args.fields, args.keys) << 56) | rng.integers(0, 1 << 40, args.keys))
    held = rng.choice(keys, size=args.batch * args.fields * 3 // 4)
    unseen = rng.integers(1 << 41, 1 << 42, size=args.batch * args.fields - len(held))
    probe = tf.constant(rng.permutation(np.concatenate([held, unseen])), tf.int64)
    dtype = {"fp32": tf.float32, "fp16": tf.float16, "int8": tf.int8}[args.rows]

    say(f"building the hashed export of {len(keys):,} keys")
    t0 = time.perf_counter()
    rows = tf.random.stateless_normal([len(keys), args.dim], seed=[0, 1])  # made in TF: no NumPy copy
    hashed = ttf.serving.HashedShard(tf.constant(keys), rows, tf.zeros([1, args.dim]), dtype=dtype)
    build_hashed = time.perf_counter() - t0
    hashed_fp32 = None
    if dtype != tf.float32:  # the same keys and rows in fp32: what the smaller rows are compared with
        hashed_fp32 = ttf.serving.HashedShard(tf.constant(keys), rows, tf.zeros([1, args.dim]), dtype=tf.float32)
    del rows, keys  # only the export's arrays stay
    count = int(tf.size(hashed.keys)) - 1
    say(f"built in {build_hashed:.0f} s; building the StaticHashTable")
    t0 = time.perf_counter()
    # id -> the row's index in the export's own rows array (the padding row: never held), so both
    # paths gather from one array: what differs is only how an id is found.
    static = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(hashed.keys[:-1],
                                                                           tf.range(count, dtype=tf.int64)),
                                       default_value=count)
    static.size()  # built
    build_static = time.perf_counter() - t0

    @tf.function
    def hashed_lookup(k):
        return hashed.lookup(k)

    @tf.function
    def static_lookup(k):
        return hashed.rows_at(static.lookup(k))

    paths = {"hashed": hashed_lookup, "static_hash_table": static_lookup}
    reference = static_lookup(probe).numpy()
    for name, fn in paths.items():  # same rows from every path
        np.testing.assert_array_equal(fn(probe).numpy(), reference, err_msg=name)
    row_error = None
    if hashed_fp32 is not None:
        paths["hashed_fp32"] = tf.function(lambda k: hashed_fp32.lookup(k))
        exact = paths["hashed_fp32"](probe).numpy()
        row_error = float(np.abs(reference - exact).max())
        if dtype == tf.int8:  # every element within half a quantization step of its row (plus float32 rounding)
            bound = (exact.max(1, keepdims=True) - exact.min(1, keepdims=True)) / 255 / 2 + 1e-6 * np.abs(exact).max()
            assert np.all(np.abs(reference - exact) <= bound), "int8 rows beyond scale / 2"
    say(f"built in {build_static:.0f} s; {args.reps} interleaved lookups per path")
    times = {name: [] for name in paths}
    for _ in range(args.reps):  # interleaved: the machine's load hits every path alike
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn(probe).numpy()
            times[name].append(time.perf_counter() - t0)
    median = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    result = {
        "keys": count, "dim": args.dim, "rows": args.rows, "ids_per_lookup": int(probe.shape[0]),
        "probe": hashed.probe, "buckets": hashed.buckets,
        "median_ms": median, "hashed_vs_static": median["hashed"] / median["static_hash_table"],
        "hashed_vs_hashed_fp32": median["hashed"] / median["hashed_fp32"] if hashed_fp32 is not None else None,
        "max_row_error_vs_fp32": row_error,
        "build_seconds": {"hashed": build_hashed, "static_hash_table": build_static},
        "peak_rss_bytes_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if not args.no_load:
        shards = {args.rows: hashed} if hashed_fp32 is None else {args.rows: hashed, "fp32": hashed_fp32}
        del static, hashed, hashed_fp32, paths, hashed_lookup, static_lookup
        result["stock_tf_load"] = {}
        for name in list(shards):  # one at a time: the process holds its shard, the loader its copy
            result["stock_tf_load"][name] = write_and_load(shards.pop(name), probe,
                                                           reference if name == args.rows else exact, args.dim, count)
    if args.auc_rows:
        result["auc"] = served_auc(args, dtype)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
