"""Run by test_sharded_checkpoints.py in a process of its own (it connects to a cluster):
three in-process parameter servers and a chief. A table sharded over 2 PS is saved
(a save spanning several tasks, so TensorFlow traces it) and restored into 3 PS and into
the chief alone, through full and delta checkpoints; every op of the traced save and
restore that touches a shard's rows is checked to run on that shard's PS. Prints one JSON
line of findings; the test asserts on it."""
import json
import socket
import sys
import tempfile

import numpy as np
import tensorflow as tf

import ttf
from table_order import by_key
from ttf.checkpoint import _format

ROW_OUTPUTS = 5  # TtfTableExport's keys, values, meta, candidate_keys, candidate_meta


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def task_of(device):
    spec = tf.DeviceSpec.from_string(device or "")
    return (spec.job or "chief", spec.task or 0)


def layer_on(devices, name="emb"):
    return ttf.DynamicEmbedding(4, seed=3, admission_min_count=2, shard_devices=devices, name=name)


def train(layer, optimizer, batches):
    for ids in batches:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(tf.constant(ids), training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def differences(a, b):
    fields = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "step")
    return [f for f in fields if not np.array_equal(a[f], b[f])]


def ops_of(graph):
    """Every op of `graph` and of the functions it calls (while bodies), with the device of
    the outermost op that holds it (a body runs on its While's device)."""
    found = []

    def walk(g, outer_device):
        for op in g.get_operations():
            device = op.device or outer_device
            found.append((op, device))
            for attr in ("body", "cond"):
                if attr in op.node_def.attr:
                    walk(g._get_function(op.node_def.attr[attr].func.name).graph, device)  # pylint: disable=protected-access

    walk(graph, "")
    return found


def misplaced_save_ops(logical):
    """Ops of the traced save that read a shard's rows off that shard's task."""
    graph = tf.function(lambda prefix: _format._save({"t": logical}, prefix)).get_concrete_function(  # pylint: disable=protected-access
        tf.TensorSpec([], tf.string)).graph
    bad = []
    for op, device in ops_of(graph):
        if op.type == "TtfTableExport":
            for out in op.outputs[:ROW_OUTPUTS]:
                for consumer in out.consumers():
                    if task_of(consumer.device) != task_of(device):
                        bad.append(f"{consumer.type} on {consumer.device!r} reads {out.name} of {device}")
    return bad


def misplaced_restore_ops(logical):
    """Ops of the traced restore that read pieces or import rows off the target shard's task."""
    graph = tf.function(lambda prefix: _format._restore({"t": logical}, prefix)).get_concrete_function(  # pylint: disable=protected-access
        tf.TensorSpec([], tf.string)).graph
    bad, devices = [], {task_of(t._resource_device) for t in logical.layer.tables}  # pylint: disable=protected-access
    for op, device in ops_of(graph):
        on_shard = ("TtfTableImport", "TtfTableImportStored", "TtfTableRemove", "While")
        if op.type in on_shard and task_of(device) not in devices:
            bad.append(f"{op.type} {op.name} on {device!r}")
        if op.type == "RestoreV2" and task_of(device) not in devices and "part-" in str(op.inputs[1]):
            bad.append(f"RestoreV2 {op.name} reads pieces on {device!r}")
    return bad


def main():
    ports = [free_port() for _ in range(4)]
    cluster = tf.train.ClusterSpec({"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{p}" for p in ports[1:]]})
    servers = [tf.distribute.Server(cluster, "ps", i, start=True) for i in range(3)]  # noqa: F841 (kept alive)
    tf.config.experimental_connect_to_cluster(cluster, job_name="chief", task_index=0)
    ps = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(3)]
    chief = "/job:chief/replica:0/task:0/device:CPU:0"
    _format.PIECE_BYTES = 2048  # several pieces per shard at this size
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 3000, size=(256, 4)) * 3 for _ in range(4)]  # all multiples of 3

    source, optimizer = layer_on(ps[:2]), ttf.optimizers.Adam(0.05)
    train(source, optimizer, batches[:2])
    directory = tempfile.mkdtemp()
    with tf.device(ps[2]):  # a variable on another task: TensorFlow then traces the save and restore
        dense = tf.Variable(1.5)
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=source, dense=dense), directory, full_every=3)
    findings = {"save_misplaced": misplaced_save_ops(source.logical_table)}
    full = manager.save(1)
    findings["pieces"] = sum("/part-" in n and n.endswith("/keys") for n, _ in tf.train.list_variables(full))
    train(source, optimizer, batches[2:])
    source.evict(min_count=3)  # deletions for the delta to carry
    delta = manager.save(2)
    findings["delta"] = delta.rsplit("/", 1)[1]
    want = by_key(source.export_table())
    findings["keys"] = int(len(want["keys"]))
    findings["shard_sizes"] = [int(t.size()) for t in source.tables]

    for name, devices in (("three_ps", ps), ("chief", [chief])):
        target = layer_on(devices)
        target(tf.constant([[0, 0, 0, 0]], tf.int64))  # built: its tables exist
        findings[f"{name}_restore_misplaced"] = misplaced_restore_ops(target.logical_table) if len(devices) > 1 else []
        with tf.device(ps[2]):
            dense = tf.Variable(0.0)
        restored = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=target, dense=dense), directory,
                                                    full_every=3)
        findings[f"{name}_step"] = restored.restore_latest()
        findings[f"{name}_dense"] = float(dense.numpy())
        findings[f"{name}_differences"] = differences(by_key(target.export_table()), want)
        findings[f"{name}_shard_sizes"] = [int(t.size()) for t in target.tables]
    print(json.dumps(findings))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
