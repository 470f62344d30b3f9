"""ttf.export_for_serving: a SavedModel that plain TensorFlow (no ttf, no op library) loads
and serves, predicting what the trained model predicts."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from models import ctr

# Runs in a fresh interpreter that never imports ttf: loads the SavedModel, scans its
# graph for ttf ops, and writes the signature's inputs and predictions.
PLAIN_TF = r"""
import json, sys
import numpy as np
import pytest
import tensorflow as tf

path, inputs_file, out_file = sys.argv[1:]
loaded = tf.saved_model.load(path)
serve = loaded.signatures["serving_default"]
graph = serve.graph.as_graph_def()
ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
inputs = dict(np.load(inputs_file))
outputs = serve(**{name: tf.constant(value) for name, value in inputs.items()})
assert "ttf" not in sys.modules and not any(name.startswith("ttf") for name in sys.modules)
np.savez(out_file, **{name: t.numpy() for name, t in outputs.items()})
print(json.dumps({"ttf_ops": sorted(op for op in ops if op.startswith("Ttf")),
                  "inputs": {s.name: [s.dtype.name, s.shape.as_list()] for s in serve.structured_input_signature[1].values()},
                  "outputs": sorted(outputs)}))
"""


def serve_in_plain_tensorflow(path, inputs, tmp_path):
    np.savez(tmp_path / "inputs.npz", **inputs)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-c", PLAIN_TF, str(path), str(tmp_path / "inputs.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ttf_ops"] == []
    return report, dict(np.load(tmp_path / "out.npz"))


def test_criteo_model_serves_in_plain_tensorflow(tmp_path):
    spec = ctr.ModelSpec(model="fm", embedding_dim=4, mlp=(16,))
    model = ctr.build(spec, "ttf", seed=1, shard_devices=["/cpu:0", "/cpu:0"])
    optimizer = ctr.make_optimizer("ttf", "adam", 0.01)
    reader = ttf.data.CriteoReader([ctr_sample()])
    for features, labels in reader.dataset(32, shuffle=False).take(5):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=model.logits(
                features, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    features = next(iter(reader.dataset(64, shuffle=False, split="eval")))[0]
    ids = features["ids"].numpy()
    ids[:3, :5] = np.arange(15).reshape(3, 5) + (1 << 45)  # ids the table never saw: default row
    inputs = {"ids": ids, "dense": features["dense"].numpy()}
    expected = model({k: tf.constant(v) for k, v in inputs.items()}, training=False).numpy()
    size = int(model.sparse.size())

    version = ttf.export_for_serving(model, str(tmp_path / "serving"))
    assert version == str(tmp_path / "serving" / "1")  # TF Serving's layout: base/<version>/
    report, outputs = serve_in_plain_tensorflow(version, inputs, tmp_path)
    assert report["inputs"] == {"ids": ["int64", [None, 26]], "dense": ["float32", [None, 13]]}
    assert report["outputs"] == ["probability"]
    np.testing.assert_allclose(outputs["probability"], expected, rtol=0, atol=1e-6)
    assert int(model.sparse.size()) == size  # exporting and serving never grow the live table


def ctr_sample():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                        "criteo_sample.txt")


def test_users_keras_model_with_ttf_layers_serves(tmp_path):
    user_ids = tf.keras.Input([], dtype=tf.int64, name="user_id")
    item_ids = tf.keras.Input([3], dtype=tf.int64, name="item_ids")
    users = ttf.DynamicEmbedding(6, initializer="normal", default_value=0.25, shard_devices=["/cpu:0"] * 3,
                                 name="users")
    items = ttf.FusedEmbedding(6, num_fields=3, tag_fields=True, seed=4, name="items")
    x = tf.keras.layers.Concatenate()([users(user_ids), tf.keras.layers.Flatten()(items(item_ids))])
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Dense(8, activation="relu")(x))
    model = tf.keras.Model([user_ids, item_ids], out)
    model.compile(optimizer=ttf.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    u, i = rng.integers(-1000, 1000, size=512), rng.integers(0, 30, size=(512, 3))
    model.fit([u, i], (u % 2 == 0).astype(np.float32), batch_size=64, epochs=2, verbose=0)
    test_u = np.concatenate([u[:20], [5000, -5000]])  # two unseen users
    test_i = np.concatenate([i[:20], [[1, 2, 3], [99, 98, 97]]])
    expected = model.predict([test_u, test_i], verbose=0)

    version = ttf.export_for_serving(model, str(tmp_path / "serving"))
    report, outputs = serve_in_plain_tensorflow(version, {"user_id": test_u, "item_ids": test_i},
                                                tmp_path)
    assert report["inputs"] == {"user_id": ["int64", [None]], "item_ids": ["int64", [None, 3]]}
    np.testing.assert_allclose(outputs["probability"], expected, rtol=0, atol=1e-6)


def test_frozen_table_reads_held_rows_and_the_default_row():
    layer = ttf.DynamicEmbedding(3, default_value=-2.0)
    keys = tf.constant([7, -3, 1 << 50, tf.int64.max - 1], tf.int64)
    with tf.GradientTape() as tape:  # rows are stored by the update (a lookup inserts nothing)
        loss = tf.reduce_sum(layer(keys, training=True))
    grads = tape.gradient(loss, layer.trainable_variables)
    ttf.optimizers.SGD(0.1).apply_gradients(zip(grads, layer.trainable_variables))
    live = layer(keys, training=False).numpy()
    frozen = ttf.serving.FrozenTable(layer)
    probe = tf.constant([1 << 50, 8, -3, tf.int64.max, tf.int64.min, 7, tf.int64.max - 1], tf.int64)
    np.testing.assert_array_equal(frozen.lookup(probe).numpy(), layer(probe, training=False).numpy())
    np.testing.assert_array_equal(frozen.lookup(keys).numpy(), live)
    empty = ttf.serving.FrozenTable(ttf.DynamicEmbedding(3, default_value=1.5))
    np.testing.assert_array_equal(empty.lookup(probe).numpy(), np.full((7, 3), 1.5, np.float32))


def test_train_cli_exports_a_serving_model(tmp_path):
    root = os.path.dirname(ctr_sample()).rsplit(os.sep, 1)[0]
    out = subprocess.run([sys.executable, os.path.join(root, "models", "train.py"), "--model", "wdl", "--tiacc",
                          "--steps", "6", "--batch-size", "16", "--precision", "fp32", "--data", ctr_sample(),
                          "--export-dir", str(tmp_path / "serving")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "serving SavedModel (stock TensorFlow ops only) written to" in out.stdout
    features = next(iter(ttf.data.CriteoReader([ctr_sample()]).dataset(8, shuffle=False)))[0]
    report, outputs = serve_in_plain_tensorflow(tmp_path / "serving" / "1", {k: v.numpy() for k, v in features.items()},
                                                tmp_path)
    assert report["outputs"] == ["probability"] and outputs["probability"].shape == (8,)
    assert ((outputs["probability"] > 0) & (outputs["probability"] < 1)).all()


def reference_lookup(keys, rows, default_row, probe):
    """NumPy reference: a dict from held key to its row, the default row otherwise."""
    table = dict(zip(keys.tolist(), rows))
    return np.stack([table.get(k, default_row) for k in probe.tolist()])


@pytest.mark.parametrize("count", [0, 1, 2, 1000, 50_000])
def test_hashed_shard_finds_every_held_key_and_only_those(count):
    rng = np.random.default_rng(count)
    # Keys that share low bits (multiples of 1024, field-tagged) and random 64-bit ones, negatives too.
    keys = np.unique(np.concatenate([rng.integers(-(1 << 62), 1 << 62, size=count // 2),
                                     (np.arange(count - count // 2) * 1024) | (7 << 56)]))[:count]
    rows = rng.normal(size=(len(keys), 4)).astype(np.float32)
    default = np.full(4, -2.5, np.float32)
    shard = ttf.serving.HashedShard(tf.constant(keys, tf.int64), tf.constant(rows), tf.constant(default[None]))
    probe = np.concatenate([keys, rng.integers(-(1 << 62), 1 << 62, size=500), [np.iinfo(np.int64).min, 0,
                                                                                np.iinfo(np.int64).max]])
    expected = reference_lookup(keys, rows, default, probe)
    np.testing.assert_array_equal(shard.lookup(tf.constant(probe, tf.int64)).numpy(), expected)  # exact: a copy
    assert shard.probe <= 16  # about one key per bucket: a short probe


def test_hashed_table_fp16_rows_and_shard_routing():
    layer = ttf.DynamicEmbedding(5, default_value=0.5, shard_devices=["/cpu:0"] * 3)
    keys = tf.constant(np.arange(0, 3000, 3), tf.int64)  # multiples of the shard count: one shard under floormod
    with tf.GradientTape() as tape:  # rows are stored by the update (a lookup inserts nothing)
        loss = tf.reduce_sum(layer(keys, training=True))
    ttf.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                                                 layer.trainable_variables))
    live = layer(keys, training=False).numpy()
    assert int(layer.size()) == 1000
    table = ttf.serving.HashedTable(layer)
    assert [int(tf.size(s.keys)) - 1 for s in table.shards] == [int(t.size()) for t in layer.tables]
    probe = tf.concat([keys, [1, 2, -7]], 0)
    np.testing.assert_array_equal(table.lookup(probe).numpy(), layer(probe, training=False).numpy())
    half = ttf.serving.HashedTable(layer, dtype=tf.float16)
    assert half.shards[0].rows.dtype == tf.float16
    np.testing.assert_allclose(half.lookup(keys).numpy(), live, rtol=1e-3, atol=1e-4)  # fp16: 11-bit mantissa
    with pytest.raises(ValueError, match="row_dtype must be tf.float32, tf.float16 or tf.int8"):
        ttf.serving.HashedTable(layer, dtype=tf.int32)


def test_versions_are_new_folders_written_whole(tmp_path):
    ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids)))
    model = tf.keras.Model(ids, out)
    model(tf.constant([[1, 2]], tf.int64), training=True)
    base = tmp_path / "ctr"
    assert ttf.export_for_serving(model, base) == str(base / "1")
    assert ttf.export_for_serving(model, base) == str(base / "2")
    assert ttf.export_for_serving(model, base, version=10) == str(base / "10")
    assert ttf.serving.versions(str(base)) == [1, 2, 10]
    assert sorted(os.listdir(base)) == ["1", "10", "2"]  # no temporary folder left behind
    with pytest.raises(ValueError, match="exists; TF Serving never reloads a version in place"):
        ttf.export_for_serving(model, base, version=2)
    with pytest.raises(ValueError, match="version must be a positive int"):
        ttf.export_for_serving(model, base, version=0)
    assert (base / "1" / "saved_model.pb").exists() and (base / "1" / "variables").is_dir()


# Two logical CPU devices stand for two parameter servers: each shard's frozen arrays must be
# built and kept on its own device (so the saver writes them there), never gathered in one place.
TWO_DEVICES = r"""
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import ttf
layer = ttf.DynamicEmbedding(3, shard_devices=["/cpu:0", "/cpu:1"])
layer(tf.range(100, dtype=tf.int64), training=True)
table = ttf.serving.HashedTable(layer)
for i, shard in enumerate(table.shards):
    for variable in (shard.keys, shard.offsets, shard.rows):
        assert variable.device.endswith(f"CPU:{i}"), (i, variable.name, variable.device)
