"""Synchronous training on TensorFlow's collectives: bytes on the wire per step against the
all-to-all's payload, and steps/s of 2 workers on this host against one process on the
global batch (results: benchmarks/results/sync.md).

    python benchmarks/sync_collectives.py [--repeats 2] [--steps 40] [--batch 4096]

Each repetition runs, one after the other (interleaved over the repetitions): one process on
the global batch, then 2 workers on loopback for each compression. A worker is a DeepFM-sized
user model (ttf.FusedEmbedding, 26 Criteo fields of synthetic Zipf ids, dim 16, an MLP)
trained with ttf Adam on its half of each global batch. Reported per run: steps/s over the
timed steps (after a warm-up), and per step and worker: bytes on the wire (padded alltoall
blocks, the count exchange, the dense allreduce) and the payload (the ids, rows and row
gradients an alltoall with variable sizes would carry, plus the same dense allreduce).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    """One process of a run: `hosts` "one" trains alone on the global batch."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import ttf  # noqa: PLC0415
    import ttf.distribute.sync as tds  # noqa: PLC0415

    coll = None if args.hosts == "one" else tds.TFCollectives(
        ttf.distribute.Cluster(worker_hosts=args.hosts, task_type="worker", task_index=args.index))
    size = 1 if coll is None else coll.size
    ids_in = tf.keras.Input([26], dtype=tf.int64, name="ids")
    dense_in = tf.keras.Input([13], name="numeric")
    rows = ttf.FusedEmbedding(16, num_fields=26, seed=1)(ids_in)
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(rows), dense_in])
    for width in (256, 128):
        x = tf.keras.layers.Dense(width, activation="relu")(x)
    model = tf.keras.Model([ids_in, dense_in], tf.keras.layers.Dense(1, activation="sigmoid")(x))
    optimizer = ttf.optimizers.Adam(1e-3)
    total = args.warmup + args.steps
    sample = ttf.data.Synthetic(vocab_per_field=args.vocab).generate(total * args.batch, seed=1)
    per = args.batch // size
    rank = 0 if coll is None else coll.rank
    batches = [((tf.constant(sample["ids"][lo:lo + per]), tf.constant(sample["dense"][lo:lo + per])),
                tf.constant(sample["label"][lo:lo + per]))
               for lo in (s * args.batch + rank * per for s in range(total))]
    if coll is not None:
        tds.shard_tables(model, coll, args.compression)
        optimizer = tds.DistributedOptimizer(optimizer, coll, args.compression)
    model(batches[0][0])
    if coll is not None:
        tds.broadcast_variables(model.variables, coll)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True)[:, 0])
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for features, labels in batches[:args.warmup]:
        step(features, labels)
    before = (0, 0) if coll is None else (coll.wire_bytes(), coll.payload_bytes())
    start = time.perf_counter()
    for features, labels in batches[args.warmup:]:
        loss = step(features, labels)
    float(loss)
    seconds = time.perf_counter() - start
    dense_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables if "anchor" not in v.name)
    result = {"steps_per_sec": args.steps / seconds, "dense_params": dense_params, "size": size}
    if coll is not None:
        result["wire_bytes_per_step"] = (coll.wire_bytes() - before[0]) / args.steps
        result["payload_bytes_per_step"] = (coll.payload_bytes() - before[1]) / args.steps
    with open(args.out, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # without waiting on the gRPC server's threads


def run(args, hosts_count, compression, out_dir, tag):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    if hosts_count == 1:
        hosts = "one"
    else:
        from ttf.distribute._cluster import free_ports  # noqa: PLC0415
        hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(hosts_count))
    procs = []
    for index in range(hosts_count):
        out = os.path.join(out_dir, f"{tag}.{index}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out, "--hosts", hosts,
               "--index", str(index), "--compression", compression, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch), "--vocab", str(args.vocab)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                      out))
    results = []
    for proc, out in procs:
        output = proc.communicate(timeout=1800)[0]
        if proc.returncode != 0:
            raise RuntimeError(f"{tag} failed:\n{output[-3000:]}")
        with open(out) as f:
            results.append(json.load(f))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="repetitions of every run, interleaved (default 2)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--batch", type=int, default=4096, help="global batch (default 4096)")
    parser.add_argument("--vocab", type=int, default=100_000, help="distinct values per field (default 100000)")
    parser.add_argument("--compressions", default="none,fp16", help="comma list (default none,fp16)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    runs = [("one process", 1, "none")] + [(f"2 workers, {c}", 2, c) for c in args.compressions.split(",")]
    found = {name: [] for name, _, _ in runs}
    with tempfile.TemporaryDirectory() as out_dir:
        for repeat in range(args.repeats):
            for i, (name, count, compression) in enumerate(runs):
                found[name].append(run(args, count, compression, out_dir, f"r{repeat}-{i}"))
                print(f"[bench] {name} #{repeat + 1}: {found[name][-1][0]['steps_per_sec']:.2f} steps/s", flush=True)
    one = statistics.median(r[0]["steps_per_sec"] for r in found["one process"])
    print(f"| run | steps/s (median of {args.repeats}) | examples/s | vs one process | wire bytes/step/worker | "
          "payload bytes/step/worker | wire / payload | alltoalls only: wire / payload |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, count, compression in runs:
        steps = statistics.median(min(w["steps_per_sec"] for w in r) for r in found[name])
        line = f"| {name} | {steps:.2f} | {steps * args.batch:,.0f} | {steps / one:.2f} |"
        if count > 1:
            wire = statistics.median(statistics.mean(w["wire_bytes_per_step"] for w in r) for r in found[name])
            payload = statistics.median(statistics.mean(w["payload_bytes_per_step"] for w in r) for r in found[name])
            params = found[name][0][0]["dense_params"]
            dense = 2 * (count - 1) * params * (4 if compression == "none" else 2) / count  # the dense allreduce
            line += (f" {wire:,.0f} | {payload:,.0f} | {wire / payload:.3f} | "
                     f"{(wire - dense) / (payload - dense):.3f} |")
        else:
            line += " - | - | - | - |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
