"""Run by test_publish.py in a process of its own (it connects to a cluster): two in-process
parameter servers and a chief. A FusedEmbedding sharded over the 2 PS is trained, published
(base + deltas, with evictions) and followed by a DeltaFollower on the chief. Records the
device each part's serialized rows lived on (they must be on the shard's PS) and whether the
follower serves every key's row bit for bit. Prints one JSON line; the test asserts on it."""
import json
import os
import socket
import sys
import tempfile

import numpy as np
import tensorflow as tf

import ttf
from ttf.serving import _publish

DIM = 4


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def main():
    ports = [free_port() for _ in range(3)]
    cluster = tf.train.ClusterSpec({"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{p}" for p in ports[1:]]})
    servers = [tf.distribute.Server(cluster, "ps", i, start=True) for i in range(2)]  # noqa: F841 (kept alive)
    tf.config.experimental_connect_to_cluster(cluster, job_name="chief", task_index=0)
    ps = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)]

    ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
    layer = ttf.FusedEmbedding(DIM, num_fields=2, name="sparse", shard_devices=ps)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
    model(tf.constant([[1, 2]], tf.int64))
    optimizer = ttf.optimizers.Adagrad(0.1)

    def train(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(tf.constant(batch, tf.int64), training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    written = []
    real_write = _publish._write_file

    def recording_write(path, blob):
        written.append((os.path.basename(path), blob.device))
        return real_write(path, blob)

    _publish._write_file = recording_write
    base = tempfile.mkdtemp()
    clock = [0.0]
    publisher = ttf.serving.Publisher(model, base, publish_every=1, dense_publish_every=1e9, clock=lambda: clock[0])
    rng = np.random.default_rng(0)
    train(rng.integers(0, 300, size=[64, 2]))
    publisher.publish()
    follower = ttf.serving.DeltaFollower(base)
    seen = set()
    for _ in range(3):
        batch = rng.integers(0, 600, size=[64, 2])
        seen |= set(layer.keys_of(tf.constant(batch, tf.int64))[0].numpy().ravel().tolist())
        train(batch)
        layer.evict(before_step=int(layer.tables[0].stats()[2]) - 1)
        clock[0] += 1
        publisher.publish()
    follower.sync()
    expected = {}
    for table in layer.tables:  # the reference: each shard's rows (read to the chief for the check only)
        exported = table.export()
        expected.update(zip(exported["keys"].numpy().tolist(), exported["values"].numpy()[:, :DIM]))
    keys = np.array(sorted(seen | set(expected)), np.int64)
    served = follower.lookup("sparse", keys).numpy()
    want = np.stack([expected.get(int(k), np.zeros(DIM, np.float32)) for k in keys])
    print(json.dumps({
        "sequence": follower.sequence, "refused": follower.refused, "keys": len(keys), "held": len(expected),
        "equal": bool(np.array_equal(served, want)),
        "parts": [[name, device] for name, device in written if name.startswith("sparse-")],
    }))


if __name__ == "__main__":
    sys.exit(main())
