"""The follower's prediction latency while deltas arrive every second, against none arriving
(issue 38's target: p99 with deltas at most 1.5x p99 without), and how fast it reacts.

A DeepFM (models/ctr.py, ttf tables, dim --dim) is trained on synthetic Criteo rows
(ttf.data.Synthetic); a Publisher writes its base and then --deltas deltas, one per training
step of --train-batch rows, into a staging folder, all before anything is timed (no trainer
competes for the 2 cores). The base version is copied into the followed folder and a
DeltaFollower(...).start() follows it (inotify, or polling: the result says which); delta 1 is
applied before any timing, as a serving follower has deltas since its base to read. Then
phases of --phase-seconds alternate, "none" and "deltas", --reps times each: in a "deltas"
phase one staged delta is renamed into the followed folder every --every seconds (what a
Publisher's rename does). This thread predicts batches of --batch rows back to back the whole
time: each prediction's latency goes to the phase it started in. Reported: p50 and p99 per
phase (pooled over repetitions; per_phase: each phase's own) and their ratio, and the follower's
reaction time (rename to applied: DeltaFollower.applied_at), p50 and p99.

Example:
  python benchmarks/follower_latency.py --rows int8
  python benchmarks/follower_latency.py --rows fp32 --train-batch 4096 --phase-seconds 10 --reps 3
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def say(what):
    print(f"[follower_latency] {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def stage(args, staging):
    """Trains and publishes a base and args.deltas deltas into `staging`; returns the model's
    held-out features for prediction and the delta sizes."""
    import ttf  # noqa: PLC0415
    from benchmarks._ctr import ManualClock, deepfm_trainer  # noqa: PLC0415
    rows = args.train_batch * (args.deltas + args.base_steps)
    sample = ttf.data.Synthetic(vocab_per_field=args.vocab).generate(rows + args.batch, seed=3)
    model, step = deepfm_trainer(args.dim)

    def train(i):
        part = slice(i * args.train_batch, (i + 1) * args.train_batch)
        step({"ids": sample["ids"][part], "dense": sample["dense"][part]}, sample["label"][part])

    model({"ids": sample["ids"][:1], "dense": sample["dense"][:1]}, training=False)
    dtype = {"fp32": tf.float32, "fp16": tf.float16, "int8": tf.int8}[args.rows]
    clock = ManualClock()
    publisher = ttf.serving.Publisher(model, staging, publish_every=1, dense_publish_every=1e9, row_dtype=dtype,
                                      clock=clock)
    for i in range(args.base_steps):
        train(i)
    publisher.publish()
    sizes = []
    for d in range(args.deltas):
        train(args.base_steps + d)
        clock.now += 1
        publisher.publish()
        manifest = json.load(open(os.path.join(ttf.serving.delta_folder(staging, 1, d + 1), "manifest.json")))
        sizes.append((sum(p["rows"] for p in manifest["parts"]), sum(p["bytes"] for p in manifest["parts"])))
    held = slice(rows, rows + args.batch)
    return {"ids": tf.constant(sample["ids"][held]), "dense": tf.constant(sample["dense"][held])}, sizes, int(
        model.sparse.size())


def wait_applied(follower, sequence, seconds=120):
    """Returns once `follower` has applied delta `sequence`; exits naming where it stopped if not within `seconds`."""
    limit = time.monotonic() + seconds
    while follower.sequence < sequence and time.monotonic() < limit:
        time.sleep(0.001)
    if follower.sequence < sequence:
        raise SystemExit(f"the follower is at delta {follower.sequence} of {sequence} after {seconds} s "
                         f"(refused: {follower.refused})")


def percentiles(values):
    values = np.asarray(values) * 1e3
    return {"count": len(values), "p50_ms": float(np.percentile(values, 50)),
            "p99_ms": float(np.percentile(values, 99))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", choices=["fp32", "fp16", "int8"], default="fp32", help="serving rows (default fp32)")
    p.add_argument("--dim", type=int, default=32, help="embedding dim (default 32)")
    p.add_argument("--vocab", type=int, default=200_000, help="values per field (default 200000)")
    p.add_argument("--train-batch", type=int, default=1024,
                   help="training rows per delta (default 1024: about 30k rows, 4 MB in fp32, at dim 32)")
    p.add_argument("--base-steps", type=int, default=50, help="training steps before the base (default 50)")
    p.add_argument("--batch", type=int, default=512, help="rows per prediction (default 512)")
    p.add_argument("--phase-seconds", type=float, default=10.0, help="seconds per phase (default 10)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each phase (default 3)")
    p.add_argument("--every", type=float, default=1.0, help="seconds between deltas in a 'deltas' phase (default 1)")
    p.add_argument("--watch", choices=["auto", "polling"], default="auto", help="the follower's watch (default auto)")
    p.add_argument("--poll-seconds", type=float, default=1.0, help="the follower's poll_seconds (default 1)")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    args.deltas = int(np.ceil(args.phase_seconds / args.every)) * args.reps + 1  # + the one applied before timing
    import ttf  # noqa: PLC0415

    scratch = tempfile.mkdtemp(prefix="follower_latency-")  # staging and live on one filesystem: renamed, not copied
    try:
        staging, live = os.path.join(scratch, "staging"), os.path.join(scratch, "live")
        say(f"staging a base and {args.deltas} deltas ({args.rows} rows, dim {args.dim})")
        features, sizes, keys = stage(args, staging)
        shutil.copytree(os.path.join(staging, "1"), os.path.join(live, "1"))
        os.makedirs(os.path.join(live, "deltas", "1"))
        follower = ttf.serving.DeltaFollower(live, watch=args.watch, poll_seconds=args.poll_seconds).start()
        # A follower serving has deltas applied since its base (an overlay to read first), so the "none" phases
        # are timed on one: delta 1 is applied before any timing. (Before, the first "none" phase read a base
        # alone, which skips the overlay, and lowered the baseline.)
        os.rename(ttf.serving.delta_folder(staging, 1, 1), ttf.serving.delta_folder(live, 1, 1))
        wait_applied(follower, 1)
        for _ in range(20):  # warm up
            follower.predict(features)
        latency = {"none": [], "deltas": []}
        per_phase = []  # (phase, p50 ms, p99 ms) of each phase in the order run
        cpu = {"none": 0.0, "deltas": 0.0}  # this process's CPU seconds (predictions, and the follower's applies)
        renamed, applied, sent, done = {}, {}, 1, threading.Event()

        def monitor():  # notes each sequence's applied_at (the follower keeps only the last)
            while not done.is_set():
                applied.setdefault(follower.sequence, follower.applied_at)
                time.sleep(0.0005)

        watcher = threading.Thread(target=monitor)
        watcher.start()
        say(f"{args.reps} x (none, deltas) phases of {args.phase_seconds} s; follower watches by {follower.watcher}")
        for _ in range(args.reps):
            for phase in ("none", "deltas"):
                start, cpu_start, first = time.monotonic(), time.process_time(), len(latency[phase])
                next_delta = start
                while time.monotonic() - start < args.phase_seconds:
                    if phase == "deltas" and time.monotonic() >= next_delta and sent < args.deltas:
                        sent += 1
                        renamed[sent] = time.time()
                        os.rename(ttf.serving.delta_folder(staging, 1, sent), ttf.serving.delta_folder(live, 1, sent))
                        next_delta += args.every
                    t0 = time.perf_counter()
                    follower.predict(features)
                    latency[phase].append(time.perf_counter() - t0)
                if phase == "deltas":  # the last delta applied before the quiet phase starts
                    wait_applied(follower, sent)
                cpu[phase] += time.process_time() - cpu_start
                these = percentiles(latency[phase][first:])
                per_phase.append([phase, round(these["p50_ms"], 2), round(these["p99_ms"], 2)])
        done.set()
        watcher.join()
        follower.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reaction = [applied[s] - renamed[s] for s in renamed if applied.get(s) is not None]
    result = {"rows": args.rows, "dim": args.dim, "table_keys": keys, "batch": args.batch, "watcher": follower.watcher,
              "deltas_applied": follower.sequence, "delta_rows_median": float(np.median([s[0] for s in sizes])),
              "delta_bytes_median": float(np.median([s[1] for s in sizes])),
              "latency": {phase: percentiles(values) for phase, values in latency.items()},
              "cpu_seconds": cpu, "phase_seconds": args.phase_seconds * args.reps,
              "reaction": percentiles(reaction), "per_phase": per_phase}
    result["p99_ratio"] = result["latency"]["deltas"]["p99_ms"] / result["latency"]["none"]["p99_ms"]
    result["p50_ratio"] = result["latency"]["deltas"]["p50_ms"] / result["latency"]["none"]["p50_ms"]
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
