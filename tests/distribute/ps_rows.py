"""Run by test_ps_rows.py in a process of its own (it connects to a cluster): compressed table
rows (rows="int8" / "bf16") on real parameter servers. Three in-process PS and a chief; a table
sharded over 2 PS trains as the same table sharded on the chief does (the same kernels: the
same bytes); its checkpoint (full + delta) restores into 3 PS and into the chief, to the bit; its int8
serving shards, built on each PS, hold the training codes. Saves the tables' rows in
OUT_DIR; the test compares them.

    python ps_rows.py OUT_DIR
"""
import os
import sys

import numpy as np
import tensorflow as tf

import ttf
from ttf.distribute import free_ports
from ttf.serving._frozen import HashedTable

DIM = 4


def layer_on(devices, rows, name):
    layer = ttf.DynamicEmbedding(DIM, seed=3, rows=rows, shard_devices=devices, name=name)
    layer(tf.constant([[0, 0]], tf.int64))  # built: its tables exist before a restore
    return layer


def train(layer, optimizer, batches):
    for ids in batches:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(tf.constant(ids), training=True) - 0.5))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def save_rows(layer, path):
    """The logical table's rows (the full export), each shard's stored values, by key, and its checksum."""
    full = layer.export_table()
    stored = [t.export(stored_values=True) for t in layer.tables]
    np.savez(path, keys=full["keys"].numpy(), values=full["values"].numpy(), meta=full["meta"].numpy(),
             stored_keys=np.concatenate([s["keys"].numpy() for s in stored]),
             stored=np.concatenate([s["values"].numpy() for s in stored]),
             devices=np.array([t._resource_device for t in layer.tables]),  # pylint: disable=protected-access
             checksum=ttf.embedding.table_summary(layer)[1])


def serving_rows(layer, path):
    """An int8 HashedTable of the layer (each shard built on its table's device): keys and packed rows."""
    frozen = HashedTable(layer, dtype=tf.int8)
    np.savez(path, keys=np.concatenate([s.keys.numpy()[:-1] for s in frozen.shards]),
             packed=np.concatenate([s.rows.numpy()[:-1] for s in frozen.shards]),
             devices=np.array([s.rows.device for s in frozen.shards]))


def main(out):
    ports = free_ports(4)
    cluster = tf.train.ClusterSpec({"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{p}" for p in ports[1:]]})
    servers = [tf.distribute.Server(cluster, "ps", i, start=True) for i in range(3)]  # noqa: F841 (kept alive)
    tf.config.experimental_connect_to_cluster(cluster, job_name="chief", task_index=0)
    ps = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(3)]
    chief = "/job:chief/replica:0/task:0/device:CPU:0"
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 600, size=(128, 2)) for _ in range(4)]
    for rows in ("int8", "bf16"):
        on_ps, on_chief = layer_on(ps[:2], rows, f"{rows}_ps"), layer_on([chief] * 2, rows, f"{rows}_chief")
        ps_optimizer = ttf.optimizers.Adam(0.05)
        directory = os.path.join(out, f"{rows}_ckpt")
        with tf.device(ps[2]):  # a variable on another task: TensorFlow then traces the save and restore
            dense = tf.Variable(1.5)
        manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=on_ps, dense=dense), directory,
                                                   full_every=3)
        train(on_ps, ps_optimizer, batches[:2])
        manager.save(1)
        train(on_ps, ps_optimizer, batches[2:])
        manager.save(2)
        train(on_chief, ttf.optimizers.Adam(0.05), batches)
        save_rows(on_ps, os.path.join(out, f"{rows}-ps.npz"))
        save_rows(on_chief, os.path.join(out, f"{rows}-chief.npz"))
        serving_rows(on_ps, os.path.join(out, f"{rows}-serving.npz"))
        for target, devices in (("three_ps", ps), ("one", [chief])):
            restored = layer_on(devices, rows, f"{rows}_{target}")
            with tf.device(ps[2]):
                dense = tf.Variable(0.0)
            assert ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=restored, dense=dense), directory,
                                                    full_every=3).restore_latest() == 2
            save_rows(restored, os.path.join(out, f"{rows}-{target}.npz"))
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
