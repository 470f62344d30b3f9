"""Steps/sec and accuracy of DeepFM and Wide&Deep: native TensorFlow vs TFRA vs ttf.

Same synthetic data (Criteo schema, Zipf keys, a planted logistic model), same steps, batch,
optimizer and cluster shape for every path; each run is a real `start_all.sh` job (one
process with --single, or the local parameter-server cluster: 1 ps + 2 workers). Paths run
interleaved, --repeats times; the table gives medians of global steps/sec, the ratio to
native and to TFRA, AUC (and its difference to native) and logloss on a held-out file. It
is printed, recorded in benchmarks/results/compare.md with this command, and drawn to
benchmarks/compare.png.

    .venv/bin/python benchmarks/compare.py                       # full: about 20 minutes
    .venv/bin/python benchmarks/compare.py --quick               # a smoke run (tiny), nothing recorded
    .venv/bin/python benchmarks/compare.py --optimizers adagrad --shapes single --models fm
    .venv/bin/python benchmarks/compare.py --paths ttf --baseline /work/old   # ttf now vs another checkout
    .venv/bin/python benchmarks/compare.py --paths ttf --baseline-commit d330290 --shapes single,cluster,sync \
        --models fm --optimizers adam --repeats 5 --record-as runtime_shape   # 5 pairs, ABBA

--baseline DIR adds the path "ttf@REV": the same ttf job run from DIR's start_all.sh (a git
checkout of another commit, its ops built: `setup.py build_ext --inplace` there), interleaved
with the others; the table's "vs baseline" columns are this checkout over it, per pair.
--baseline-commit REV makes that checkout itself: a git worktree of REV in runs/baseline-REV
with its own ./.venv and op build (scripts/setup_env.sh there, a few minutes the first time).
The shape "sync" is start_all.sh --sync (2 synchronous workers, the ttf paths only). Each run's
CPU time is its whole job's (every process start_all.sh waited for: user + system seconds).
"""
import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PATHS = {"native": [], "tfra": ["--tfra"], "ttf": ["--tiacc"]}  # name -> start_all.sh flags
# DeepRec's modelzoo DeepFM (modelzoo/deepfm/README.md): Criteo Kaggle, batch 512, on an
# ecs.hfg7.2xlarge (8 vCPUs = 4 physical cores of a Xeon Platinum 8369HC).
DEEPREC = {"cores": 4, "batch": 512, "rows": [("DeepRec: stock TF 1.15.5, fp32", 18848.64),
                                              ("DeepRec: DeepRec + oneDNN, fp32+bf16", 34627.46)]}


def make_data(rows, eval_rows, vocab, out_dir):
    import ttf

    os.makedirs(out_dir, exist_ok=True)
    files, best = {}, {}
    for name, n, seed in (("train", rows, 1), ("eval", eval_rows, 2)):
        path = os.path.join(out_dir, f"{name}_{n}_{vocab}.tsv")
        if not os.path.exists(path):
            print(f"[compare] writing {n:,} synthetic rows to {path}", flush=True)
            best[name] = ttf.data.write_synthetic_criteo(path + ".tmp", n, ttf.data.SyntheticCriteo(vocab), seed=seed,
                                                         progress=False)
            os.replace(path + ".tmp", path)
        files[name] = path
    return files


def learning_rate(optimizer, args):
    """Adam at its usual 1e-3; Adagrad at --adagrad-lr (default 0.5: at 1e-3 nothing learns, at 0.05-0.2 AUC stays below 0.78 in 300 steps)."""
    return args.adagrad_lr if optimizer == "adagrad" else 1e-3


def baseline_checkout(rev):
    """A git worktree of `rev` in runs/baseline-REV, its venv made and its ops built (once)."""
    where = os.path.join(ROOT, "runs", f"baseline-{rev}")
    if not os.path.exists(os.path.join(where, "start_all.sh")):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", where, rev], check=True)
    print(f"[compare] setting up {where} (its own .venv and op build)", flush=True)
    subprocess.run([os.path.join(where, "scripts", "setup_env.sh")], cwd=where, check=True)
    return where


