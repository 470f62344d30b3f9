"""Step time during a save: training steps on a large table while a save runs in another thread.

A DynamicEmbedding (--dim, --optimizer) is grown to --keys keys. Then, --reps times, on the same
table and interleaved: --steps training steps (lookup + fused apply of --batch ids, Zipf-skewed
over the table plus a few new ids, as a PS worker's or the stream trainer's steps) with no save
running; the same steps while a full save runs in another thread (ttf.checkpoint.CheckpointManager,
as when a PS job's chief saves while its workers keep training); and while a delta save runs.
Steps during a save are the ones that started while the save's thread was alive. Reports the
median (and p90, max) step time of each phase and their ratios to the phase without a save
(issue 19's target: median during a save <= 1.5x without), and the process's CPU time per
step in each phase (the save thread's included). The save always finishes: the
training loop keeps stepping until it does.

    .venv/bin/python benchmarks/save_stall.py                       # 10M keys, dim 8, Adagrad (~2 GB)
    .venv/bin/python benchmarks/save_stall.py --keys 200000 --reps 1   # a quick check
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402
import tensorflow as tf  # noqa: E402


def fill(layer, optimizer, keys, chunk=1 << 20):
    for start in range(0, len(keys), chunk):
        ids = tf.constant(keys[start:start + chunk])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000_000, help="table size (default 10M)")
    p.add_argument("--dim", type=int, default=8, help="embedding dim (default 8)")
    p.add_argument("--optimizer", choices=["adagrad", "adam"], default="adagrad",
                   help="adagrad: 1 slot, adam: 2 slots per row (default adagrad)")
    p.add_argument("--batch", type=int, default=32768, help="ids per training step (default 32768)")
    p.add_argument("--steps", type=int, default=40, help="steps of the no-save phase (default 40)")
    p.add_argument("--reps", type=int, default=2, help="no-save / full / no-save / delta rounds (default 2)")
    p.add_argument("--dir", default=None, help="checkpoint folder (default: a temp dir, removed)")
    args = p.parse_args(argv)
    for name in ("keys", "dim", "batch", "steps", "reps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")

    directory = args.dir or tempfile.mkdtemp(prefix="ttf_save_stall_")
    rng = np.random.default_rng(0)
    layer = ttf.DynamicEmbedding(args.dim, seed=1)
    optimizer = ttf.optimizers.Adagrad(0.05) if args.optimizer == "adagrad" else ttf.optimizers.Adam(1e-3)
    t0 = time.perf_counter()
    fill(layer, optimizer, np.arange(args.keys, dtype=np.int64) * 7919 + 13)
    print(f"[stall] table of {int(layer.size()):,} keys filled in {time.perf_counter() - t0:.1f}s", flush=True)

    @tf.function
    def train_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(ids, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))

    next_new = [args.keys]

    def batch():
        # Zipf-skewed ranks over the table plus 1% never-seen ids (the table grows, as in training).
        ranks = np.minimum(rng.zipf(1.1, args.batch - args.batch // 100), args.keys) - 1
        new = np.arange(next_new[0], next_new[0] + args.batch // 100)
        next_new[0] += len(new)
        return tf.constant(np.concatenate([ranks, new]).astype(np.int64) * 7919 + 13)

    checkpoint = tf.train.Checkpoint(layer=layer, optimizer=optimizer)
    # full_every=2: the saves alternate full, delta, full, ...
    manager = ttf.checkpoint.CheckpointManager(checkpoint, directory, full_every=2, max_to_keep=1)
    for _ in range(3):  # warm-up (tracing)
        train_step(batch())

    def timed_steps(n=None, while_alive=None):
        times = []
        while (n is not None and len(times) < n) or (while_alive is not None and while_alive.is_alive()):
            ids = batch()
            start = time.perf_counter()
            train_step(ids)
            times.append(time.perf_counter() - start)
        return times

    phases = {"no save": [], "full save": [], "delta save": []}
    cpu_seconds = dict.fromkeys(phases, 0.0)  # the process's CPU time (every thread) during each phase
    save_seconds = {"full save": [], "delta save": []}
    for rep in range(args.reps):
        for kind in ("full save", "delta save"):
            cpu = time.process_time()
            phases["no save"] += timed_steps(n=args.steps)
            cpu_seconds["no save"] += time.process_time() - cpu
            step = int(optimizer.iterations.numpy())
            result = {}

            def save():
                start = time.perf_counter()
                result["path"] = manager.save(step)
                result["seconds"] = time.perf_counter() - start

            cpu = time.process_time()
            saver = threading.Thread(target=save)
            saver.start()
            times = timed_steps(while_alive=saver)
            saver.join()
            cpu_seconds[kind] += time.process_time() - cpu
            if "path" not in result:
                raise RuntimeError(f"the {kind} did not complete")
            want = "ckpt" if kind == "full save" else "delta"
            if not os.path.basename(result["path"]).startswith(want):
                raise RuntimeError(f"expected a {kind}, got {result['path']}")
            phases[kind] += times
            save_seconds[kind].append(result["seconds"])
            print(f"[stall] rep {rep}: {kind} {result['seconds']:.2f}s, {len(times)} steps during it, median "
                  f"{statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms", flush=True)
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)

    base = statistics.median(phases["no save"])
    print(f"[stall] {args.keys:,} keys, dim {args.dim}, {args.optimizer}, batch {args.batch}, {args.reps} reps")
    print("| phase | steps | median ms | p90 ms | max ms | median / no save | p90 / no save | max / no save | "
          "process CPU ms / step | save s (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base_p90, base_max = percentile(phases["no save"], 90), max(phases["no save"])
    for kind, times in phases.items():
        med = statistics.median(times)
        saves = f"{statistics.median(save_seconds[kind]):.2f}" if kind in save_seconds else "-"
        print(f"| {kind} | {len(times)} | {med * 1e3:.1f} | {percentile(times, 90) * 1e3:.1f} | "
              f"{max(times) * 1e3:.1f} | {med / base:.2f}x | {percentile(times, 90) / base_p90:.2f}x | "
              f"{max(times) / base_max:.2f}x | {cpu_seconds[kind] / len(times) * 1e3:.1f} | {saves} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
