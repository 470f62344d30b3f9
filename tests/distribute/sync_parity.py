"""A user's own Keras model trained on 2 workers over TensorFlow's collectives, or on one
process on the global batch (run by test_sync_parity.py):

    python tests/distribute/sync_parity.py OUT.json WORKER_HOSTS|one TASK_INDEX [STEPS [KILL_AT [tape|fit]]]

Every worker reads the whole global batch and keeps its slice (tds.rank_slice), so the
workers together train on exactly the one process's batches. Writes this worker's table
shard (keys, rows) and, on worker 0, AUC and logloss on held-out rows. KILL_AT: worker 1
exits abruptly at that step (a lost worker); the others report the loss in one line.
The lines marked "sync:" are all a user adds.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import ttf
import ttf.distribute.sync as tds  # sync:

out_path, hosts, task = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 200
kill_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
use_fit = len(sys.argv) > 6 and sys.argv[6] == "fit"  # model.fit instead of the GradientTape loop
GLOBAL_BATCH = 256
cluster = ttf.distribute.Cluster(worker_hosts=hosts, task_type="worker", task_index=task) if hosts != "one" else None
coll = tds.TFCollectives(cluster) if cluster else None  # sync: before the model
rank, size = (0, 1) if coll is None else (coll.rank, coll.size)

ids_in = tf.keras.Input([26], dtype=tf.int64, name="ids")
dense_in = tf.keras.Input([13], name="numeric")
rows = ttf.FusedEmbedding(8, num_fields=26, seed=1)(ids_in)
x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(rows), dense_in])
x = tf.keras.layers.Dense(32, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(x)
out = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(4))(x)
model = tf.keras.Model([ids_in, dense_in], out)
optimizer = ttf.optimizers.Adam(0.005)

config = ttf.data.Synthetic(vocab_per_field=2000)
train, held_out = config.generate(steps * GLOBAL_BATCH, seed=1), config.generate(4096, seed=2)
data = tf.data.Dataset.from_tensor_slices(((train["ids"], train["dense"]), train["label"])).batch(GLOBAL_BATCH)
if coll is not None:
    tds.shard_tables(model, coll)  # sync: each id lives on one worker
    optimizer = tds.DistributedOptimizer(optimizer, coll)  # sync: dense allreduce, rows to their owners
    data = tds.rank_slice(data, GLOBAL_BATCH // size, coll)  # sync: this worker's slice of each global batch
model([train["ids"][:2], train["dense"][:2]])  # builds the variables
if coll is not None:
    tds.broadcast_variables(model.variables, coll)  # sync: worker 0's initial dense weights everywhere


def logloss(labels, p):
    p = tf.clip_by_value(p, 1e-7, 1 - 1e-7)
    return -tf.reduce_mean(labels * tf.math.log(p) + (1 - labels) * tf.math.log(1 - p))


@tf.function
def train_step(features, labels):
    with tf.GradientTape() as tape:
        loss = logloss(labels, model(features, training=True)[:, 0])
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def run():
    if use_fit:
        model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy())
        model.fit(data.map(lambda x, y: (x, y[:, None])), epochs=1, verbose=0)
        return model.predict([held_out["ids"], held_out["dense"]], batch_size=1024, verbose=0)[:, 0]
    for step, (features, labels) in enumerate(data):
        if step == kill_at and rank == 1:
            os._exit(3)  # a worker lost mid-job: no goodbye to the others
        train_step(features, labels)
    # Every worker predicts the held-out rows: a lookup at inference is a collective too.
    return model.predict([held_out["ids"], held_out["dense"]], batch_size=1024, verbose=0)[:, 0]


if coll is None:
    predictions = run()
else:
    try:
        with coll.guard("training"):  # sync: a lost worker becomes one line naming it
            predictions = run()
    except tds.LostWorkerError as err:
        print(err, flush=True)
        with open(out_path, "w") as f:
            json.dump({"lost": list(err.lost), "error": str(err)}, f)
        os._exit(1)  # TensorFlow's gRPC server can hang the interpreter's exit after a lost peer
layer = next(layer for layer in model.layers if isinstance(layer, ttf.FusedEmbedding))
shard = layer.tables[0].export()
result = {"keys": shard["keys"].numpy().tolist(), "rows": shard["values"].numpy()[:, :8].tolist(),
          "rank": rank, "size": size, "iterations": int(optimizer.iterations.numpy())}
if rank == 0:
    labels = held_out["label"]
    result["auc"] = ttf.data.best_auc(labels, predictions)
    result["logloss"] = float(logloss(tf.constant(labels, tf.float32), tf.constant(predictions)))
    if coll is not None:
        result["wire_bytes"], result["payload_bytes"] = coll.wire_bytes(), coll.payload_bytes()
with open(out_path, "w") as f:
    json.dump(result, f)
sys.stdout.flush()
os._exit(0)  # see above: a clean exit without waiting on the gRPC server's threads
