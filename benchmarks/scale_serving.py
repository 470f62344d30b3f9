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

Examples:
  python benchmarks/scale_serving.py --keys 1000000
  python benchmarks/scale_serving.py --keys 10000000 --dim 8 --reps 30 --rows fp16
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
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
    p.add_argument("--rows", choices=["fp32", "fp16"], default="fp32", help="exported row precision (default fp32)")
    p.add_argument("--no-load", action="store_true", help="skip the SavedModel write and stock-TF load")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    for name in ("keys", "dim", "batch", "fields", "reps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    import ttf  # noqa: F401  (after argparse: -h without loading TensorFlow's op library)
    rng = np.random.default_rng(0)
    # Field-tagged ids, as ttf.data makes them: (field << 56) | value.
    keys = np.unique((rng.integers(0, args.fields, args.keys) << 56) | rng.integers(0, 1 << 40, args.keys))
    held = rng.choice(keys, size=args.batch * args.fields * 3 // 4)
    unseen = rng.integers(1 << 41, 1 << 42, size=args.batch * args.fields - len(held))
    probe = tf.constant(rng.permutation(np.concatenate([held, unseen])), tf.int64)
    dtype = tf.float16 if args.rows == "fp16" else tf.float32

    say(f"building the hashed export of {len(keys):,} keys")
    t0 = time.perf_counter()
    rows = tf.random.stateless_normal([len(keys), args.dim], seed=[0, 1])  # made in TF: no NumPy copy
    hashed = ttf.serving.HashedShard(tf.constant(keys), rows, tf.zeros([1, args.dim]), dtype=dtype)
    build_hashed = time.perf_counter() - t0
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
        return tf.cast(tf.gather(hashed.rows, static.lookup(k)), tf.float32)

    paths = {"hashed": hashed_lookup, "static_hash_table": static_lookup}
    reference = static_lookup(probe).numpy()
    for name, fn in paths.items():  # same rows from every path
        np.testing.assert_array_equal(fn(probe).numpy(), reference, err_msg=name)
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
        "build_seconds": {"hashed": build_hashed, "static_hash_table": build_static},
        "peak_rss_bytes_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if not args.no_load:
        rows_bytes = count * args.dim * (2 if args.rows == "fp16" else 4)
        with tempfile.TemporaryDirectory() as scratch:
            module = tf.Module()
            module.table = hashed
            lookup = tf.function(lambda keys: {"rows": hashed.lookup(keys)},
                                 input_signature=[tf.TensorSpec([None], tf.int64, name="keys")])
            say("writing the export as a SavedModel")
            t0 = time.perf_counter()
            tf.saved_model.save(module, os.path.join(scratch, "1"), signatures={"lookup": lookup})
            result["save_seconds"] = time.perf_counter() - t0
            np.save(os.path.join(scratch, "probe.npy"), probe.numpy())
            del module, lookup, static, hashed, paths, hashed_lookup, static_lookup
            say("loading it in a stock TF process")
            env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
            proc = subprocess.run([sys.executable, "-c", LOAD, os.path.join(scratch, "1"),
                                   os.path.join(scratch, "probe.npy"), os.path.join(scratch, "out.npy")],
                                  capture_output=True, text=True, env=env, cwd=scratch, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            loaded = json.loads(proc.stdout.strip().splitlines()[-1])
            np.testing.assert_array_equal(np.load(os.path.join(scratch, "out.npy")), reference)
        extra = loaded["rss_after"] - loaded["rss_before"]
        result["stock_tf_load"] = {"rss_growth_bytes": extra, "rows_bytes": rows_bytes,
                                   "rss_growth_vs_rows": extra / rows_bytes,
                                   "rss_growth_vs_keys_and_rows": extra / (rows_bytes + 8 * count)}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
