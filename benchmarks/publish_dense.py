"""Issue 46 item 4: what a served prediction does when the dense weights reach serving, with
the dense part every 300 s (the earlier default) and with every delta in which they changed
(the default now), and how big the dense part is next to a delta's rows.

One process: a DeepFM with ttf tables (Adam) trains on ttf.data.DriftingSynthetic rows (a
warm-up of --warmup-hours, then --steps steps of --batch rows), a ttf.serving.Publisher
publishes a delta after every step (a simulated clock: one step = one second, publish_every
1 s, as the issue's job), and a DeltaFollower in the same process applies each delta. After
each delta, --probe held-out rows are predicted by the follower (served) and by the trainer
(live). Reported per policy: the mean and largest |served - live| probability over all
deltas, and at each delta carrying dense weights the served probabilities' jump (mean, max,
and the probe row that moved most, as the issue's 0.357 -> 0.508); the bytes of a delta's
rows (median) and of its dense part.

    .venv/bin/python benchmarks/publish_dense.py                   # both policies, ~3 min on 2 cores
    .venv/bin/python benchmarks/publish_dense.py --steps 900 --record
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ttf  # noqa: E402
from benchmarks._ctr import ManualClock, deepfm_trainer  # noqa: E402
from benchmarks._results import machine, record  # noqa: E402
from ttf.data.producer import write_part  # noqa: E402


def batches(paths, batch, seed):
    return iter(ttf.data.Reader(paths, "criteo").dataset(batch, shuffle=True, seed=seed))


def run(args, files, probe, dense_every, folder):
    """One policy: returns its figures (see the module docstring)."""
    tf.keras.utils.set_random_seed(args.seed)
    model, train_step = deepfm_trainer(args.embedding_dim, seed=args.seed, lr=args.lr)

    live = tf.function(lambda features: tf.sigmoid(model.logits(features, training=False)))
    for features, labels in batches(files["warmup"], args.batch, args.seed):
        train_step(features, labels)
    model(probe)  # the export's input signature
    clock = ManualClock()
    publisher = ttf.serving.Publisher(model, folder, publish_every=1, dense_publish_every=dense_every, clock=clock)
    publisher.publish()
    follower = ttf.serving.DeltaFollower(folder)
    stream = batches(files["stream"], args.batch, args.seed)
    gaps, jumps, row_bytes, dense_bytes = [], [], [], []
    served_before = np.reshape(follower.predict(probe)["probability"].numpy(), [-1])
    for _ in range(args.steps):
        features, labels = next(stream)
        train_step(features, labels)
        clock.now += 1
        version, sequence = publisher.maybe_publish()
        follower.sync()
        assert (follower.version, follower.sequence) == (version, sequence) and follower.refused is None
        manifest = ttf.serving.delta_folder(folder, version, sequence)
        with open(os.path.join(manifest, "manifest.json")) as f:
            written = json.load(f)
        row_bytes.append(sum(p["bytes"] for p in written["parts"]))
        served = np.reshape(follower.predict(probe)["probability"].numpy(), [-1])
        gaps.append(np.abs(served - np.reshape(live(probe).numpy(), [-1])))
        if written["dense"]:
            dense_bytes.append(written["dense"]["bytes"])
            jump = np.abs(served - served_before)
            worst = int(np.argmax(jump))
            jumps.append((float(jump.mean()), float(jump.max()), float(served_before[worst]), float(served[worst])))
        served_before = served
    gaps = np.stack(gaps)
    return {"dense_every": dense_every, "deltas": args.steps, "dense_deltas": len(dense_bytes),
            "gap_mean": float(gaps.mean()), "gap_max": float(gaps.max()),
            "gap_mean_worst_delta": float(gaps.mean(axis=1).max()),
            "jump_mean": max((j[0] for j in jumps), default=0.0), "jump_max": max((j[1] for j in jumps), default=0.0),
            "worst_row": max(jumps, key=lambda j: j[1])[2:] if jumps else None, "row_bytes": statistics.median(row_bytes),
            "dense_bytes": dense_bytes[0] if dense_bytes else 0,
            "dense_variables": len(model.variables),
            "dense_params": int(sum(np.prod(v.shape) for v in model.variables))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=900, help="steps (= deltas = simulated seconds) per policy (900)")
    p.add_argument("--old-dense-every", type=float, default=300.0, help="the earlier default, seconds (300)")
    p.add_argument("--batch", type=int, default=512, help="rows per step (512)")
    p.add_argument("--warmup-hours", type=int, default=2, help="simulated hours trained before the base (2)")
    p.add_argument("--rows-per-hour", type=int, default=50_000, help="(50000)")
    p.add_argument("--probe", type=int, default=2048, help="held-out rows predicted after each delta (2048)")
    p.add_argument("--embedding-dim", type=int, default=16, help="(16)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (0.001)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", action="store_true", help="add an entry to benchmarks/results/online.md")
    args = p.parse_args(argv)
    command = "benchmarks/publish_dense.py " + " ".join(argv if argv is not None else sys.argv[1:])
    work = tempfile.mkdtemp(prefix="ttf_publish_dense_")
    started = time.time()
    try:
        stream = ttf.data.DriftingSynthetic(vocab_per_field=20_000)
        hours = args.warmup_hours + -(-args.steps * args.batch // args.rows_per_hour) + 1
        paths = [write_part(work, stream, hour, 0, args.rows_per_hour, seed=args.seed)[0] for hour in range(hours)]
        files = {"warmup": paths[: args.warmup_hours], "stream": paths[args.warmup_hours:-1]}
        probe, _ = next(iter(ttf.data.Reader(paths[-1:], "criteo").dataset(args.probe, shuffle=False)))
        results = [run(args, files, probe, every, os.path.join(work, f"publish_{i}"))
                   for i, every in enumerate((args.old_dense_every, 0.0))]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = ["| dense_every | deltas (dense) | served - live, mean | served - live, max | worst delta's mean | "
             "jump at a dense delta: mean | max | the row that moved most | rows / delta (median) | dense part |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['dense_every']:g} s | {r['deltas']} ({r['dense_deltas']}) | {r['gap_mean']:.4f} | "
                     f"{r['gap_max']:.3f} | {r['gap_mean_worst_delta']:.4f} | {r['jump_mean']:.4f} | "
                     f"{r['jump_max']:.3f} | {r['worst_row'][0]:.3f} -> {r['worst_row'][1]:.3f} | "
                     f"{r['row_bytes'] / 1024:.0f} KiB | {r['dense_bytes'] / 1024:.0f} KiB "
                     f"({r['dense_params']:,} floats) |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        load = open("/proc/loadavg").read().split()[:3]
        df = subprocess.run(["df", "-h", ROOT], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        entry = (f"## Served predictions at a dense update: every 300 s vs with every delta ({time.strftime('%Y-%m-%d')})\n\n"
                 f"Command: `.venv/bin/python {command}` ({time.time() - started:.0f} s). DeepFM (ttf, Adam, lr "
                 f"{args.lr:g}, dim {args.embedding_dim}, batch {args.batch}), ttf.data.DriftingSynthetic rows, "
                 f"{args.warmup_hours} h warm-up, then one delta per step (publish_every 1 simulated s); "
                 f"{args.probe} held-out rows probed after each delta. Machine: {machine(ROOT)}; `df -h`: {df}; "
                 f"load average {' '.join(load)} (shared; the figures are not timings).\n\n{table}\n")
        print("recorded in", record("online", entry))


if __name__ == "__main__":
    main()
