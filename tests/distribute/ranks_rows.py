"""Compressed table rows (rows="int8" / "bf16") on the ranks of a synchronous job, run by
test_ranks_rows.py (2 workers on TensorFlow's collectives) and test_horovod_save.py (2
Horovod ranks): each rank trains its shard of a FusedEmbedding table, saves its part of a
checkpoint (full, then a delta), writes its rows into an int8 serving export, publishes an
int8 base and a delta (ttf.serving.Publisher over the ranks), and restores the chain into a
fresh model. It saves its rows (the full export and the stored values)
after training and after the restore.

    python ranks_rows.py OUT.json WORKER_HOSTS TASK_INDEX ROWS DIR          (TensorFlow's collectives)
    horovodrun --gloo -np 2 python ranks_rows.py horovod - - ROWS DIR      (Horovod; OUT is DIR/hvd.<rank>.json)
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import ttf

out, hosts, task, rows, directory = sys.argv[1:6]
if out == "horovod":
    import horovod.tensorflow as hvd
    import ttf.distribute.horovod as backend

    hvd.init()
    coll = backend.HorovodCollectives()
    out = os.path.join(directory, f"hvd.{coll.rank}.json")
else:
    import ttf.distribute.sync as backend

    coll = ttf.distribute.TFCollectives(ttf.distribute.Cluster(worker_hosts=hosts, task_type="worker",
                                                               task_index=int(task)))
rank = coll.rank


def make_model():
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    layer = ttf.FusedEmbedding(4, num_fields=3, seed=1, rows=rows, name="emb")
    flat = tf.keras.layers.Flatten()(layer(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, kernel_initializer="ones")(flat))
    backend.shard_tables(model, coll)
    optimizer = backend.DistributedOptimizer(ttf.optimizers.Adam(0.05), coll)
    model(tf.zeros([1, 3], tf.int64))
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                               os.path.join(directory, "ckpt"), full_every=3)
    return model, layer, optimizer, manager


def train(model, optimizer, first_id, steps):
    for step in range(steps):  # every rank its own ids, and some shared ones
        ids = np.arange(30).reshape(10, 3) + first_id + 1000 * rank + 100 * step
        ids[0] = [7, 8, 9]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(tf.constant(ids, tf.int64), training=True) - 1.0))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def save_rows(layer, name):
    """This rank's rows: the full export (values with slots), the stored values (codes) and the checksum."""
    table = layer.tables[0]
    full, stored = table.export(), table.export(stored_values=True)
    np.savez(os.path.join(directory, f"{name}-{rank}.npz"), keys=full["keys"].numpy(), values=full["values"].numpy(),
             meta=full["meta"].numpy(), stored_keys=stored["keys"].numpy(), stored=stored["values"].numpy(),
             checksum=ttf.embedding.table_summary(layer)[1])


model, layer, optimizer, manager = make_model()
train(model, optimizer, 0, 3)
paths = [backend.save_checkpoint(manager, 1, coll)]
train(model, optimizer, 5000, 1)
paths.append(backend.save_checkpoint(manager, 2, coll))
save_rows(layer, "trained")
served = backend.export_for_serving(model, os.path.join(directory, "serving"), coll, row_dtype=tf.int8)
probe = np.array([[7, 8, 9], [1000 * rank, 1000 * rank + 1, 1000 * rank + 2], [123456, 8, 9]], np.int64)
predicted = model(tf.constant(probe), training=False).numpy().ravel().tolist()
publisher = backend.Publisher(model, os.path.join(directory, "published"), coll, row_dtype=tf.int8)
published = [publisher.publish()]  # a base
train(model, optimizer, 9000, 1)
published.append(publisher.publish())  # a delta of the rows trained since
save_rows(layer, "published")
restored_model, restored, _, restored_manager = make_model()
restored_step = restored_manager.restore_latest()
save_rows(restored, "restored")
with open(out, "w") as f:
    json.dump({"rank": rank, "paths": [os.path.basename(p) for p in paths], "served": served,
               "restored_step": restored_step, "published": published, "probe": probe.tolist(),
               "predicted": predicted}, f)
