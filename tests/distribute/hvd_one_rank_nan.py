"""Run by test_horovod.py under horovodrun -np 2: on step 2, rank 1 alone gets a NaN gradient
for a dense weight (the loss stays finite, the table gradients too, so nothing else carries
it to rank 0). With make_train_step(finite_across=lambda flag: tdh.all_ranks(flag, coll)) both ranks skip that step
(and only it); without it, rank 1 alone would skip, and miss rank 0's dense allreduce.

    horovodrun --gloo -np 2 python tests/distribute/hvd_one_rank_nan.py OUT_PREFIX
"""
import json
import sys

import numpy as np

import ttf
import tensorflow as tf
import horovod.tensorflow as hvd
import ttf.distribute.horovod as tdh

hvd.init()

coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call


class SqrtTerm(tf.keras.layers.Layer):
    """sqrt(|s * f|): finite for f = 0, but its gradient for s is then inf * 0 = NaN."""

    def build(self, input_shape):
        self.s = self.add_weight(name="s", shape=[], initializer="ones")

    def call(self, f):
        return tf.sqrt(tf.abs(self.s * f))


ids = tf.keras.Input([3], dtype=tf.int64)
f = tf.keras.Input([1])
x = tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=3, tag_fields=True, seed=1)(ids))
logits = tf.keras.layers.Add()([tf.keras.layers.Dense(1)(x), SqrtTerm()(f)])
model = tf.keras.Model([ids, f], tf.keras.layers.Activation("sigmoid")(logits))
tdh.shard_tables(model, coll)
optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(0.01), coll)
model((tf.zeros([1, 3], tf.int64), tf.ones([1, 1])))
tdh.broadcast_variables(model.variables, coll)
step_fn = ttf.precision.make_train_step(model, tf.keras.losses.BinaryCrossentropy(), optimizer,
                                        finite_across=lambda flag: tdh.all_ranks(flag, coll))
rng = np.random.default_rng(hvd.rank())
skipped = []
for step in range(5):
    labels = rng.integers(0, 2, size=(32, 1)).astype(np.float32)
    features = np.ones([32, 1], np.float32)
    if step == 2 and hvd.rank() == 1:
        features[0, 0] = 0.0
    out = step_fn((tf.constant(rng.integers(0, 100, size=(32, 3))), tf.constant(features)), tf.constant(labels))
    skipped.append(bool(out["skipped"]))
with open(f"{sys.argv[1]}-{hvd.rank()}.json", "w") as f:
    json.dump({"skipped": skipped, "skipped_steps": int(step_fn.skipped_steps),
               "optimizer_iterations": int(optimizer.iterations)}, f)