probe = tf.range(-5, 105, dtype=tf.int64)
assert (table.lookup(probe).numpy() == layer(probe, training=False).numpy()).all()
print("ok")
"""


def test_each_shard_is_frozen_on_its_own_device():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", TWO_DEVICES], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.slow
def test_parameter_server_job_exports_shard_by_shard_and_serves_what_it_trained(tmp_path):
    """start_all.sh (1 ps + 2 workers + chief) with --export-dir: the version is written from the
    parameter server's shards (its variables file in one piece per device), and plain TensorFlow
    predicts the eval rows with the AUC the trainer reported."""
    from tests.distribute.test_cluster import finish, start
    cache, metrics, base = tmp_path / "cache", tmp_path / "m.json", tmp_path / "serving"
    out = finish(start("--steps", "30", "--synthetic-rows", "5000", "--export-dir", str(base), "--metrics-out",
                       str(metrics), "--", "--cache-dir", str(cache)))
    assert f"written to {base / '1'}" in out, out[-3000:]
    assert sorted(os.listdir(base)) == ["1"]
    assert len([n for n in os.listdir(base / "1" / "variables") if n.startswith("variables.data-")]) == 2
    data = [str(cache / name) for name in os.listdir(cache) if name.endswith(".txt")]
    features, labels = next(iter(ttf.data.CriteoReader(data).dataset(5000, shuffle=False, split="eval")))
    _, outputs = serve_in_plain_tensorflow(base / "1", {k: v.numpy() for k, v in features.items()}, tmp_path)
    served_auc = ttf.data.best_auc(labels.numpy(), outputs["probability"])
    assert served_auc == pytest.approx(json.loads(metrics.read_text())["auc"], abs=1e-4)
