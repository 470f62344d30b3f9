"""One Horovod exchange for all tables vs one per table, on a model nobody here wrote.

DeepCTR's WDL with 26 sparse fields of three widths (4, 8, 16, cycling) and 13 dense ones,
through ttf.accelerate: four ttf tables (widths 1, 4, 8 and 16). Two copies of it train on
the same batches on 2 Horovod ranks, interleaved:

  grouped:   tdh.shard_tables as shipped: the ids, rows and row gradients of all four
             tables cross in one alltoall each per step (3 per step);
  per table: the same with the grouping switched off (each table its own exchange, as a
             subclassed model gets): 4 x 3 = 12 alltoalls per step.

Reports median steps/s of interleaved blocks, the alltoalls in each step's graph, the bytes a
rank sends per step, and the largest difference of the two copies' predictions afterwards
(the same math: it should be float noise). Run it under horovodrun; rank 0 prints and
records in benchmarks/results/horovod_exchange.md:

    .venv/bin/horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/horovod_exchange.py
"""
import argparse
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402  (before deepctr: it imports tf.keras, which must resolve to tf_keras)
import tensorflow as tf  # noqa: E402
import horovod  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import ttf.distribute.horovod as tdh  # noqa: E402

FIELDS, DENSE, WIDTHS = 26, 13, (4, 8, 16)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=100_000, help="ids per field (default 100000)")
    parser.add_argument("--batch-size", type=int, default=1024, help="examples per rank and step (default 1024)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per variant, interleaved (default 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (default 3)")
    parser.add_argument("--no-record", action="store_true", help="do not record in benchmarks/results/horovod_exchange.md")
    return parser.parse_args(argv)


def build(vocab):
    from deepctr.feature_column import DenseFeat, SparseFeat
    from deepctr.models import WDL

    tf.keras.utils.set_random_seed(0)  # both copies start from the same weights
    feats = ([SparseFeat(f"C{i}", vocab, embedding_dim=WIDTHS[i % len(WIDTHS)]) for i in range(FIELDS)]
             + [DenseFeat(f"I{i}", 1) for i in range(DENSE)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeepCTR's embedding regularizer, dropped (named by accelerate)
        return ttf.accelerate(WDL(feats, feats, dnn_hidden_units=(256, 128), l2_reg_embedding=0.0,
                                  l2_reg_linear=0.0, seed=1, task="binary"))


def make_rows(vocab, rows, seed):
    sample = ttf.data.SyntheticCriteo(vocab_per_field=vocab).generate(rows, seed=seed)
    values = np.minimum(sample["ids"] & ((1 << 56) - 1), vocab - 1).astype(np.int32)
    x = {f"C{i}": values[:, i:i + 1] for i in range(FIELDS)}
    x.update({f"I{i}": sample["dense"][:, i:i + 1] for i in range(DENSE)})
    return x, sample["label"].astype(np.float32)


def main(argv=None):
    args = parse(argv)
    hvd.init()
    coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
    rank, size = hvd.rank(), hvd.size()
    models = {"grouped": build(args.vocab), "per table": build(args.vocab)}
    tdh.shard_tables(models["grouped"], coll)
    group = tdh._group_lookups  # pylint: disable=protected-access
    tdh._group_lookups = lambda model, sharding: set()  # pylint: disable=protected-access
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "each make their own exchange": that is the point here
        tdh.shard_tables(models["per table"], coll)
    tdh._group_lookups = group  # pylint: disable=protected-access

    total = args.warmup + args.repeats * args.steps
    x, y = make_rows(args.vocab, total * args.batch_size * size, seed=1)
    lo = lambda step: (step * size + rank) * args.batch_size  # noqa: E731  (this rank's slice of the global batch)
    batches = [({k: tf.constant(v[lo(s):lo(s) + args.batch_size]) for k, v in x.items()},
                tf.constant(y[lo(s):lo(s) + args.batch_size])) for s in range(total)]
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    steps, optimizers, alltoalls = {}, {}, {}
    for name, model in models.items():
        optimizers[name] = tdh.DistributedOptimizer(ttf.optimizers.Adam(1e-3), coll)
        model(batches[0][0], training=False)
        tdh.broadcast_variables(model.variables, coll)

        def step(features, labels, model=model, optimizer=optimizers[name]):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(features, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        steps[name] = tf.function(step)
        graph = steps[name].get_concrete_function(*batches[0]).graph
        alltoalls[name] = sum(op.type == "HorovodAlltoall" for op in graph.get_operations())

    position = {name: 0 for name in models}
    rates = {name: [] for name in models}
    sent = {name: [] for name in models}

    def run(name, n):
        for _ in range(n):
            loss = steps[name](*batches[position[name]])
            position[name] += 1
        float(loss)

    for name in models:
        run(name, args.warmup)
    for rep in range(args.repeats):
        for name in models:
            before = coll.wire_bytes()
            t0 = time.perf_counter()
            run(name, args.steps)
            rates[name].append(args.steps / (time.perf_counter() - t0))
            sent[name].append((coll.wire_bytes() - before) / args.steps)
            if rank == 0:
                print(f"[exchange] block {rep + 1}/{args.repeats} {name}: {rates[name][-1]:.2f} steps/s", flush=True)
    probe = {k: tf.constant(v[:4096]) for k, v in x.items()}
    predictions = {name: model(probe, training=False).numpy() for name, model in models.items()}
    diff = float(np.max(np.abs(predictions["grouped"] - predictions["per table"])))
    if rank != 0:
        return 0
    widths = sorted(layer.dim for layer in tdh.ttf_layers(models["grouped"]))
    median = {name: statistics.median(r) for name, r in rates.items()}
    lines = [
        f"## One Horovod exchange for all tables vs one per table ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "`" + " ".join([".venv/bin/horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/horovod_exchange.py",
                        *(argv if argv is not None else sys.argv[1:])]) + "`",
        f"on {os.cpu_count()} cores ({platform.machine()}), TensorFlow {tf.__version__}, horovod {horovod.__version__} "
        f"(Gloo), 1-minute load average at the end {os.getloadavg()[0]:.1f} (the two ranks count for about 2). DeepCTR WDL, {FIELDS} fields of widths "
        f"{'/'.join(map(str, WIDTHS))} (ttf tables of widths {widths}), {args.vocab:,} ids per field, "
        f"{size} ranks x batch {args.batch_size}, Adam; medians of {args.repeats} interleaved blocks of "
        f"{args.steps} steps after {args.warmup} warm-up steps.",
        "",
        "| exchange | alltoalls per step | steps/s (median) | blocks | bytes sent / step / rank |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in models:
        lines.append(f"| {name} | {alltoalls[name]} | {median[name]:.2f} | "
                     f"{', '.join(f'{r:.2f}' for r in rates[name])} | {statistics.median(sent[name]):,.0f} |")
    lines += ["", f"Grouped / per table: {median['grouped'] / median['per table']:.2f}x steps/s. The two copies' "
              f"predictions after training differ by at most {diff:.2e} (same math, other float summation order).", ""]
    text = "\n".join(lines)
    print(text, flush=True)
    if not args.no_record:
        from _results import record
        record("horovod_exchange", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
