"""ttf layers follow tf.keras conventions where users call them: a plain GradientTape loop
trains the tables, schedules reach table updates at the current step, stock Keras
optimizers are converted or refused clearly, import order is checked, a SavedModel loads
in a fresh process, and .keras files round-trip the tables (.h5 is refused)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.embedding.test_layers import toy_data, toy_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code, tmp_path, env=None):
    script = tmp_path / "script.py"
    script.write_text(code)
    full_env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    full_env.update(env or {}, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300, env=full_env)


# ---------------------------------------------------------------- training=None

def test_plain_tape_loop_calling_model_x_trains_the_table():
    model, emb = toy_model()
    opt = ttf.optimizers.Adam(0.02)
    ids, labels = toy_data(1024)
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    losses = []
    for _ in range(6):
        for i in range(0, 1024, 128):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels[i:i + 128], model(ids[i:i + 128])[:, 0])  # training=None
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            losses.append(float(loss))
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])
    assert int(emb.size()) > 0


def test_inference_calls_never_grow_the_table():
    model, emb = toy_model()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    ids, labels = toy_data(256)
    model(ids)  # training=None outside a tape: inference
    model(ids, training=False)
    model.predict(ids, verbose=0)
    model.evaluate(ids, labels, verbose=0)
    assert int(emb.size()) == 0
    with tf.GradientTape():
        model(ids, training=False)  # explicit training=False stays find-only even under a tape
    assert int(emb.size()) == 0


def test_a_frozen_table_is_find_only_as_a_frozen_keras_embedding():
    model, emb = toy_model()
    ids, labels = toy_data(256)
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    model.train_on_batch(ids[:8], labels[:8])  # rows are inserted by the update
    before = int(emb.size())
    emb.trainable = False  # a frozen layer: its rows stay as they are, and no new id gets one
    with tf.GradientTape():
        model(ids, training=True)
    assert int(emb.size()) == before > 0
    assert not any(v is emb.anchor for v in model.trainable_variables)


def test_a_table_without_gradient_warns_naming_it_and_the_cause():
    model, emb = toy_model()
    opt = ttf.optimizers.Adam(0.01)
    ids, labels = toy_data(128)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels[:, None], model(ids, training=False)))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.warns(UserWarning, match=f"table {emb.name} got no gradient.*training=False"):
        opt.apply_gradients(zip(grads, model.trainable_variables))


# ---------------------------------------------------------------- learning rate

def _sgd_rows_after(opt, steps):
    """A table and a dense variable with the same gradient (1 per element) under one
    optimizer; returns both after `steps` updates."""
    layer = ttf.DynamicEmbedding(2, initializer="zeros")
    dense = tf.Variable(tf.zeros([1, 2]))
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant([7], tf.int64))) + tf.reduce_sum(dense)
        variables = [layer.anchor, dense]
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return layer(tf.constant([7], tf.int64), training=False).numpy(), dense.numpy()


@pytest.mark.parametrize("with_dense", [True, False])
def test_a_schedule_reaches_table_updates_at_the_current_step(with_dense):
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([0, 1, 2], [1.0, 0.5, 0.25, 0.125])
    opt = ttf.optimizers.SGD(schedule)
    layer = ttf.DynamicEmbedding(2, initializer="zeros")
    dense = tf.Variable(tf.zeros([1, 2]))
    for _ in range(4):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant([7], tf.int64)))
            if with_dense:
                loss += tf.reduce_sum(dense)
        variables = [layer.anchor] + ([dense] if with_dense else [])
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    # steps 0..3 use lr 1.0 (step <= 0), 0.5, 0.25, 0.125 on a gradient of 1
    expected = -(1.0 + 0.5 + 0.25 + 0.125)
    np.testing.assert_allclose(layer(tf.constant([7], tf.int64), training=False).numpy(), [[expected] * 2], rtol=1e-6)
    if with_dense:
        np.testing.assert_allclose(dense.numpy(), [[expected] * 2], rtol=1e-6)
    np.testing.assert_allclose(float(opt.learning_rate), 0.125)


def test_a_changed_learning_rate_reaches_the_next_table_update():
    opt = ttf.optimizers.SGD(1.0)
    table_row, _ = _sgd_rows_after(opt, 1)
    np.testing.assert_allclose(table_row, [[-1.0, -1.0]])
    opt.learning_rate = 0.25
    layer = ttf.DynamicEmbedding(2, initializer="zeros")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([7], tf.int64)))
    opt.apply_gradients([(tape.gradient(loss, layer.anchor), layer.anchor)])
    np.testing.assert_allclose(layer(tf.constant([7], tf.int64), training=False).numpy(), [[-0.25, -0.25]])


# ---------------------------------------------------------------- stock Keras optimizers

@pytest.mark.parametrize("optimizer", ["adam", tf.keras.optimizers.Adagrad(0.5), tf.keras.optimizers.legacy.Adam(0.02)])
def test_compile_converts_a_stock_optimizer_with_a_notice(optimizer, capfd):
    model, emb = toy_model()
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["AUC"])
    assert "converted to ttf.optimizers." in capfd.readouterr().err
    assert isinstance(model.optimizer, ttf.optimizers._TableUpdates)
    ids, labels = toy_data()
    history = model.fit(ids, labels, epochs=3, batch_size=128, verbose=0).history
    assert history["auc"][-1] > 0.9 and int(emb.size()) > 0


def test_compile_refuses_an_optimizer_without_ttf_twin():
    model, _ = toy_model()
    with pytest.raises(ValueError, match="ttf tables.*ttf.optimizers.*RMSprop has no ttf twin"):
        model.compile(optimizer="rmsprop", loss="binary_crossentropy")
    with pytest.raises(ValueError, match="momentum"):
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9), loss="binary_crossentropy")


def test_stock_optimizer_in_a_custom_loop_is_refused_naming_ttf_optimizers():
    model, emb = toy_model()
    ids, labels = toy_data(128)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels[:, None], model(ids)))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(TypeError, match=f"cannot train ttf tables \\['{emb.name}'\\].*ttf.optimizers.from_keras"):
        tf.keras.optimizers.Adam().apply_gradients(zip(grads, model.trainable_variables))


def test_models_without_tables_keep_stock_optimizers():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(optimizer="rmsprop", loss="mse")
    assert type(model.optimizer) is tf.keras.optimizers.RMSprop


# ---------------------------------------------------------------- import order, fresh process

def test_import_ttf_after_keras3_resolved_raises_naming_cause_and_fix(tmp_path):
    proc = run_python("import tensorflow as tf\ntf.keras.layers.Dense\nimport ttf\n", tmp_path)
    assert proc.returncode != 0
    assert "already resolved to keras (Keras 3)" in proc.stderr
    assert "import ttf` before" in proc.stderr and "TF_USE_LEGACY_KERAS=1" in proc.stderr


@pytest.mark.slow  # three fresh TensorFlow processes
@pytest.mark.parametrize("first", ["import tensorflow as tf", "import deepctr.models", ""])
def test_import_orders_that_work(first, tmp_path):
    env = {"TF_USE_LEGACY_KERAS": "1"} if first == "import deepctr.models" else {}
    code = (f"{first}\nimport ttf\nimport tensorflow as tf\n"
            "m = tf.keras.Sequential([tf.keras.Input([2], dtype=tf.int64), ttf.FusedEmbedding(4, 2)])\n"
            "m.compile('adam', 'mse')\nm.fit(tf.constant([[1, 2]], tf.int64), tf.zeros([1, 2, 4]), verbose=0)\n"
            "print('size', int(m.layers[0].size()))\n")
    proc = run_python(code, tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "size 2" in proc.stdout


def test_saved_model_loads_in_a_fresh_process(tmp_path):
    model, _ = toy_model()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    ids, labels = toy_data(512)
    model.fit(ids, labels, epochs=2, batch_size=128, verbose=0)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "expected.npy", model.predict(ids, verbose=0))
    proc = run_python(
        "import numpy as np\nimport ttf\nimport tensorflow as tf\n"
        "serve = tf.saved_model.load('sm').signatures['serving_default']\n"
        "(out,) = serve(tf.constant(np.load('ids.npy'))).values()\n"
        "np.testing.assert_allclose(out.numpy(), np.load('expected.npy'), rtol=1e-5, atol=1e-6)\n"
        "print('predicted', out.shape[0])\n",
        tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]  # without the op library: Op type not registered
    assert "predicted 512" in proc.stdout


# ---------------------------------------------------------------- .keras and .h5

def _sorted_export(layer):
    exported = layer.tables[0].export()
    order = np.argsort(exported["keys"].numpy())
    return {k: exported[k].numpy()[order] for k in ("keys", "values", "meta")}


def test_keras_file_round_trips_rows_and_optimizer_slots(tmp_path):
    model, emb = toy_model(admission_min_count=2)
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    ids, labels = toy_data(1024)
    model.fit(ids, labels, epochs=2, batch_size=256, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    emb2 = next(layer for layer in loaded.layers if isinstance(layer, ttf.FusedEmbedding))
    assert emb2.tables[0]._shared_name != emb.tables[0]._shared_name  # a table of its own
    a, b = _sorted_export(emb), _sorted_export(emb2)
    assert len(a["keys"]) > 0
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # rows and Adam's m, v beside them
    np.testing.assert_array_equal(emb.tables[0].export()["candidate_keys"].numpy().size,
                                  emb2.tables[0].export()["candidate_keys"].numpy().size)
    assert isinstance(loaded.optimizer, ttf.optimizers.Adam)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations)
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))
    # Training on continues identically: table slots, dense slots and step all came back.
    model.fit(ids, labels, epochs=1, batch_size=256, shuffle=False, verbose=0)
    loaded.fit(ids, labels, epochs=1, batch_size=256, shuffle=False, verbose=0)
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0), rtol=1e-6, atol=1e-7)


def test_keras_file_holds_the_logical_table_of_a_sharded_layer(tmp_path):
    """A layer with 3 shards saves one logical table; loading rebuilds it (config has no
    devices) as 1 shard holding every id, with the same predictions."""
    model, emb = toy_model(shard_devices=["/cpu:0"] * 3)
    model.compile(optimizer=ttf.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    ids, labels = toy_data(1024)
    model.fit(ids, labels, epochs=1, batch_size=256, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    emb2 = next(layer for layer in loaded.layers if isinstance(layer, ttf.FusedEmbedding))
    assert len(emb.tables) == 3 and len(emb2.tables) == 1
    assert min(int(t.size()) for t in emb.tables) > 0  # every shard held ids
    np.testing.assert_array_equal(np.sort(emb2.tables[0].export()["keys"].numpy()),
                                  np.sort(emb.export_table()["keys"].numpy()))
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0), rtol=1e-6, atol=1e-7)


def test_keras_file_of_an_untrained_model_and_weights_file(tmp_path):
    model, emb = toy_model()
    model(toy_data(8)[0])
    model.save(str(tmp_path / "fresh.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "fresh.keras"), compile=False)
    assert int(loaded.layers[1].size()) == 0
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    model.train_on_batch(*toy_data(8))  # rows are inserted by the update
    model.save_weights(str(tmp_path / "w.weights.h5"))
    loaded.load_weights(str(tmp_path / "w.weights.h5"))
    assert int(loaded.layers[1].size()) == int(emb.size()) > 0


def test_h5_save_is_refused_before_writing_anything(tmp_path):
    model, emb = toy_model()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    for save in (lambda: model.save(str(tmp_path / "m.h5")), lambda: model.save_weights(str(tmp_path / "w.h5"))):
        with pytest.raises(ValueError, match=f"ttf tables \\['{emb.name}'\\].*HDF5.*model.keras"):
            save()
    assert not (tmp_path / "m.h5").exists()