def job_cpu_seconds():
    """User + system CPU seconds of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(path, model, optimizer, shape, args, files, out, extra=()):
    root, flags = (args.baseline, PATHS["ttf"]) if path.startswith("ttf@") else (ROOT, PATHS[path])
    cmd = [os.path.join(root, "start_all.sh"), "--fm" if model == "fm" else "--wdl", *flags, *extra,
           "--optimizer", optimizer, "--lr", str(learning_rate(optimizer, args)),
           "--steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--data", files["train"], "--eval-data", files["eval"], "--metrics-out", out]
    if shape in ("single", "sync"):
        cmd.append(f"--{shape}")
    t0, cpu0, load = time.time(), job_cpu_seconds(), os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    cpu = job_cpu_seconds() - cpu0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        print(f"[compare] {model}/{path}/{optimizer}/{shape} {' '.join(extra)} FAILED:\n{tail}", flush=True)
        return None
    metrics = dict(json.load(open(out)), job_cpu_seconds=cpu, load=load)
    print(f"[compare] {model:3} {path:6} {optimizer:7} {shape:7} {' '.join(extra)}: "
          f"{metrics['global_steps_per_sec']:7.2f} steps/s, {cpu:6.1f} CPU s, "
          f"AUC {metrics['auc']:.4f}, logloss {metrics['logloss']:.4f} ({time.time() - t0:.0f}s)", flush=True)
    return metrics


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="fm,wdl", help="comma list of fm,wdl (default both)")
    p.add_argument("--optimizers", default="adam,adagrad", help="comma list (default adam,adagrad)")
    p.add_argument("--shapes", default="single,cluster",
                   help="single, cluster (1 ps + 2 workers) and/or sync (2 synchronous workers, ttf paths only)")
    p.add_argument("--steps", type=int, default=300, help="global steps per run (default 300)")
    p.add_argument("--batch-size", type=int, default=1024, help="per step and worker (default 1024)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training rows (default 400000)")
    p.add_argument("--vocab", type=int, default=1_000_000, help="synthetic ids per field (default 1M)")
    p.add_argument("--adagrad-lr", type=float, default=0.5,
                   help="Adagrad's learning rate (default 0.5: AUC 0.786 in 300 steps; Adam runs at 0.001)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved repetitions per configuration (default 1)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {','.join(PATHS)} (default all)")
    p.add_argument("--baseline", metavar="DIR",
                   help="another checkout of ttf (ops built): adds its ttf job as the path ttf@REV, interleaved")
    p.add_argument("--baseline-commit", metavar="REV",
                   help="as --baseline, from a git worktree of REV made (and set up) in runs/baseline-REV")
    p.add_argument("--record-as", default="compare", metavar="TOPIC",
                   help="the results file: benchmarks/results/TOPIC.md (default compare)")
    p.add_argument("--quick", action="store_true", help="tiny sizes; prints but records nothing")
    args = p.parse_args(argv)
    paths = args.paths.split(",")
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        p.error(f"--paths: unknown {unknown}; choose from {','.join(PATHS)}")
    if args.baseline_commit:
        args.baseline = baseline_checkout(args.baseline_commit)
    if args.baseline:
        if not os.path.exists(os.path.join(args.baseline, "start_all.sh")):
            p.error(f"--baseline {args.baseline}: no start_all.sh there; give a checkout of ttf")
        rev = subprocess.run(["git", "-C", args.baseline, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        paths.append(f"ttf@{rev}")
    if args.quick:
        args.steps, args.batch_size, args.rows, args.vocab, args.repeats = 20, 64, 4000, 1000, 1
    files = make_data(args.rows, max(args.rows // 8, 1000), args.vocab, os.path.join(ROOT, "runs", "compare_data"))
    results = {}
    configs = list(itertools.product(args.optimizers.split(","), args.shapes.split(","), args.models.split(",")))
    for rep in range(args.repeats):
        for optimizer, shape, model in configs:
            for path in paths if rep % 2 == 0 else paths[::-1]:  # ABBA: no path always runs first
                if shape == "sync" and not path.startswith("ttf"):
                    continue  # start_all.sh --sync runs the ttf path only
                out = os.path.join(ROOT, "runs", f"compare_{model}_{path}_{optimizer}_{shape}.json")
                metrics = run(path, model, optimizer, shape, args, files, out)
                if metrics:
                    metrics["repeat"] = rep  # pairs with the baseline's run of the same repetition
                    results.setdefault((optimizer, shape, model, path), []).append(metrics)
    table = render(results, configs, paths)
    print(table)
    print(deeprec_reference())
    if not args.quick:
        record(args, table, paths, [r["load"] for runs in results.values() for r in runs])
        if not args.baseline:  # compare.png is the native / TFRA / ttf chart
            draw(results, configs, paths, os.path.join(ROOT, "benchmarks", "compare.png"))


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def render(results, configs, paths):
    cores = os.cpu_count()
    baseline = next((path for path in paths if path.startswith("ttf@")), None)
    lines = ["| optimizer | shape | model | path | global steps/s | examples/s per core | vs native | vs TFRA | AUC |"
             " AUC - native | logloss | bf16 share | job CPU s |"
             + (" steps/s vs baseline (median of pairs, range) | CPU s vs baseline |" if baseline else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if baseline else "")]
    for optimizer, shape, model in configs:
        native, tfra = results.get((optimizer, shape, model, "native")), results.get((optimizer, shape, model, "tfra"))
        for path in paths:
            runs = results.get((optimizer, shape, model, path))
            base = results.get((optimizer, shape, model, baseline))
            if not runs:
                lines.append(f"| {optimizer} | {shape} | {model} | {path} | failed |" + " |" * (8 + 2 * bool(baseline)))
                continue
            sps, auc = median(runs, "global_steps_per_sec"), median(runs, "auc")
            vs = lambda ref: f"{sps / median(ref, 'global_steps_per_sec'):.2f}x" if ref else "-"  # noqa: E731
            d_auc = f"{auc - median(native, 'auc'):+.4f}" if native else "-"
            per_core = median(runs, "examples_per_sec") / cores
            lines.append(f"| {optimizer} | {shape} | {model} | {path} | {sps:.2f} | {per_core:,.0f} | {vs(native)} | "
                         f"{vs(tfra)} | "
                         f"{auc:.4f} | {d_auc} | {median(runs, 'logloss'):.4f} | "
                         f"{median(runs, 'bf16_fraction'):.2f} | {median(runs, 'job_cpu_seconds'):.1f} |"
                         + (f" {vs_baseline(runs, base)} | {vs_baseline(runs, base, 'job_cpu_seconds')} |"
                            if baseline else ""))
    return "\n".join(lines)


def vs_baseline(runs, base, key="global_steps_per_sec"):
    """The median over interleaved pairs of `key` over the baseline's, and the pairs' range."""
    if not base:
        return "-"
    by_repeat = {b["repeat"]: b for b in base}
    ratios = sorted(a[key] / by_repeat[a["repeat"]][key] for a in runs if a["repeat"] in by_repeat)
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"


def deeprec_reference():
    """DeepRec's published DeepFM CPU figures per physical core, beside ours."""
    lines = ["| published (DeepRec modelzoo DeepFM, Criteo Kaggle, batch 512, 4 physical cores) | examples/s |"
             " examples/s per core |", "|---|---|---|"]
    lines += [f"| {name} | {eps:,.0f} | {eps / DEEPREC['cores']:,.0f} |" for name, eps in DEEPREC["rows"]]
    return "\n".join(lines) + """

How their model differs from ours: DeepRec's DeepFM has a DNN of 1024-256-32 with batch
normalisation plus a final 128-64 MLP (about 0.71M multiply-adds per example in the
dense part, against 0.49M for our 400-400-400 MLP without normalisation), fixed-size
hash-bucket embedding columns (up to 5M buckets per field, dim 16) instead of a dynamic
table, batch 512 instead of 1024, real Criteo Kaggle rows instead of our synthetic
Criteo-schema rows, TF 1.15 graph mode (Estimator-style session) instead of TF 2.16
tf.function, and an Intel Xeon Platinum 8369HC at 3.3 GHz with 2 hyperthreads per core
(8 vCPUs) against our 2-core AMD EPYC VM with one thread per core. Per core is the
closest comparable unit, not an equal one."""


