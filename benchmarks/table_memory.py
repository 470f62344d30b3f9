"""Peak extra memory of a table's export (save) and import (restore), as a multiple of the
table's own memory; with --rows, the peak RSS a table of each row format adds.

Builds a table of --keys keys (dim 16, Adam slots: the layout of the training benchmark),
then for each of export and import resets the process's peak RSS (/proc/self/clear_refs),
runs the op, and reports peak RSS minus the RSS before it. The export's outputs stay alive
(a save holds them while writing), so they count as extra; the import's inputs were alive
before it, so they do not.

    .venv/bin/python benchmarks/table_memory.py --keys 10000000
    .venv/bin/python benchmarks/table_memory.py --keys 2000000 --json   # what the slow test runs
    .venv/bin/python benchmarks/table_memory.py --rows int8 --keys 3900000 --dim 32 --json

--rows FORMAT: in this process, the peak RSS (VmHWM) once a table of --keys keys, dim --dim,
stored as FORMAT, has been trained by Adam in batches of 65,536 new keys (one training update
each), minus the RSS before the table was made. Run one format per process.

--quality JOB: the AUC and logloss each row format reaches, against fp32's and against fp32's
seed-to-seed spread: one training job per (optimizer, row format, seed), run one after another,
each with TensorFlow on --threads threads (quality does not depend on speed; the jobs are
deterministic for a seed). JOB is one of QUALITY_JOBS below; prints one line a job, then one
table a optimizer.

    .venv/bin/python benchmarks/table_memory.py --quality criteo --optimizers adam,adagrad,ftrl,sgd

Exit codes: 0 done, 2 bad usage, 1 failure (e.g. not Linux: needs /proc/self/clear_refs).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("fp32", "bf16", "int8")
# --quality's jobs: the command before --optimizer/--lr/--seed/--table-rows. "main" is
# `start_all.sh --tiacc --fm` in one process: its default parameter-server cluster refuses
# --table-rows other than fp32 (models/train_flags.py), so --single, with train.py's flags after --.
QUALITY_JOBS = {
    "criteo": [".venv/bin/python", "models/train.py", "--tiacc", "--model", "fm", "--embedding-dim", "32",
               "--synthetic-rows", "80000", "--epochs", "1"],
    "avazu": [".venv/bin/python", "models/train.py", "--tiacc", "--model", "fm", "--embedding-dim", "32",
              "--schema", "avazu", "--synthetic-rows", "80000", "--epochs", "1"],
    "avazu-sample": [".venv/bin/python", "models/train.py", "--tiacc", "--model", "fm", "--embedding-dim", "32",
                     "--schema", "avazu", "--data", "sample", "--epochs", "1"],
    "main": ["./start_all.sh", "--tiacc", "--fm", "--single"],
}
# Learning rates a fp32 DeepFM learns well with in one epoch of the 80,000-row jobs (Adam: train.py's default).
LEARNING_RATES = {"adam": 0.001, "adagrad": 0.2, "ftrl": 0.2, "sgd": 0.05}
AUC_MARGIN, LOGLOSS_MARGIN = 0.002, 0.003  # issue 49's quality targets


def rss_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current RSS


def measure(num_keys, dim=16, batch=1_000_000):
    import numpy as np

    import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
    from ttf._ops import ops

    table = ops().ttf_embedding_table(dim=dim, initializer="uniform", seed=1, shared_name="table_memory")
    for start in range(0, num_keys, batch):
        keys = np.arange(start, min(start + batch, num_keys), dtype=np.int64) * 2654435761
        ops().ttf_table_find_or_insert(table, keys, dim=dim)
        ops().ttf_table_apply_adam(table, keys, np.ones((len(keys), dim), np.float32), 0.001, 0.9, 0.999, 1e-7, 1)
    del keys
    table_bytes = int(ops().ttf_table_stats(table).memory_bytes)

    def peak_extra(fn):
        before = rss_kib("VmRSS")
        reset_peak()
        result = fn()
        return result, (rss_kib("VmHWM") - before) * 1024

    exported, export_extra = peak_extra(lambda: ops().ttf_table_export(table))
    export_bytes = sum(t.numpy().nbytes for t in exported[:5])
    _, import_extra = peak_extra(lambda: ops().ttf_table_import(table, *exported))
    assert int(ops().ttf_table_size(table)) == num_keys
    return {"keys": num_keys, "dim": dim, "table_bytes": table_bytes, "export_output_bytes": export_bytes,
            "export_peak_extra_bytes": export_extra, "export_ratio": export_extra / table_bytes,
            "import_peak_extra_bytes": import_extra, "import_ratio": import_extra / table_bytes}


def measure_rows(rows, num_keys, dim, batch=65_536):
    """The peak RSS a table of `rows` adds (bytes), with its memory_bytes and per-key figures."""
    import numpy as np

    import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
    from ttf._ops import ops

    grads = np.full((batch, dim), 0.01, np.float32)
    before = rss_kib("VmRSS")
    reset_peak()
    table = ops().ttf_embedding_table(dim=dim, initializer="uniform", seed=1, rows=rows, shared_name="rows_memory")
    for step, start in enumerate(range(0, num_keys, batch), 1):
        keys = np.arange(start, min(start + batch, num_keys), dtype=np.int64) * 2654435761
        ops().ttf_table_apply_adam(table, keys, grads[:len(keys)], 0.001, 0.9, 0.999, 1e-7, step)
    assert int(ops().ttf_table_size(table)) == num_keys
    added = (rss_kib("VmHWM") - before) * 1024
    table_bytes = int(ops().ttf_table_stats(table).memory_bytes)
    return {"rows": rows, "keys": num_keys, "dim": dim, "peak_rss_added_bytes": added,
            "peak_rss_added_per_key": added / num_keys, "table_bytes": table_bytes,
            "table_bytes_per_key": table_bytes / num_keys}


def run_job(job, optimizer, lr, rows, seed, threads):
    """One training job's metrics (auc, logloss, ...), or None when it failed (its tail printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "metrics.json")
        flags = ["--table-rows", rows, "--seed", str(seed), "--metrics-out", out]
        cmd = QUALITY_JOBS[job] + ["--optimizer", optimizer, "--lr", str(lr)]
        cmd += ["--", *flags] if job == "main" else flags
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS=str(threads),
                   OMP_NUM_THREADS=str(threads))
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"[quality] FAILED: {' '.join(cmd)}\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-10:]))
            return None
        with open(out) as f:
            metrics = json.load(f)
    print(f"[quality] {job} {optimizer} lr {lr} {rows} seed {seed}: AUC {metrics['auc']:.4f}, "
          f"logloss {metrics['logloss']:.4f} ({time.time() - t0:.0f}s)", flush=True)
    return metrics


