"""Horovod sync vs parameter-server async vs one process, native and ttf, at the same examples seen.

Three shapes of the same DeepFM job (Adam), each a real `start_all.sh` run on the same
synthetic data, all seeing steps x 2 x batch examples:

  hvd:    2 Horovod ranks (horovodrun --gloo), batch B per rank, S synchronous steps
          (native: Keras embeddings through horovod's DistributedOptimizer, as plain Horovod
          users do; ttf: tables sharded over the ranks, alltoall of ids/rows/gradients)
  ps:     1 ps + 2 workers, asynchronous, batch B per worker step, 2 x S worker steps
  single: one process, batch 2 x B, S steps

Paths and shapes run interleaved, --repeats times; the table gives medians of examples/sec,
ttf vs native per shape, AUC and logloss on a held-out file. Then the ttf Horovod job with
--hvd-compression none|fp16|bf16 (once): bytes sent per step and rank, and AUC. Printed, recorded
in benchmarks/results/sync_vs_async.md with this command, drawn to benchmarks/sync_vs_async.png.

    .venv/bin/python benchmarks/sync_vs_async.py                 # about 25 minutes on 2 cores
    .venv/bin/python benchmarks/sync_vs_async.py --quick         # a smoke run, nothing recorded
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from compare import make_data  # noqa: E402

PATHS = {"native": [], "ttf": ["--tiacc"]}
SHAPES = ("hvd", "ps", "single")


def run(path, shape, args, files, compression=None):
    steps, batch = args.steps, args.batch_size
    shape_flags = {"hvd": ["--hvd"], "ps": [], "single": ["--single"]}[shape]
    if shape == "ps":
        steps *= 2
    if shape == "single":
        batch *= 2
    out = os.path.join(ROOT, "runs", f"hvdbench_{path}_{shape}_{compression or 'default'}.json")
    cmd = [os.path.join(ROOT, "start_all.sh"), "--fm", *PATHS[path], *shape_flags, "--optimizer", "adam",
           "--steps", str(steps), "--batch-size", str(batch), "--data", files["train"], "--eval-data",
           files["eval"], "--metrics-out", out]
    if compression:
        cmd += ["--hvd-compression", compression]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    label = f"{path:6} {shape:6} {compression or ''}"
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        print(f"[horovod-bench] {label} FAILED:\n{tail}", flush=True)
        return None
    metrics = json.load(open(out))
    metrics["examples_seen"] = steps * batch * (2 if shape == "hvd" else 1)  # hvd: 2 ranks per step
    print(f"[horovod-bench] {label}: {metrics['examples_per_sec']:9.0f} examples/s, AUC {metrics['auc']:.4f}, "
          f"{metrics['examples_seen']:,} examples ({time.time() - t0:.0f}s)", flush=True)
    return metrics


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="synchronous steps S (default 300)")
    p.add_argument("--batch-size", type=int, default=1024, help="B, per rank / worker step (default 1024)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training rows (default 400000)")
    p.add_argument("--vocab", type=int, default=1_000_000, help="synthetic ids per field (default 1M)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repetitions (default 2)")
    p.add_argument("--repeat-shapes", default="hvd,ps,single",
                   help="shapes run in every repetition; the others run once (default all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes; prints but records nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.rows, args.vocab, args.repeats = 20, 64, 4000, 1000, 1
    files = make_data(args.rows, max(args.rows // 8, 1000), args.vocab, os.path.join(ROOT, "runs", "compare_data"))
    results, compressed = {}, {}
    for rep in range(args.repeats):
        for shape in SHAPES:
            if rep > 0 and shape not in args.repeat_shapes.split(","):
                continue
            for path in PATHS:
                metrics = run(path, shape, args, files)
                if metrics:
                    results.setdefault((path, shape), []).append(metrics)
        if rep > 0:  # bytes per step do not vary between runs; AUC barely: one pass of each
            continue
        for compression in ("fp16", "bf16", "none"):
            metrics = run("ttf", "hvd", args, files, compression)
            if metrics:
                compressed.setdefault(compression, []).append(metrics)
    table = render(results, compressed)
    print(table)
    if not args.quick:
        record(args, table)
        draw(results, os.path.join(ROOT, "benchmarks", "sync_vs_async.png"))


def render(results, compressed):
    lines = ["| shape | path | examples/s | ttf vs native | examples seen | AUC | logloss | bf16 share | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        native = results.get(("native", shape))
        for path in PATHS:
            runs = results.get((path, shape))
            if not runs:
                lines.append(f"| {shape} | {path} | failed | | | | | | |")
                continue
            eps = median(runs, "examples_per_sec")
            ratio = f"{eps / median(native, 'examples_per_sec'):.2f}x" if native and path == "ttf" else "-"
            lines.append(f"| {shape} | {path} | {eps:.0f} | {ratio} | {runs[0]['examples_seen']:,} | "
                         f"{median(runs, 'auc'):.4f} | {median(runs, 'logloss'):.4f} | "
                         f"{median(runs, 'bf16_fraction'):.2f} | {len(runs)} |")
    lines += ["", "| ttf on 2 Horovod ranks, --hvd-compression | bytes sent per step and rank | vs none | examples/s "
              "| AUC | AUC - none |", "|---|---|---|---|---|---|"]
    base = compressed.get("none")
    for compression in ("none", "fp16", "bf16"):
        runs = compressed.get(compression)
        if not runs:
            lines.append(f"| {compression} | failed | | | | |")
            continue
        sent = median(runs, "wire_bytes_per_step")
        vs = f"{sent / median(base, 'wire_bytes_per_step'):.2f}" if base else "-"
        d_auc = f"{median(runs, 'auc') - median(base, 'auc'):+.4f}" if base else "-"
        lines.append(f"| {compression} | {sent:,.0f} | {vs} | {median(runs, 'examples_per_sec'):.0f} | "
                     f"{median(runs, 'auc'):.4f} | {d_auc} |")
    return "\n".join(lines)


def record(args, table):
    import tensorflow as tf
    import horovod
    from _results import machine, record

    command = "benchmarks/sync_vs_async.py " + " ".join(sys.argv[1:])
    entry = (f"\n## Horovod sync vs PS async vs one process (DeepFM, Adam)\n\n"
             f"Command: `.venv/bin/python {command.strip()}`  \n"
             f"Machine: {os.cpu_count()} cores, 1-minute load average at the end {os.getloadavg()[0]:.1f}, "
             f"{machine(ROOT)}; "
             f"TensorFlow {tf.__version__}, horovod {horovod.__version__} (Gloo), Python {platform.python_version()}.  \n"
             f"Data: synthetic Criteo schema, {args.rows:,} training rows, {args.vocab:,} ids per field; eval on a "
             f"separate file. Shapes repeated: {args.repeat_shapes} (the others ran once). Every shape sees {2 * args.steps * args.batch_size:,} examples: hvd 2 ranks x batch "
             f"{args.batch_size} x {args.steps} steps, ps 2 workers x batch {args.batch_size} x {2 * args.steps} "
             f"async worker steps, single batch {2 * args.batch_size} x {args.steps}. Medians of {args.repeats} "
             f"interleaved run(s); every path at its default --precision (ttf: auto).\n\n{table}\n\n"
             f"![examples/sec](../sync_vs_async.png)\n")
    print(f"[horovod-bench] recorded in {record('sync_vs_async', entry)}")


def draw(results, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    for i, path in enumerate(PATHS):
        values = [median(results[(path, s)], "examples_per_sec") if results.get((path, s)) else 0 for s in SHAPES]
        ax.bar([x + (i - 0.5) * width for x in range(len(SHAPES))], values, width, label=path)
    ax.set_xticks(range(len(SHAPES)), ["2 Horovod ranks\n(sync)", "1 ps + 2 workers\n(async)", "one process"])
    ax.set_ylabel("examples / sec")
    ax.set_title("DeepFM, Adam: native vs ttf (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"[horovod-bench] chart {png}")


if __name__ == "__main__":
    sys.exit(main())