def record(args, table, paths, loads):
    import tensorflow as tf
    from _results import machine, record

    try:
        import tensorflow_recommenders_addons as tfra
        tfra_version = f"TFRA {tfra.__version__} in this venv"
    except ImportError:
        tfra_version = "TFRA runs in .venv-tf2.16"
    command = "benchmarks/compare.py " + " ".join(sys.argv[1:])
    baseline = next((path for path in paths if path.startswith("ttf@")), None)
    title = f"ttf at this commit vs {baseline}" if baseline else "native vs TFRA vs ttf"
    entry = (f"\n## DeepFM / Wide&Deep steps/sec: {title}\n\n"
             f"Command: `.venv/bin/python {command.strip()}`  \n"
             f"Machine: {machine(ROOT)}; load average {min(loads):.1f}-{max(loads):.1f} at the runs' starts; "
             f"TensorFlow {tf.__version__}, "
             f"{tfra_version}, Python {platform.python_version()}.  \n"
             f"Data: synthetic Criteo schema, {args.rows:,} training rows, Zipf(1.1) ids over {args.vocab:,} per "
             f"field, planted logistic model; eval on a separate file. {args.steps} global steps of batch "
             f"{args.batch_size} per worker; medians of {args.repeats} interleaved run(s) (ABBA: the order of the paths reverses every other repetition). Native: Hashing into "
             f"100,000 buckets per field + Embedding. Learning rate: Adam 0.001, Adagrad {args.adagrad_lr}. ttf runs with its default --precision auto (bf16 share in the "
             f"last column). Examples/s per core: examples/s over this machine's {os.cpu_count()} cores (one thread per core).\n\n{table}\n\n"
             + ("" if baseline else f"{deeprec_reference()}\n\n![steps/sec](../compare.png)\n"))
    print(f"[compare] recorded in {record(args.record_as, entry)}")


def draw(results, configs, paths, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{m}\n{o}\n{s}" for o, s, m in configs]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 4))
    width = 0.8 / len(paths)
    for i, path in enumerate(paths):
        values = [median(results[(o, s, m, path)], "global_steps_per_sec") if results.get((o, s, m, path)) else 0
                  for o, s, m in configs]
        ax.bar([x + (i - (len(paths) - 1) / 2) * width for x in range(len(configs))], values, width, label=path)
    ax.set_xticks(range(len(configs)), labels, fontsize=8)
    ax.set_ylabel("global steps / sec")
    ax.set_title("native vs TFRA vs ttf (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"[compare] chart {png}")


if __name__ == "__main__":
    sys.exit(main())