def quality_table(optimizer, results, seeds):
    """Markdown rows for one optimizer: each format's AUC / logloss by seed, and its paired difference from
    fp32 (mean, worst seed) beside fp32's seed-to-seed spread (max - min)."""
    fp32 = results["fp32"]
    spread = (max(fp32[s]["auc"] for s in seeds) - min(fp32[s]["auc"] for s in seeds),
              max(fp32[s]["logloss"] for s in seeds) - min(fp32[s]["logloss"] for s in seeds))
    lines = []
    for rows, by_seed in results.items():
        cells = " | ".join(f"{by_seed[s]['auc']:.4f} / {by_seed[s]['logloss']:.4f}" for s in seeds)
        if rows == "fp32":
            diff = f"spread {spread[0]:.4f} / {spread[1]:.4f}"
            verdict = ""
        else:
            d_auc = [by_seed[s]["auc"] - fp32[s]["auc"] for s in seeds]
            d_loss = [by_seed[s]["logloss"] - fp32[s]["logloss"] for s in seeds]
            diff = (f"{statistics.mean(d_auc):+.4f} / {statistics.mean(d_loss):+.4f} "
                    f"(worst {min(d_auc):+.4f} / {max(d_loss):+.4f})")
            met = min(d_auc) >= -AUC_MARGIN and max(d_loss) <= LOGLOSS_MARGIN
            verdict = "met" if met else "**missed**"
        lines.append(f"| {optimizer} | {rows} | {cells} | {diff} | {verdict} |")
    return lines


