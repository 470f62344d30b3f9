"""Run by test_sharded_checkpoints.py: trains a 2-shard table and saves through
ttf.checkpoint.CheckpointManager (full every 3) in a loop, printing `saved <step>` after
each save returns, until killed. Deterministic: step s trains the same ids in every run,
so a restored step can be replayed and compared (`--replay STEP --out FILE`)."""
import argparse
import json
import sys

import numpy as np
import tensorflow as tf

import ttf


def build():
    layer = ttf.DynamicEmbedding(4, seed=3, shard_devices=["/cpu:0"] * 2, name="emb")
    layer(tf.constant([[0]], tf.int64))
    return layer, ttf.optimizers.Adagrad(0.1)


def train_step(layer, optimizer, step):
    ids = np.random.default_rng(step).integers(0, 200_000, size=(20_000, 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(tf.constant(ids), training=True)))
    optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
    if step % 4 == 0:
        layer.evict(before_step=step - 2)  # deletions for the deltas to carry


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--replay", type=int, default=None, help="train to this step, print the table summary")
    args = parser.parse_args()
    layer, optimizer = build()
    if args.replay is not None:
        for step in range(1, args.replay + 1):
            train_step(layer, optimizer, step)
        print(json.dumps(ttf.embedding.table_summary(layer)[:2]))
        return
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer), args.dir, full_every=3)
    for step in range(1, 10_000):
        train_step(layer, optimizer, step)
        manager.save(step)
        print(f"saved {step}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
