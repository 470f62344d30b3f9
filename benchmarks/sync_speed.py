"""SyncWorkers against Horovod, same job, same TensorFlow: examples/s of 2 workers on this host (issue 39's
speed target: SyncWorkers at least 0.9x Horovod's).

    python benchmarks/sync_speed.py [--pairs 4] [--steps 300] [--batch-size 512]

Every run is `start_all.sh --tiacc --fm --hvd|--sync --workers 2` under TTF_TF=2.16 (Horovod needs it), fp32,
the same synthetic data and seed. The runs alternate ABBA (hvd sync sync hvd ...), so drift in the machine's
load falls on both. Reported per run: global steps/s and examples/s after start_all's warm-up steps, CPU
seconds per step of rank 0's process, and bytes on the wire per step; then the median of the per-pair ratios.
Records benchmarks/results/sync.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIMES = {"horovod": "--hvd", "sync": "--sync"}


def run(name, args, out, flags=None, env=None, train_args=()):
    """One `start_all.sh --tiacc --fm --workers 2` job, fp32 (flags: RUNTIMES[name] unless given; env: TTF_TF=2.16
    unless given; train_args: models/train.py's own flags); returns its metrics with wall_seconds."""
    cmd = [os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", *(flags or [RUNTIMES[name]]), "--workers", "2",
           "--precision", "fp32", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--synthetic-rows", str(args.rows), "--metrics-out", out] + (["--", *train_args] if train_args else [])
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env or dict(os.environ, TTF_TF="2.16"))
    if proc.returncode != 0:
        raise SystemExit(f"[sync-speed] {name} failed:\n" + (proc.stdout + proc.stderr)[-3000:])
    with open(out) as f:
        m = json.load(f)
    m["wall_seconds"] = time.time() - started
    print(f"[sync-speed] {name:8} {m['global_steps_per_sec']:.2f} steps/s, {m['examples_per_sec']:,.0f} examples/s, "
          f"{m['cpu_seconds_per_step'] * 1000:.0f} CPU ms/step, {m['wire_bytes_per_step']:,.0f} B/step, "
          f"AUC {m['auc']:.4f} ({m['wall_seconds']:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    return m


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=4, help="hvd/sync pairs, run ABBA (default 4)")
    p.add_argument("--steps", type=int, default=300, help="global steps per run (default 300)")
    p.add_argument("--batch-size", type=int, default=512, help="batch per worker (default 512)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (default 200000)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(os.path.join(ROOT, "runs"), exist_ok=True)
    pairs = []
    for i in range(args.pairs):
        order = ["horovod", "sync"] if i % 2 == 0 else ["sync", "horovod"]
        pair = {name: run(name, args, os.path.join(ROOT, "runs", f"sync_speed_{name}_{i}.json")) for name in order}
        pairs.append(pair)
    lines = ["| pair | Horovod steps/s | SyncWorkers steps/s | ratio | CPU ms/step (Horovod / sync) | "
             "wire bytes/step (Horovod / sync) | AUC (Horovod / sync) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    ratios = []
    for i, pair in enumerate(pairs, 1):
        h, s = pair["horovod"], pair["sync"]
        ratios.append(s["global_steps_per_sec"] / h["global_steps_per_sec"])
        lines.append(f"| {i} | {h['global_steps_per_sec']:.2f} | {s['global_steps_per_sec']:.2f} | {ratios[-1]:.2f}x | "
                     f"{h['cpu_seconds_per_step'] * 1000:.0f} / {s['cpu_seconds_per_step'] * 1000:.0f} | "
                     f"{h['wire_bytes_per_step']:,.0f} / {s['wire_bytes_per_step']:,.0f} | "
                     f"{h['auc']:.4f} / {s['auc']:.4f} |")
    cpu = statistics.median(p["horovod"]["cpu_seconds_per_step"] / p["sync"]["cpu_seconds_per_step"] for p in pairs)
    summary = (f"Median ratio of steps/s (sync / Horovod) over {len(pairs)} pairs: **{statistics.median(ratios):.2f}x** "
               f"(range {min(ratios):.2f}-{max(ratios):.2f}x); rank 0's CPU per step, Horovod / sync: {cpu:.2f}x.")
    table = "\n".join(lines) + "\n\n" + summary
    print(table)
    if not args.no_record:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _results import machine, record  # noqa: PLC0415

        entry = (f"## SyncWorkers vs Horovod, {len(pairs)} ABBA pairs ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                 f"Command: `.venv/bin/python benchmarks/sync_speed.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {machine(ROOT)}; TensorFlow 2.16 (TTF_TF=2.16), load average at the end "
                 f"{os.getloadavg()[0]:.1f}. DeepFM (`--tiacc --fm`), fp32, Adam, {args.steps} global steps of "
                 f"{args.batch_size} examples per worker, 2 workers on this host.\n\n{table}\n")
        print(f"[sync-speed] recorded in {record('sync', entry)}")


if __name__ == "__main__":
    sys.exit(main())
