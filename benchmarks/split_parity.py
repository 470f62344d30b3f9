"""Split input against one process, over seeds: one epoch of DeepFM (fp32, Adam) as one process
on batch B, as 2 Horovod ranks and as 2 SyncWorkers on batch B/2 each with each reading its own
share of the data. Split input changes which examples share a step, so the two-worker runs are
not expected to equal one process; they should land within one process's spread over seeds
(issue 39, item 2), in AUC and in logloss (item 8: Horovod's logloss was found outside it).

    python benchmarks/split_parity.py [--seeds 1,2,3] [--rows 80000] [--vocab 10000] [--batch-size 1024]

Every run is a `start_all.sh` job under TTF_TF=2.16 (Horovod needs it; all three topologies
then share one TensorFlow), interleaved by seed; the evaluation is start_all's held-out
fifth of the same synthetic file. Records benchmarks/results/split_parity.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGIES = {"one": ["--single"], "horovod": ["--hvd", "--workers", "2"], "sync": ["--sync", "--workers", "2"]}
LABELS = {"one": "one process", "horovod": "Horovod, 2 ranks", "sync": "SyncWorkers, 2 workers"}


def worker_batch(name, args):
    """One process takes the global batch; each of the 2 workers half of it."""
    return args.batch_size if name == "one" else args.batch_size // 2


def run(name, seed, args, out):
    cmd = [os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", *TOPOLOGIES[name], "--precision", "fp32",
           "--epochs", "1", "--batch-size", str(worker_batch(name, args)), "--synthetic-rows", str(args.rows), "--metrics-out", out,
           "--", "--seed", str(seed), "--synthetic-vocab", str(args.vocab)]
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, TTF_TF="2.16"))
    if proc.returncode != 0:
        raise SystemExit(f"[split-parity] {LABELS[name]} seed {seed} failed:\n" + (proc.stdout + proc.stderr)[-3000:])
    with open(out) as f:
        metrics = json.load(f)
    print(f"[split-parity] {LABELS[name]:24} seed {seed}: keys {metrics['table_size']:,}, AUC {metrics['auc']:.4f}, "
          f"logloss {metrics['logloss']:.4f}, {metrics['examples_trained']:,} examples ({time.time() - started:.0f} s)",
          flush=True)
    return metrics


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="1,2,3", help="comma list of --seed values (default 1,2,3)")
    p.add_argument("--rows", type=int, default=80_000, help="synthetic rows, every 5th held out (default 80000)")
    p.add_argument("--vocab", type=int, default=10_000, help="synthetic values per field (default 10000, start_all's; "
                   "issue 39's item 8 had 898,242 keys in 80,000 rows: about --vocab 100000)")
    p.add_argument("--batch-size", type=int, default=1024, help="one process's batch; each worker takes half")
    p.add_argument("--topologies", default=",".join(TOPOLOGIES), help="comma list of one,horovod,sync (default all three)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    names = args.topologies.split(",")
    unknown = sorted(set(names) - set(TOPOLOGIES))
    if unknown:
        p.error(f"--topologies: unknown {unknown}; choose from {','.join(TOPOLOGIES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(os.path.join(ROOT, "runs"), exist_ok=True)
    results = {}
    for seed in seeds:
        for name in names:
            out = os.path.join(ROOT, "runs", f"split_parity_{names.index(name)}_{seed}.json")
            results.setdefault(name, []).append(run(name, seed, args, out))
    lines = ["| topology | batch per worker | keys (per seed) | AUC (per seed) | logloss (per seed) | "
             "logloss median - one process's |", "| --- | --- | --- | --- | --- | --- |"]
    base = statistics.median(m["logloss"] for m in results["one"]) if "one" in results else None
    for name in names:
        runs = results[name]
        diff = f"{statistics.median(m['logloss'] for m in runs) - base:+.4f}" if base is not None else "-"
        keys = " / ".join(f"{m['table_size']:,}" for m in runs)
        aucs = " / ".join(f"{m['auc']:.4f}" for m in runs)
        loglosses = " / ".join(f"{m['logloss']:.4f}" for m in runs)
        lines.append(f"| {LABELS[name]} | {worker_batch(name, args)} | {keys} | {aucs} | {loglosses} | {diff} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_record:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _results import machine, record  # noqa: PLC0415

        entry = (f"## Split input vs one process over seeds ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                 f"Command: `.venv/bin/python benchmarks/split_parity.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {machine(ROOT)}; TensorFlow 2.16 (TTF_TF=2.16), load average at the end "
                 f"{os.getloadavg()[0]:.1f}. DeepFM (`--tiacc --fm`), fp32, Adam 0.001, one epoch of the "
                 f"synthetic {args.rows:,} rows of {args.vocab:,} values per field (every 5th held out for the evaluation), seeds {args.seeds} "
                 f"(interleaved by seed).\n\n{table}\n")
        print(f"[split-parity] recorded in {record('split_parity', entry)}")


if __name__ == "__main__":
    sys.exit(main())
