"""DeepFM on Keras 3 vs tf_keras (issue 20): the same start_all.sh single-process job on the
same synthetic data, three ways, interleaved `--repeats` times:

  tf_keras + ttf        TF_USE_LEGACY_KERAS=1 ./start_all.sh --tiacc --fm --single ...
  Keras 3 + ttf         TF_USE_LEGACY_KERAS=0 ./start_all.sh --tiacc --fm --single ...
  Keras 3 + Embedding   TF_USE_LEGACY_KERAS=0 ./start_all.sh --fm --single ...  (keras.layers.Embedding, Keras Adam)

All with Adam and the job's default precision (ttf: the loss-driven bf16 switch, on either
Keras; the native path runs float32). Reports medians of global steps/s, CPU seconds per
step and AUC, the Keras 3 / tf_keras ratio (target within 10%) and Keras 3 ttf / Keras 3
Embedding (target >= 3x), AUC differences (target within 0.002); records in benchmarks/results/keras3.md.
The native path is slow (Keras 3's Adam updates the whole embedding matrix every step), so
it runs `--native-steps` steps; its AUC is reported but not compared.

    .venv/bin/python benchmarks/keras3.py                 # about 10 minutes
    .venv/bin/python benchmarks/keras3.py --quick         # smoke run, nothing recorded
"""
import argparse
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (same data and job runner as the steps/sec comparison)

ROOT = compare.ROOT
RUNS = (("tf_keras + ttf", "1", "ttf"), ("Keras 3 + ttf", "0", "ttf"), ("Keras 3 + Embedding", "0", "native"))
METRICS = ("global_steps_per_sec", "cpu_seconds_per_step", "auc")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="global steps of the ttf runs (default 600)")
    p.add_argument("--native-steps", type=int, default=60, help="steps of the Keras Embedding runs (default 60)")
    p.add_argument("--batch-size", type=int, default=1024, help="(default 1024)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training rows (default 400000)")
    p.add_argument("--vocab", type=int, default=100_000, help="synthetic ids per field (default 100000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--quick", action="store_true", help="tiny sizes; prints but records nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.native_steps, args.batch_size, args.rows, args.vocab, args.repeats = 40, 10, 64, 4000, 1000, 1
    files = compare.make_data(args.rows, max(args.rows // 8, 1000), args.vocab, os.path.join(ROOT, "runs", "compare_data"))
    runs = {name: [] for name, _, _ in RUNS}
    steps = args.steps
    for _ in range(args.repeats):
        for name, legacy, path in RUNS:
            os.environ["TF_USE_LEGACY_KERAS"] = legacy  # models/train.py keeps what it is given
            args.steps = steps if path == "ttf" else args.native_steps
            out = os.path.join(ROOT, "runs", f"keras3_{path}_{legacy}.json")
            metrics = compare.run(path, "fm", "adam", "single", args, files, out)
            if metrics is None:
                return 1
            runs[name].append(metrics)
    args.steps = steps
    med = {name: {m: statistics.median(r[m] for r in v) for m in METRICS} for name, v in runs.items()}
    base, k3, native = (med[name] for name, _, _ in RUNS)
    table = "\n".join([
        "| run | global steps/s | CPU s/step | AUC |", "|---|---|---|---|",
        *(f"| {name} | {v['global_steps_per_sec']:.2f} | {v['cpu_seconds_per_step']:.4f} | {v['auc']:.4f} |"
          for name, v in med.items())])
    summary = (f"Keras 3 ttf / tf_keras ttf: {k3['global_steps_per_sec'] / base['global_steps_per_sec']:.2f}x steps/s "
               f"(CPU per step {k3['cpu_seconds_per_step'] / base['cpu_seconds_per_step']:.2f}x), AUC "
               f"{k3['auc'] - base['auc']:+.4f}; Keras 3 ttf / Keras 3 Embedding: "
               f"{k3['global_steps_per_sec'] / native['global_steps_per_sec']:.1f}x steps/s")
    print(table + "\n" + summary)
    if not args.quick:
        from _results import machine, record
        entry = (f"\n## DeepFM on Keras 3 vs tf_keras (issue 20)\n\n"
                 f"Command: `.venv/bin/python benchmarks/keras3.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {machine(ROOT)}, Python {platform.python_version()}; "
                 f"shared with other jobs while it ran (figures indicative; the ratios come from interleaved runs). "
                 f"DeepFM, Adam, single process, batch {args.batch_size}, {args.steps} steps (Keras Embedding: "
                 f"{args.native_steps}), {args.rows:,} synthetic rows, {args.vocab:,} ids per field; medians of "
                 f"{args.repeats} interleaved runs.\n\n{table}\n\n{summary}\n")
        print(f"[keras3] recorded in {record('keras3', entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
