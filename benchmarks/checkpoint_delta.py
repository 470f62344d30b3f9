"""Full vs delta checkpoints of a 10M-key table: bytes on disk and seconds to save.

A DynamicEmbedding (dim 16, Adam: row + 2 slots = 48 floats per key) is grown to 10M keys
and trained once on all of them. Then, repeatedly: train steps touching `--touched` keys
(1% by default), save with ttf.checkpoint.CheckpointManager alternating a full checkpoint
and a delta (the compared paths interleaved, same table). Reports the median size and
save time of each kind and their ratio; restores the last chain into a new layer and
checks it equals the live table. Records in benchmarks/results/checkpoint_delta.md unless --quick.

    .venv/bin/python benchmarks/checkpoint_delta.py            # 10M keys (about 4 GB RAM)
    .venv/bin/python benchmarks/checkpoint_delta.py --quick    # 200k keys, nothing recorded
"""
import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402
import tensorflow as tf

DIM = 16


def train_on(layer, optimizer, keys, chunk=1 << 20):
    for start in range(0, len(keys), chunk):
        ids = tf.constant(keys[start:start + chunk])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def size_of(prefix):
    return sum(os.path.getsize(p) for p in tf.io.gfile.glob(prefix + ".*"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000_000, help="table size (default 10M)")
    p.add_argument("--touched", type=float, default=0.01, help="fraction of keys trained between saves (default 0.01)")
    p.add_argument("--reps", type=int, default=3, help="full/delta pairs (default 3)")
    p.add_argument("--quick", action="store_true", help="200k keys, 2 reps, nothing recorded")
    p.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temp dir, removed)")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.reps = 200_000, 2
    directory = args.dir or tempfile.mkdtemp(prefix="ttf_delta_bench_")
    rng = np.random.default_rng(0)
    all_keys = rng.permutation(np.arange(args.keys, dtype=np.int64) * 7919 + 13)
    layer, optimizer = ttf.DynamicEmbedding(DIM, seed=1), ttf.optimizers.Adam(1e-3)
    t0 = time.perf_counter()
    train_on(layer, optimizer, all_keys)
    print(f"[bench] table of {int(layer.size()):,} keys trained once in {time.perf_counter() - t0:.1f}s", flush=True)
    checkpoint = tf.train.Checkpoint(layer=layer, optimizer=optimizer)
    # full_every = 2: the saves alternate full, delta, full, delta, ...
    manager = ttf.checkpoint.CheckpointManager(checkpoint, directory, full_every=2, max_to_keep=1)
    touched = int(args.keys * args.touched)
    results = {"full": [], "delta": []}
    for rep in range(args.reps):
        for kind in ("full", "delta"):
            train_on(layer, optimizer, rng.choice(all_keys, size=touched, replace=False))
            step = int(optimizer.iterations)
            start = time.perf_counter()
            path = manager.save(step)
            seconds = time.perf_counter() - start
            assert os.path.basename(path).startswith("ckpt" if kind == "full" else "delta"), path
            results[kind].append((size_of(path), seconds))
            print(f"[bench] rep {rep}: {kind:5s} {size_of(path) / 1e6:9.1f} MB in {seconds:6.2f}s", flush=True)
    # The last chain (full + delta) restores to the live table.
    restored = ttf.DynamicEmbedding(DIM, seed=1)
    restored_opt = ttf.optimizers.Adam(1e-3)
    ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=restored, optimizer=restored_opt), directory,
                                     full_every=2).restore_latest()
    probe = tf.constant(rng.choice(all_keys, size=100_000))
    assert int(restored.size()) == int(layer.size())
    np.testing.assert_array_equal(restored(probe).numpy(), layer(probe).numpy())
    if not args.dir:
        shutil.rmtree(directory)

    med = {k: (statistics.median(s for s, _ in v), statistics.median(t for _, t in v)) for k, v in results.items()}
    lines = [
        f"| kind | median size | median save time |",
        f"| --- | --- | --- |",
        f"| full | {med['full'][0] / 1e6:.1f} MB | {med['full'][1]:.2f} s |",
        f"| delta ({args.touched:.0%} of keys touched) | {med['delta'][0] / 1e6:.1f} MB | {med['delta'][1]:.2f} s |",
        f"| full / delta | {med['full'][0] / med['delta'][0]:.1f}x | {med['full'][1] / med['delta'][1]:.1f}x |",
    ]
    print("\n".join(lines))
    if args.quick:
        return 0
    cpu = platform.processor() or platform.machine()
    from _results import record
    print("[delta] recorded in", record("checkpoint_delta", f"\n## Delta vs full checkpoints, {args.keys:,}-key table\n\n"
                f"`.venv/bin/python benchmarks/checkpoint_delta.py` ({os.cpu_count()} cores, {cpu}, "
                f"TensorFlow {tf.__version__}; shared machine, other jobs running). Table: dim {DIM}, Adam "
                f"(48 floats per key), {args.keys:,} keys; between saves {touched:,} keys are trained; "
                f"{args.reps} full/delta pairs interleaved on the same table, medians. A delta holds the touched "
                "rows with their slots and counters, the ids evicted since the last save, and the dense state; "
                "restoring the last full + delta gives the live table (checked).\n\n" + "\n".join(lines) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
