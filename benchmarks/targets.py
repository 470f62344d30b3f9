"""Issue 10's targets, end to end: ttf at its default precision vs ttf fp32 vs a native
model whose embeddings cost nothing (8 hash buckets per field), DeepFM and Wide&Deep.

Each run is `models/train.py` in one process (Adam, the synthetic data of
benchmarks/compare.py, eval on its held-out file); the runs of one repetition are
interleaved (every configuration once, then again), and the table gives medians of global
steps/sec, the ratios the targets name, and AUC against fp32:

  ttf default (auto: loss with native bf16, else fp32) >= 1.5x native with 8 buckets per field, at batch 1024
  ttf default (auto) >= 1.3x ttf fp32, at batch 1024 and 4096
  AUC of ttf default within 0.002 of ttf fp32

Beside wall-clock steps/sec it reports this process's CPU time per step (every thread,
over the timed steps): on a machine shared with other jobs it is the steadier measure of
the work a step costs; the ratio in brackets is the CPU-time ratio.

    .venv/bin/python benchmarks/targets.py                     # about 25 minutes on 2 cores
    .venv/bin/python benchmarks/targets.py --quick             # smoke run, nothing recorded
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (same data files)


def _native_bf16():
    """What ttf's --precision auto checks (ttf.precision.cpu_has_native_bf16), without importing TF here."""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "avx512_bf16" in flags or "amx_bf16" in flags


ROOT = compare.ROOT
TRAIN = os.path.join(ROOT, "models", "train.py")
# name -> extra train.py flags
# ttf's default, --precision auto, is "loss" on a CPU with native bf16 and fp32 elsewhere:
# both are run, and the table says which one is the default on this machine.
PATHS = {"native, 8 buckets": ["--native-buckets", "8"], "ttf fp32": ["--tiacc", "--precision", "fp32"],
         "ttf loss (bf16 while calm)": ["--tiacc", "--precision", "loss"]}


def run(model, path, batch, steps, files, out, extra=()):
    cmd = [sys.executable, TRAIN, "--model", model, *PATHS[path], *extra, "--steps", str(steps), "--batch-size",
           str(batch), "--data", files["train"], "--eval-data", files["eval"], "--log-every", str(max(steps // 4, 1)),
           "--metrics-out", out]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        print(f"[targets] {model} {path} {batch} FAILED:\n" + "\n".join(proc.stdout.splitlines()[-5:] + proc.stderr.splitlines()[-10:]))
        return None
    metrics = json.load(open(out))
    print(f"[targets] {model} {path:20} batch {batch}: {metrics['global_steps_per_sec']:.2f} steps/s, "
          f"AUC {metrics['auc']:.4f}, bf16 {metrics['bf16_fraction']:.2f} ({time.time() - t0:.0f}s)", flush=True)
    return metrics


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="fm,wdl", help="(default fm,wdl)")
    p.add_argument("--batches", default="1024,4096", help="(default 1024,4096; native runs at the first only)")
    p.add_argument("--examples", type=int, default=300 * 1024,
                   help="training examples per run: steps = examples / batch (default 307200)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repetitions (default 2)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training rows (default 400000)")
    p.add_argument("--quick", action="store_true", help="tiny sizes; prints but records nothing")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        args.examples, args.repeats, args.rows, batches = 20 * 64, 1, 4000, [64]
    files = compare.make_data(args.rows, max(args.rows // 8, 1000), 1_000_000, os.path.join(ROOT, "runs", "compare_data"))
    configs = [(m, b, path) for m in args.models.split(",") for b in batches for path in PATHS
               if not (path.startswith("native") and b != batches[0])]
    results = {}
    for _ in range(args.repeats):
        for model, batch, path in configs:
            out = os.path.join(ROOT, "runs", f"targets_{model}_{batch}_{path.split()[0]}_{path.split()[1][:4]}.json")
            metrics = run(model, path, batch, max(args.examples // batch, 10), files, out)
            if metrics:
                results.setdefault((model, batch, path), []).append(metrics)
    table = render(results, configs)
    print(table)
    if not args.quick:
        entry = (f"\n## Issue 10 targets: ttf default precision vs ttf fp32 vs native with 8 buckets per field\n\n"
                 f"Command: `.venv/bin/python benchmarks/targets.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {os.cpu_count()} cores, native bf16 {_native_bf16()}, load average "
                 f"at the end {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min); "
                 f"Python {platform.python_version()}. One process per run, Adam lr 0.001, {args.examples:,} training "
                 f"examples per run, synthetic data of compare.py; medians of {args.repeats} interleaved repetitions.\n\n"
                 f"{table}\n")
        from _results import record
        print(f"[targets] recorded in {record('targets', entry)}")
    return 0


def render(results, configs):
    import ttf  # noqa: F401  (after the runs: the parent process stays light)
    from ttf.precision import cpu_has_native_bf16

    default = "ttf loss (bf16 while calm)" if cpu_has_native_bf16() else "ttf fp32"
    med = {k: {m: statistics.median(r[m] for r in v)
               for m in ("global_steps_per_sec", "auc", "bf16_fraction", "cpu_seconds_per_step")}
           for k, v in results.items()}
    lines = ["| model | batch | path | global steps/s | CPU ms/step | vs native 8 buckets: wall (CPU) |"
             " vs ttf fp32: wall (CPU) | AUC | AUC - ttf fp32 | bf16 share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, batch, path in configs:
        m = med.get((model, batch, path))
        if m is None:
            lines.append(f"| {model} | {batch} | {path} | failed | | | | | |")
            continue
        native = med.get((model, batch, "native, 8 buckets"))
        fp32 = med.get((model, batch, "ttf fp32"))
        vs = lambda ref: (f"{m['global_steps_per_sec'] / ref['global_steps_per_sec']:.2f}x "  # noqa: E731
                          f"({ref['cpu_seconds_per_step'] / m['cpu_seconds_per_step']:.2f}x)") if ref else "-"
        d_auc = f"{m['auc'] - fp32['auc']:+.4f}" if fp32 else "-"
        lines.append(f"| {model} | {batch} | {path} | {m['global_steps_per_sec']:.2f} | "
                     f"{1e3 * m['cpu_seconds_per_step']:.1f} | {vs(native)} | {vs(fp32)} | "
                     f"{m['auc']:.4f} | {d_auc} | {m['bf16_fraction']:.2f} |")
    lines.append(f"\nttf's default precision (auto) on this machine: **{default}** "
                 f"(native bf16 in the CPU flags: {cpu_has_native_bf16()}).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
