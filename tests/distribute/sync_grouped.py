"""A functional model with two ttf tables on a one-worker SyncWorkers job, on whichever Keras
the environment selects (run by test_sync_collectives.py):

    python tests/distribute/sync_grouped.py OUT.json HOST:PORT 0

Writes how many exchanges one training call makes (ttf groups every table's lookups into one),
the predictions before and after sharding (equal: one worker owns every id), and the eager
predictions before and after a serving export, with the served ones (the export traces the
model's call with its frozen tables: the grouped call must not keep that trace)."""
import json
import sys

import numpy as np

import ttf
import tensorflow as tf
from ttf.distribute import _table_sharding

out, hosts, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
topology = ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts=hosts, task_type="worker", task_index=index))  # first
with topology.scope():
    ids, user = tf.keras.Input([4], dtype=tf.int64, name="ids"), tf.keras.Input([1], dtype=tf.int64, name="user")
    fields = tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=4, name="fields")(ids))
    users = tf.keras.layers.Flatten()(ttf.DynamicEmbedding(2, name="users")(user))
    model = tf.keras.Model({"ids": ids, "user": user},
                           tf.keras.layers.Dense(1, name="logit")(tf.keras.layers.Concatenate()([fields, users])))
rng = np.random.default_rng(0)
features = {"ids": tf.constant(rng.integers(0, 1000, (16, 4))), "user": tf.constant(rng.integers(0, 50, (16, 1)))}
model(features, training=True)  # rows for these ids, before sharding
before = model(features, training=False).numpy()
exchanges = []
original = _table_sharding.TableSharding.exchange


def counted(self, requests, training):
    exchanges.append(sorted(layer.name for layer, _, _ in requests))
    return original(self, requests, training)


_table_sharding.TableSharding.exchange = counted
with topology.scope():
    job = ttf.distribute.Job(model, ttf.optimizers.Adam(1e-3), topology=topology, log=lambda m: None)
after = model(features, training=False).numpy()
exchanges.clear()
model(features, training=True)
grouped = list(exchanges)
with tf.GradientTape() as tape:  # one update: rows that differ from the initial ones
    loss = tf.reduce_sum(model(features, training=True))
job.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
trained = model(features, training=False).numpy()
version = job.export_for_serving(out + "-serving")
exported_then = model(features, training=False).numpy()  # eager, after the export traced the model
served = list(tf.saved_model.load(version).signatures["serving_default"](**features).values())[0].numpy()
json.dump({"exchanges": grouped, "before": before.tolist(), "after": after.tolist(), "trained": trained.tolist(),
           "after_export": exported_then.tolist(), "served": served.tolist()}, open(out, "w"))
