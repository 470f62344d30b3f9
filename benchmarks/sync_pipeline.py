"""SyncWorkers with JobConfig(pipeline=True) against without (issue 47's target: at least 1.15x steps/s on 2
workers, the same AUC): batch N+1's ids routed while batch N trains (docs/sync.md, "Pipelined steps").

    python benchmarks/sync_pipeline.py [--pairs 2] [--models functional,deepfm] [--steps 300] [--batch-size 512]

Two models, fp32, 2 SyncWorkers on this host, the same synthetic data, seed and initial weights in every run:
- functional: a DeepFM-sized functional model (one FusedEmbedding of dim 16 over the 26 Criteo fields, the 13
  dense features beside it, MLP 256-128-1, ttf Adam 1e-3) on ttf.distribute.Job (its ids come from a sub-model);
- deepfm: the CLI's subclassed DeepFM, `start_all.sh --sync --tiacc --fm [--pipeline]` (sync_speed.py's run; its
  ids come from a recording pass of its call).
Runs alternate ABBA (plain, pipelined, pipelined, plain, ...) so drift in the machine's load falls on both. Per run:
worker 0's steps/s after the job's warm-up steps and its CPU ms per step; AUC on the held-out fifth. Records
benchmarks/results/sync.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import sync_speed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
LABELS = {False: "plain", True: "pipelined"}


def worker(args):
    """One worker of the benchmark's job: prints its numbers as one JSON line."""
    import tensorflow as tf  # noqa: PLC0415 (the parent process never imports TensorFlow)

    import ttf  # noqa: PLC0415

    topology = ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts=args.hosts, task_type="worker",
                                                                 task_index=args.task_index))
    tf.keras.utils.set_random_seed(1)
    with topology.scope():
        ids, dense = tf.keras.Input([26], dtype=tf.int64, name="ids"), tf.keras.Input([13], name="dense")
        rows = ttf.FusedEmbedding(16, num_fields=26)(ids)
        x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(rows), dense])
        for width in (256, 128):
            x = tf.keras.layers.Dense(width, activation="relu", name=f"mlp_{width}")(x)
        model = tf.keras.Model({"ids": ids, "dense": dense}, tf.keras.layers.Dense(1, name="logit")(x))
        optimizer = ttf.optimizers.Adam(1e-3)
    config = ttf.distribute.JobConfig(batch_size=args.batch_size, steps=args.steps, log_every=100,
                                      pipeline=args.pipeline)
    job = ttf.distribute.Job(model, optimizer, topology=topology, config=config, log=lambda message: None)
    reader = ttf.data.Reader([args.data], "criteo")
    result = job.fit(reader, split="train")
    result.update(job.evaluate(reader, split="eval"))
    print("RESULT " + json.dumps(result), flush=True)


def run(model, pipeline, args, data):
    """One job of `model` (functional | deepfm), pipelined or not: {steps_per_sec, cpu_seconds_per_step, auc}."""
    if model == "deepfm":
        out = os.path.join(ROOT, "runs", f"sync_pipeline_{LABELS[pipeline]}.json")
        m = sync_speed.run(f"deepfm {LABELS[pipeline]}", args, out, flags=["--sync"], env=dict(os.environ),
                           train_args=["--pipeline"] * pipeline)
        return dict(m, steps_per_sec=m["global_steps_per_sec"])
    return run_functional(pipeline, args, data)


def run_functional(pipeline, args, data):
    hosts = ",".join(f"127.0.0.1:{port}" for port in _free_ports(2))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--hosts", hosts, "--data", data,
           "--steps", str(args.steps), "--batch-size", str(args.batch_size)] + (["--pipeline"] if pipeline else [])
    started = time.time()
    procs = [subprocess.Popen(cmd + ["--task-index", str(i)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"[sync-pipeline] {LABELS[pipeline]} failed:\n" + outs[0][-3000:] + outs[1][-3000:])
    m = json.loads(outs[0].split("RESULT ")[-1])
    print(f"[sync-pipeline] {LABELS[pipeline]:9} {m['steps_per_sec']:.2f} steps/s, "
          f"{m['cpu_seconds_per_step'] * 1000:.0f} CPU ms/step, AUC {m['auc']:.6f} ({time.time() - started:.0f} s, "
          f"load {os.getloadavg()[0]:.1f})", flush=True)
    return m


def _free_ports(n):
    import socket  # noqa: PLC0415

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=2, help="plain/pipelined pairs, run ABBA (default 2)")
    p.add_argument("--models", default="functional,deepfm", help="functional and/or deepfm (default both)")
    p.add_argument("--steps", type=int, default=300, help="global steps per run (default 300)")
    p.add_argument("--batch-size", type=int, default=512, help="batch per worker (default 512)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (default 200000)")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hosts", help=argparse.SUPPRESS)
    p.add_argument("--task-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    load_before = os.getloadavg()[0]
    data = subprocess.run([sys.executable, "-c", "import ttf; print(ttf.data.cached_synthetic(%r, %d, "
                           "ttf.data.Synthetic(vocab_per_field=100000))[0])" % (os.path.join(ROOT, "runs"), args.rows)],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()[-1]
    models = args.models.split(",")
    pairs = {model: [] for model in models}
    for i in range(args.pairs):
        order = [False, True] if i % 2 == 0 else [True, False]
        for model in models:
            pairs[model].append({pipeline: run(model, pipeline, args, data) for pipeline in order})
    lines = ["| model | pair | plain steps/s | pipelined steps/s | ratio | CPU ms/step (plain / pipelined) | "
             "AUC (plain / pipelined) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    summary = []
    for model in models:
        ratios = []
        for i, pair in enumerate(pairs[model], 1):
            a, b = pair[False], pair[True]
            ratios.append(b["steps_per_sec"] / a["steps_per_sec"])
            lines.append(f"| {model} | {i} | {a['steps_per_sec']:.2f} | {b['steps_per_sec']:.2f} | {ratios[-1]:.3f}x | "
                         f"{a['cpu_seconds_per_step'] * 1000:.0f} / {b['cpu_seconds_per_step'] * 1000:.0f} | "
                         f"{a['auc']:.6f} / {b['auc']:.6f} |")
        summary.append(f"{model}: median ratio of steps/s (pipelined / plain) over {len(ratios)} pairs "
                       f"**{statistics.median(ratios):.3f}x** (range {min(ratios):.3f}-{max(ratios):.3f}x).")
    table = "\n".join(lines) + "\n\n" + "  \n".join(summary)
    print(table)
    if not args.no_record:
        from _results import machine, record  # noqa: PLC0415

        entry = (f"## SyncWorkers pipelined vs plain, {args.pairs} ABBA pairs "
                 f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                 f"Command: `.venv/bin/python benchmarks/sync_pipeline.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {machine(ROOT)}; load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} "
                 f"at the end. Models: {args.models} (see the script's doc), fp32, {args.steps} global steps of {args.batch_size} "
                 f"examples per worker, 2 workers on this host.\n\n{table}\n")
        print(f"[sync-pipeline] recorded in {record('sync', entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
