"""One training step's embedding work: ttf vs TFRA vs native TensorFlow.

Batch 4096 x 26 fields, dim 16, Zipf(1.1)-distributed keys over a 10M-key space (26 fields
x 384,615 ids); the dynamic tables (ttf, TFRA) are first grown to hold all 10M keys. A step
is: look up ids [B, F] -> [B, F, 16], a loss on the embeddings, its gradient, and the Adam
update of the touched rows:
  ttf:    ttf.FusedEmbedding (one fused lookup op) + ttf.optimizers.Adam (one fused apply op)
  tfra:   de.keras.layers.Embedding + de.DynamicEmbeddingOptimizer(tf.keras Adam)
  native: tf.keras.layers.Embedding of 1M rows per field (26M rows) + tf.keras Adam
The paths run interleaved in one process, several repetitions; the report gives the
median step time, ids/s and ratios, and records them in benchmarks/results/embedding_ops.md.

    .venv/bin/python benchmarks/embedding_ops.py            # full (about 10 minutes)
    .venv/bin/python benchmarks/embedding_ops.py --quick    # small smoke run, nothing recorded
"""
import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402
import tensorflow as tf

FIELDS, DIM = 26, 16


def zipf_ids(rng, batch, per_field, exponent=1.1):
    """Field-tagged keys [batch, FIELDS]: Zipf ranks (1 = most frequent) below per_field."""
    ranks = rng.zipf(exponent, size=(batch, FIELDS)) % per_field
    return (np.arange(FIELDS, dtype=np.int64) << 56) | ranks.astype(np.int64)


def all_keys(per_field):
    return ((np.arange(FIELDS, dtype=np.int64)[:, None] << 56) | np.arange(per_field, dtype=np.int64)[None, :]).ravel()


def make_step(lookup, variables_fn, optimizer, weights):
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            emb = lookup(ids)
            loss = tf.reduce_sum(emb * weights)
        variables = variables_fn()
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss
    return step


def build_ttf(per_field, weights):
    layer = ttf.FusedEmbedding(DIM, num_fields=FIELDS, initializer="uniform")
    layer.build(None)
    keys = all_keys(per_field)
    for start in range(0, len(keys), 1 << 20):  # grow the table to the full key space
        layer.tables[0].lookup(keys[start:start + (1 << 20)], training=True)
    step = make_step(lambda ids: layer(ids, training=True), lambda: layer.trainable_variables,
                     ttf.optimizers.Adam(1e-3), weights)
    return step, lambda: int(layer.size())


def build_tfra(per_field, weights):
    from tensorflow_recommenders_addons import dynamic_embedding as de

    layer = de.keras.layers.Embedding(DIM, initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05),
                                      name="tfra_embedding")
    keys = all_keys(per_field)
    for start in range(0, len(keys), 1 << 20):
        chunk = keys[start:start + (1 << 20)]
        layer.params.upsert(chunk, tf.random.uniform([len(chunk), DIM], -0.05, 0.05, seed=start))
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))

    def lookup(ids):
        return tf.reshape(layer(tf.reshape(ids, [-1])), [-1, FIELDS, DIM])

    step = make_step(lookup, lambda: layer.trainable_variables, optimizer, weights)
    return step, lambda: int(layer.params.size())


def build_native(per_field, weights):
    rows_per_field = 1_000_000
    layer = tf.keras.layers.Embedding(FIELDS * rows_per_field, DIM)
    offsets = tf.constant(np.arange(FIELDS, dtype=np.int64) * rows_per_field)

    def lookup(ids):
        local = tf.bitwise.bitwise_and(ids, (1 << 56) - 1) % rows_per_field
        return layer(local + offsets)

    layer.build(None)
    step = make_step(lookup, lambda: layer.trainable_variables, tf.keras.optimizers.Adam(1e-3), weights)
    return step, lambda: FIELDS * rows_per_field


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=4096, help="rows per step (default 4096)")
    parser.add_argument("--keys", type=int, default=10_000_000, help="key space / table size (default 10M)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per path per repetition (default 10)")
    parser.add_argument("--paths", default="ttf,tfra,native", help="comma-separated subset of ttf,tfra,native")
    parser.add_argument("--quick", action="store_true", help="small sizes, nothing recorded (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.keys, args.repeats, args.steps = 256, 26_000, 2, 3
    per_field = args.keys // FIELDS
    rng = np.random.default_rng(0)
    weights = tf.constant(rng.normal(size=(1, FIELDS, DIM)).astype(np.float32))
    builders = {"ttf": build_ttf, "tfra": build_tfra, "native": build_native}
    paths = [p for p in args.paths.split(",") if p]
    if any(p not in builders for p in paths):
        parser.error(f"--paths takes a subset of {sorted(builders)}, got {args.paths}")
    steps, sizes, times = {}, {}, {p: [] for p in paths}
    for p in paths:
        t0 = time.perf_counter()
        steps[p], sizes[p] = builders[p](per_field, weights)
        steps[p](tf.constant(zipf_ids(rng, args.batch_size, per_field)))  # trace + first-step work
        print(f"[bench] {p}: built and warmed up in {time.perf_counter() - t0:.1f}s, table size {sizes[p]():,}",
              flush=True)
    batches = [tf.constant(zipf_ids(rng, args.batch_size, per_field)) for _ in range(args.steps)]
    for rep in range(args.repeats):
        for p in paths:
            for ids in batches:
                t0 = time.perf_counter()
                steps[p](ids).numpy()
                times[p].append(time.perf_counter() - t0)
            print(f"[bench] repetition {rep + 1}/{args.repeats} {p}: median step "
                  f"{1000 * statistics.median(times[p][-args.steps:]):.1f} ms", flush=True)
    ids_per_step = args.batch_size * FIELDS
    median_ms = {p: 1000 * statistics.median(times[p]) for p in paths}
    lines = [f"| path | median step ms | ids/s | table size | vs tfra | vs native |", "|---|---|---|---|---|---|"]
    for p in paths:
        vs = lambda other: f"{median_ms[other] / median_ms[p]:.2f}x" if other in median_ms else "-"  # noqa: E731
        lines.append(f"| {p} | {median_ms[p]:.1f} | {ids_per_step / median_ms[p] * 1000:,.0f} | {sizes[p]():,} | "
                     f"{vs('tfra')} | {vs('native')} |")
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        record(args, table)


def record(args, table):
    from _results import machine, record
    import tensorflow_recommenders_addons as tfra
    entry = (f"\n## Embedding ops: one step's lookup + Adam, batch {args.batch_size} x {FIELDS} fields, dim {DIM}, "
             f"Zipf(1.1) over {args.keys:,} keys\n\n"
             f"Command: `.venv/bin/python benchmarks/embedding_ops.py --repeats {args.repeats} --steps {args.steps}`  \n"
             f"Machine: {machine()}; TensorFlow {tf.__version__}, TFRA {tfra.__version__}, Python "
             f"{platform.python_version()}. Medians over {args.repeats} interleaved repetitions of {args.steps} steps.\n\n"
             f"{table}\n")
    print(f"[bench] recorded in {record('embedding_ops', entry)}")


if __name__ == "__main__":
    sys.exit(main())
