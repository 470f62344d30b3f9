"""DeepFM with ttf: --precision loss (what auto runs on a CPU with native bf16) vs fp32, end to end.

The same start_all.sh job (single process, ttf path, Adam) on the same synthetic data as
benchmarks/compare.py, run with --precision fp32 and --precision loss, interleaved,
--repeats times. Reports median global steps/sec and their ratio, the AUC difference and
the share of steps that ran in bf16; records the table in benchmarks/results/precision.md.

    .venv/bin/python benchmarks/precision_models.py              # about 5 minutes
    .venv/bin/python benchmarks/precision_models.py --quick      # smoke run, nothing recorded
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (same data and job runner as the steps/sec comparison)

ROOT = compare.ROOT


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["fm", "wdl"], default="fm", help="(default fm)")
    p.add_argument("--steps", type=int, default=600, help="global steps per run (default 600)")
    p.add_argument("--batch-size", type=int, default=4096, help="(default 4096)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training rows (default 400000)")
    p.add_argument("--vocab", type=int, default=1_000_000, help="synthetic ids per field (default 1M)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--quick", action="store_true", help="tiny sizes; prints but records nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.rows, args.vocab, args.repeats = 40, 64, 4000, 1000, 1
    files = compare.make_data(args.rows, max(args.rows // 8, 1000), args.vocab, os.path.join(ROOT, "runs", "compare_data"))
    runs = {"fp32": [], "loss": []}
    for _ in range(args.repeats):
        for precision in runs:
            out = os.path.join(ROOT, "runs", f"precision_{precision}.json")
            metrics = compare.run("ttf", args.model, "adam", "single", args, files, out, extra=("--precision", precision))
            if metrics is None:
                return 1
            runs[precision].append(metrics)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("global_steps_per_sec", "auc", "bf16_fraction")}
           for k, v in runs.items()}
    ratio = med["loss"]["global_steps_per_sec"] / med["fp32"]["global_steps_per_sec"]
    table = "\n".join([
        "| precision | global steps/s | ratio | AUC | AUC - fp32 | bf16 share |", "|---|---|---|---|---|---|",
        *(f"| {k} | {v['global_steps_per_sec']:.2f} | {v['global_steps_per_sec'] / med['fp32']['global_steps_per_sec']:.2f}x"
          f" | {v['auc']:.4f} | {v['auc'] - med['fp32']['auc']:+.4f} | {v['bf16_fraction']:.2f} |" for k, v in med.items())])
    print(table)
    if not args.quick:
        entry = (f"\n## DeepFM with ttf: --precision loss vs fp32\n\n"
                 f"Command: `.venv/bin/python benchmarks/precision_models.py {' '.join(sys.argv[1:])}`  \n"
                 f"{args.model}, Adam, single process, {args.steps} steps of batch {args.batch_size}, the synthetic data "
                 f"of benchmarks/compare.py ({args.rows:,} rows); medians of {args.repeats} interleaved runs. "
                 f"Speed-up {ratio:.2f}x (target >= 1.3x with AUC within 0.001).\n\n{table}\n")
        from _results import record
        print(f"[precision] recorded in {record('precision', entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