def quality(args):
    """--quality: every (optimizer, format, seed) job, one at a time; prints the tables. 0, or 1 on a failure."""
    seeds = [int(s) for s in args.seeds.split(",")]
    tables = []
    for optimizer in args.optimizers.split(","):
        lr = args.lr if args.lr is not None else LEARNING_RATES[optimizer]
        results = {rows: {} for rows in args.formats.split(",")}
        for i, seed in enumerate(seeds):  # formats in alternating order, seed by seed (ABBA)
            for rows in (list(results) if i % 2 == 0 else list(results)[::-1]):
                metrics = run_job(args.quality, optimizer, lr, rows, seed, args.threads)
                if metrics is None:
                    return 1
                results[rows][seed] = metrics
        tables += quality_table(f"{optimizer} {lr:g}", results, seeds)
    print(f"\n{args.quality}: {' '.join(QUALITY_JOBS[args.quality])}, "
          f"each with --optimizer O --lr LR --table-rows R --seed S; TensorFlow on {args.threads} thread(s)\n")
    print("| optimizer, lr | rows | " + " | ".join(f"seed {s}: AUC / logloss" for s in seeds)
          + " | vs fp32: mean (worst seed); fp32: seed spread | within 0.002 / 0.003 |")
    print("|---|---|" + "---|" * len(seeds) + "---|---|")
    print("\n".join(tables))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: %(prog)s --keys 10000000")
    parser.add_argument("--keys", type=int, default=10_000_000, help="keys in the table (default 10,000,000)")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    parser.add_argument("--rows", choices=["fp32", "bf16", "int8"], default=None,
                        help="measure the peak RSS a table of this row format adds instead")
    parser.add_argument("--dim", type=int, default=32, help="row width with --rows (default 32)")
    parser.add_argument("--quality", choices=sorted(QUALITY_JOBS), default=None,
                        help="measure each row format's AUC and logloss on this job instead (see above)")
    parser.add_argument("--optimizers", default="adam", help="with --quality: comma list of adam,adagrad,ftrl,sgd "
                        "(default adam)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="with --quality: comma list, fp32 first "
                        "(default fp32,bf16,int8)")
    parser.add_argument("--seeds", default="1,2,3", help="with --quality: comma list of seeds (default 1,2,3)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"with --quality: one learning rate for every optimizer (default {LEARNING_RATES})")
    parser.add_argument("--threads", type=int, default=1, help="with --quality: TensorFlow's threads (default 1)")
    args = parser.parse_args(argv)
    if args.quality:
        formats, optimizers = args.formats.split(","), args.optimizers.split(",")
        if formats[0] != "fp32" or not set(formats) <= set(FORMATS) or len(set(formats)) != len(formats):
            parser.error(f"--formats must be fp32 then any of bf16,int8, got {args.formats!r}")
        if not set(optimizers) <= set(LEARNING_RATES):
            parser.error(f"--optimizers must be a comma list of {','.join(LEARNING_RATES)}, got {args.optimizers!r}")
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        if not re.fullmatch(r"\d+(,\d+)*", args.seeds):
            parser.error(f"--seeds must be a comma list of integers, got {args.seeds!r}")
        return quality(args)
    if args.keys < 1:
        parser.error(f"--keys must be >= 1, got {args.keys}")
    if args.rows:
        r = measure_rows(args.rows, args.keys, args.dim)
        print(json.dumps(r) if args.json else
              f"{r['rows']}: {r['keys']:,} keys, dim {r['dim']} + Adam: peak RSS added "
              f"{r['peak_rss_added_bytes'] / (1 << 20):,.0f} MiB ({r['peak_rss_added_per_key']:.0f} bytes a key)")
        return 0
    try:
        r = measure(args.keys)
    except (OSError, RuntimeError) as err:
        print(f"table_memory: failed: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(r))
        return 0
    gib = 1 << 30
    print(f"table: {r['keys']:,} keys, dim {r['dim']} + Adam slots, {r['table_bytes'] / gib:.2f} GiB")
    print(f"export: peak extra {r['export_peak_extra_bytes'] / gib:.2f} GiB = {r['export_ratio']:.2f}x the table "
          f"(outputs {r['export_output_bytes'] / gib:.2f} GiB)")
    print(f"import: peak extra {r['import_peak_extra_bytes'] / gib:.2f} GiB = {r['import_ratio']:.2f}x the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
