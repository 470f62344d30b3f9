"""Run by test_train_step.py in a process of its own (it connects to a cluster): one
PrecisionTrainStep made over a ParameterServerStrategy (in-process servers: 1 ps, 1 worker,
the chief) as docs/precision.md shows, against the same step in one process on the same
batches. Prints one JSON line of findings; the test asserts on it."""
import json
import socket

import numpy as np
import tensorflow as tf

import ttf
from ttf.precision import AdaptivePrecision, NonFiniteTrainingError, make_train_step


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def batches():
    """Seven batches; the labels of the fourth, sixth and seventh are NaN (a non-finite loss):
    the first five have one skipped step, all seven a run of two (max_non_finite_steps=2)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(7):
        ids = rng.integers(0, 50, (16, 2))
        labels = rng.integers(0, 2, (16, 1)).astype(np.float32)
        if i >= 3 and i != 4:
            labels[:] = np.nan
        out.append((tf.constant(ids, tf.int64), tf.constant(labels)))
    return out


def make(strategy, max_non_finite_steps=20):
    tf.keras.utils.set_random_seed(0)
    with strategy.scope() if strategy else tf.name_scope("local"):
        devices = ["/job:ps/replica:0/task:0/device:CPU:0"] if strategy else None  # a table lives where it is put
        layer = ttf.FusedEmbedding(4, num_fields=2, seed=1, shard_devices=devices, name="emb")
        dense = tf.keras.layers.Dense(1, kernel_initializer="ones")
        ids = tf.keras.Input((2,), dtype=tf.int64)
        model = tf.keras.Model(ids, dense(tf.keras.layers.Reshape((8,))(layer(ids))))
        optimizer = ttf.optimizers.Adam(0.05)
        policy = AdaptivePrecision("time", start_step=1, end_step=3)  # steps 1 and 2 in bf16
        loss = lambda y, logits: tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))  # noqa: E731
        step_fn = make_train_step(model, loss, optimizer, policy, max_non_finite_steps=max_non_finite_steps,
                                  strategy=strategy)
        step_fn.prepare()
    return model, step_fn


def layer_of(model):
    return next(layer for layer in model.layers if isinstance(layer, ttf.FusedEmbedding))


def state(model, step_fn):
    rows = layer_of(model).tables[0].export()
    order = np.argsort(rows["keys"].numpy())
    return {"rows": rows["values"].numpy()[order].tolist(), "kernel": model.layers[-1].kernel.numpy().tolist(),
            "skipped": int(step_fn.skipped_steps.numpy()), "low": int(step_fn.low_precision_steps.numpy()),
            "step": int(step_fn.step.numpy())}


def main():
    ports = [free_port() for _ in range(3)]
    cluster = tf.train.ClusterSpec({"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"],
                                    "worker": [f"localhost:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job, 0, start=True) for job in ("ps", "worker")]  # noqa: F841 (alive)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, task_type="chief", task_id=0,
                                                                    rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data = batches()

    def scheduled(step_fn, batches_):
        """Each batch's step on the worker, one at a time (one process's order): (low, skipped)."""
        worker_step = tf.function(step_fn.traced_step)
        out = []
        for features, labels in batches_:
            with step_fn.non_finite_errors():
                result = coordinator.schedule(worker_step, args=(features, labels)).fetch()
            out.append([bool(result["low_precision"]), bool(result["skipped"])])
        return out

    model, step_fn = make(strategy)
    found = {"results": scheduled(step_fn, data[:5]), "ps": state(model, step_fn),
             "table_device": layer_of(model).tables[0].resource_handle.device}

    local_model, local_step = make(None)
    for features, labels in data[:5]:
        local_step(features, labels)
    found["local"] = state(local_model, local_step)

    _, step_fn = make(strategy, max_non_finite_steps=2)
    try:
        scheduled(step_fn, data)
    except NonFiniteTrainingError as err:
        found["runaway"] = str(err)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
