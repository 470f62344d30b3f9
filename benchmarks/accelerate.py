"""DeepCTR DeepFM as its user builds it (native Keras Embedding + Adam) vs the same model
after `fast = ttf.accelerate(model)`: training steps/sec and held-out AUC.

Both models start from the same weights (accelerate carries every row over), train on the
same synthetic batches (ttf.data.SyntheticCriteo: 26 Zipf fields with `--vocab` ids each,
13 dense columns, a planted logistic model) in the same order, one batch per step through
Keras' own train function (what model.fit runs). The paths alternate in blocks of
`--steps` steps, `--repeats` times after `--warmup` steps each; the table gives the median
steps/sec of the blocks, the ratio, and the AUC on held-out rows after the last block. It
is printed and, unless --no-record, appended to benchmarks/RESULTS.md with the command.

    .venv/bin/python benchmarks/accelerate.py                    # 1e5 and 1e6 ids per field
    .venv/bin/python benchmarks/accelerate.py --vocab 100000 --repeats 3 --no-record   # quicker

DeepCTR's default l2_reg_embedding and l2_reg_linear (1e-5) are set to 0 in both paths: ttf tables have no
regularization loss (accelerate warns that it drops it), so with it the two models would
not compute the same function.
"""
import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402  (before deepctr: tf.keras must resolve to tf_keras)
import tensorflow as tf  # noqa: E402

FIELDS, DENSE = 26, 13


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--vocab", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="ids per field, one benchmark per value (default: 100000 1000000)")
    parser.add_argument("--batch-size", type=int, default=1024, help="examples per step (default 1024)")
    parser.add_argument("--dim", type=int, default=8, help="embedding width (default 8)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per path, interleaved (default 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per path first (default 3)")
    parser.add_argument("--eval-rows", type=int, default=50_000, help="held-out rows for AUC (default 50000)")
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if min(args.vocab) < 2 or args.batch_size < 1 or args.steps < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--vocab >= 2, --batch-size, --steps, --repeats >= 1 and --warmup >= 0 are required")
    return args


def make_rows(vocab, rows, seed):
    """Synthetic Criteo rows as DeepCTR's inputs: C0..C25 int32 [N, 1], I0..I12 float32 [N, 1]."""
    sample = ttf.data.SyntheticCriteo(vocab_per_field=vocab).generate(rows, seed=seed)
    values = np.minimum(sample["ids"] & ((1 << 56) - 1), vocab - 1).astype(np.int32)  # missing -> last id
    x = {f"C{i}": values[:, i:i + 1] for i in range(FIELDS)}
    x.update({f"I{i}": sample["dense"][:, i:i + 1] for i in range(DENSE)})
    return x, sample["label"]


def build_deepfm(vocab, args):
    from deepctr.feature_column import DenseFeat, SparseFeat
    from deepctr.models import DeepFM

    feats = ([SparseFeat(f"C{i}", vocab, embedding_dim=args.dim) for i in range(FIELDS)]
             + [DenseFeat(f"I{i}", 1) for i in range(DENSE)])
    model = DeepFM(feats, feats, task="binary", l2_reg_embedding=0.0, l2_reg_linear=0.0, seed=1)
    model.compile(tf.keras.optimizers.Adam(args.lr), "binary_crossentropy")
    return model


def auc(model, x, y):
    metric = tf.keras.metrics.AUC(num_thresholds=10_000)
    metric.update_state(y, model.predict(x, batch_size=8192, verbose=0)[:, 0])
    return float(metric.result())


def bench(vocab, args):
    print(f"[accelerate] vocab {vocab:,}: building DeepFM and its ttf twin", flush=True)
    native = build_deepfm(vocab, args)
    t0 = time.perf_counter()
    fast = ttf.accelerate(native)
    convert_s = time.perf_counter() - t0
    total = args.warmup + args.repeats * args.steps
    x, y = make_rows(vocab, total * args.batch_size, seed=1)
    x_eval, y_eval = make_rows(vocab, args.eval_rows, seed=2)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).cache()
    paths = {"native": native, "accelerated": fast}
    iterators = {name: iter(batches) for name in paths}
    train = {name: model.make_train_function() for name, model in paths.items()}
    rates = {name: [] for name in paths}
    for name in paths:
        for _ in range(args.warmup):
            train[name](iterators[name])
    for rep in range(args.repeats):
        for name in paths:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                logs = train[name](iterators[name])
            float(logs["loss"])  # wait for the last step
            rates[name].append(args.steps / (time.perf_counter() - t0))
            print(f"[accelerate] vocab {vocab:,} block {rep + 1}/{args.repeats} {name}: "
                  f"{rates[name][-1]:.2f} steps/s", flush=True)
    result = {name: dict(steps_per_s=statistics.median(r), auc=auc(paths[name], x_eval, y_eval))
              for name, r in rates.items()}
    result["ratio"] = result["accelerated"]["steps_per_s"] / result["native"]["steps_per_s"]
    result["convert_s"] = convert_s
    result["table_rows"] = int(sum(int(layer.size()) for layer in fast.layers if isinstance(layer, ttf.DynamicEmbedding)))
    del native, fast
    return result


def table(results, args):
    lines = ["| ids per field | native steps/s | accelerated steps/s | speed-up | native AUC | accelerated AUC | "
             "accelerate() s | table rows |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for vocab, r in results.items():
        lines.append(f"| {vocab:,} | {r['native']['steps_per_s']:.2f} | {r['accelerated']['steps_per_s']:.2f} | "
                     f"{r['ratio']:.1f}x | {r['native']['auc']:.4f} | {r['accelerated']['auc']:.4f} | "
                     f"{r['convert_s']:.1f} | {r['table_rows']:,} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    results = {vocab: bench(vocab, args) for vocab in args.vocab}
    text = table(results, args)
    print(text)
    if not args.no_record:
        command = "benchmarks/accelerate.py " + " ".join(sys.argv[1:] if argv is None else argv)
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        with open(os.path.join(ROOT, "benchmarks", "RESULTS.md"), "a") as out:
            out.write(f"\n## ttf.accelerate on DeepCTR DeepFM ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                      f"`.venv/bin/python {command.strip()}` on {os.cpu_count()} cores ({cpu}), TensorFlow "
                      f"{tf.__version__}, tf_keras, deepctr 0.9.4; 26 fields, dim {args.dim}, batch "
                      f"{args.batch_size}, Adam lr {args.lr}, l2_reg_embedding = l2_reg_linear = 0 in both; medians of "
                      f"{args.repeats} interleaved blocks of {args.steps} steps after {args.warmup} warm-up "
                      f"steps; AUC on {args.eval_rows:,} held-out rows after the same "
                      f"{args.warmup + args.repeats * args.steps} steps. Load average at the end (1/5/15 min): "
                      f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores.\n\n"
                      f"{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
