"""ttf in `import keras` (Keras 3, TensorFlow backend) models: fit, a GradientTape loop,
schedules reaching the tables, .keras save/load with the rows, model.export() loading in a
fresh process, export_for_serving, compile's conversion, and the clear refusals. Run by
./test.sh in a process of its own with TF_USE_LEGACY_KERAS unset (TTF_TEST_KERAS=3)."""
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import ttf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tf_keras_is_keras_3_and_ttf_did_not_switch_it():
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    assert tf.keras.Model is keras.Model and keras.__version__.startswith("3.")
    assert issubclass(ttf.FusedEmbedding, keras.layers.Layer) and issubclass(ttf.optimizers.Adam, keras.optimizers.Adam)


def toy(dim=8, fields=4, **kwargs):
    ids = keras.Input([fields], dtype="int64", name="ids")
    emb = ttf.FusedEmbedding(dim, num_fields=fields, **kwargs)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(emb(ids)))
    return keras.Model(ids, out), emb


def data(n=512, fields=4, seed=0):
    x = np.random.default_rng(seed).integers(0, 1 << 40, size=(n, fields))
    return x, (x[:, 0] % 2).astype("float32")


def sorted_rows(emb):
    exported = emb.export_table()
    order = np.argsort(exported["keys"].numpy())
    return exported["keys"].numpy()[order], exported["values"].numpy()[order]


def test_fit_trains_the_table_and_the_loss_falls():
    model, emb = toy()
    model.compile(optimizer=ttf.optimizers.Adam(0.05), loss="binary_crossentropy")
    x, y = data(2048)
    history = model.fit(x, y, epochs=4, batch_size=256, verbose=0)
    assert int(emb.size()) == len(np.unique(x))  # every id got its own row
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.1, history.history["loss"]


def test_tape_loop_with_a_keras_3_schedule_matches_the_numpy_sgd_reference():
    """SGD on a table: row -= lr(step) * grad, with lr from a Keras 3 ExponentialDecay."""
    emb = ttf.DynamicEmbedding(3, initializer="zeros")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = ttf.optimizers.SGD(schedule)
    ids = tf.constant([5, 9, 5], tf.int64)
    target = np.ones([3, 3], np.float32)
    expected = {5: np.zeros(3, np.float32), 9: np.zeros(3, np.float32)}
    for step in range(3):
        with tf.GradientTape() as tape:
            rows = emb(ids)
            loss = tf.reduce_sum((rows - target) ** 2) / 2
        grads = tape.gradient(loss, emb.trainable_variables)
        opt.apply_gradients(zip(grads, emb.trainable_variables))
        lr = 0.1 * 0.5 ** step  # the schedule at this step (0-based iterations)
        grad = {k: 0 for k in expected}
        for key in (5, 9, 5):
            grad[key] = grad[key] + (expected[key] - 1.0)
        for key in expected:
            expected[key] = expected[key] - lr * grad[key]
    keys, values = sorted_rows(emb)
    assert keys.tolist() == [5, 9] and int(opt.iterations) == 3
    np.testing.assert_allclose(values, np.stack([expected[5], expected[9]]), rtol=1e-6, atol=1e-6)


def test_compile_converts_a_stock_keras_3_optimizer_with_a_notice(capfd):
    model, _ = toy()
    model.compile(optimizer=keras.optimizers.Adagrad(0.2), loss="binary_crossentropy")
    assert type(model.optimizer) is ttf.optimizers.Adagrad and float(model.optimizer.learning_rate) == pytest.approx(0.2)
    assert "converted to ttf.optimizers.Adagrad" in capfd.readouterr().err
    with pytest.raises(ValueError, match="ttf.optimizers"):
        toy()[0].compile(optimizer=keras.optimizers.RMSprop(), loss="binary_crossentropy")


def test_stock_optimizer_on_a_table_gradient_raises_naming_from_keras():
    emb = ttf.DynamicEmbedding(2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(tf.constant([1, 2], tf.int64)))
    grads = tape.gradient(loss, emb.trainable_variables)
    with pytest.raises(TypeError, match="from_keras"):
        keras.optimizers.Adam().apply_gradients(zip(grads, emb.trainable_variables))


def test_keras_file_round_trips_the_rows_and_adam_slots(tmp_path):
    model, emb = toy()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    x, y = data()
    model.fit(x, y, epochs=1, batch_size=128, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "m.keras"))
    emb2 = next(layer for layer in loaded.layers if isinstance(layer, ttf.FusedEmbedding))
    a, b = emb.export_table(), emb2.export_table()
    order_a, order_b = np.argsort(a["keys"].numpy()), np.argsort(b["keys"].numpy())
    assert a["keys"].numpy().size > 0
    for field in ("keys", "values", "meta"):  # values hold the rows and Adam's m and v beside them
        np.testing.assert_array_equal(a[field].numpy()[order_a], b[field].numpy()[order_b], err_msg=field)
    assert a["optimizer"].numpy() == b["optimizer"].numpy()
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_h5_saving_of_a_model_with_tables_is_refused_before_writing(tmp_path):
    model, _ = toy()
    model(data(8)[0])
    with pytest.raises(ValueError, match="HDF5"):
        model.save(str(tmp_path / "m.h5"))
    assert not (tmp_path / "m.h5").exists()


def run_fresh(code, cwd):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a fresh TensorFlow process
def test_model_export_loads_and_predicts_in_a_fresh_process_after_import_ttf(tmp_path):
    model, _ = toy()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    x, y = data()
    model.fit(x, y, epochs=1, batch_size=128, verbose=0)
    model.export(str(tmp_path / "exported"), verbose=False)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", model.predict(x, verbose=0))
    proc = run_fresh(
        "import numpy as np, tensorflow as tf, ttf\n"
        "m = tf.saved_model.load('exported')\n"
        "out = m.serve(tf.constant(np.load('x.npy')))\n"
        "np.testing.assert_allclose(out.numpy(), np.load('expected.npy'), rtol=1e-5, atol=1e-6)\n"
        "print('predicted', out.shape[0])\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "predicted 512" in proc.stdout


@pytest.mark.slow  # a fresh TensorFlow process
def test_export_for_serving_runs_on_stock_tensorflow_without_ttf(tmp_path):
    model, _ = toy()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    x, y = data()
    model.fit(x, y, epochs=1, batch_size=128, verbose=0)
    version = ttf.export_for_serving(model, str(tmp_path / "serving"))  # serving/1, TF Serving's layout
    assert version == str(tmp_path / "serving" / "1")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", model.predict(x, verbose=0))
    proc = run_fresh(  # no `import ttf`: the SavedModel needs only stock TensorFlow ops
        "import numpy as np, tensorflow as tf, sys\n"
        "m = tf.saved_model.load('serving/1')\n"
        "out = m.signatures['serving_default'](ids=tf.constant(np.load('x.npy')))['probability']\n"
        "assert 'ttf' not in sys.modules\n"
        "np.testing.assert_allclose(out.numpy(), np.load('expected.npy'), rtol=1e-5, atol=1e-6)\n"
        "print('served', out.shape[0])\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "served 512" in proc.stdout


def user_model():
    """A Keras 3 functional model as users write one: int fields, a StringLookup feeding an
    Embedding, a mask_zero sequence Embedding; compiled with a stock optimizer by name."""
    ins = {f"C{i}": keras.Input([1], dtype="int64", name=f"C{i}") for i in range(4)}
    word, seq = keras.Input([1], dtype="string", name="word"), keras.Input([5], dtype="int64", name="seq")
    embs = [keras.layers.Embedding(1000, 8, name=f"emb{i}")(ins[f"C{i}"]) for i in range(4)]
    embs.append(keras.layers.Embedding(4, 8, name="emb_word")(keras.layers.StringLookup(vocabulary=["a", "b", "c"])(word)))
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8, mask_zero=True, name="emb_seq")(seq))
    x = keras.layers.Concatenate()([keras.layers.Flatten()(e) for e in embs] + [pooled])
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(16, activation="relu")(x))
    model = keras.Model({**ins, "word": word, "seq": seq}, out)
    model.compile("adam", "binary_crossentropy")
    rng = np.random.default_rng(0)
    x = {f"C{i}": tf.constant(rng.integers(0, 1000, size=(512, 1))) for i in range(4)}
    x["word"] = tf.constant([["a"], ["b"], ["c"], ["zz"]] * 128)  # every 4th: out of vocabulary
    x["seq"] = tf.constant(rng.integers(0, 50, size=(512, 5)))
    return model, x, (x["C0"].numpy()[:, 0] % 2).astype("float32")


def test_accelerate_converts_a_keras_3_functional_model(tmp_path):
    model, x, y = user_model()
    before = [w.copy() for w in model.get_weights()]
    fast = ttf.accelerate(model)
    kinds = [type(layer).__name__ for layer in fast.layers]
    assert kinds.count("FusedLookup") == 1 and "Embedding" not in kinds  # one table: all dim 8, ids from inputs
    assert "StringLookup" not in kinds  # the table keys the string's hash: no vocabulary
    known = np.arange(512) % 4 != 3  # an out-of-vocabulary word reads the table's zeros until trained
    np.testing.assert_allclose(fast.predict(x, verbose=0)[known], model.predict(x, verbose=0)[known],
                               rtol=1e-5, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.Adam)
    losses = fast.fit(x, y, batch_size=64, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    for got, want in zip(model.get_weights(), before):  # the original model is left as it was
        np.testing.assert_array_equal(got, want)
    fast.save(tmp_path / "m.keras")
    back = keras.saving.load_model(tmp_path / "m.keras")
    assert back.compiled and isinstance(back.optimizer, ttf.optimizers.Adam)
    np.testing.assert_allclose(back.predict(x, verbose=0), fast.predict(x, verbose=0), rtol=1e-6)


def test_accelerate_converts_a_keras_3_sequential_model_and_refuses_an_unbuilt_subclassed_one():
    model = keras.Sequential([keras.Input([1], dtype="int64"), keras.layers.Embedding(100, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    fast = ttf.accelerate(model)
    ids = np.arange(8).reshape(8, 1)
    np.testing.assert_allclose(fast.predict(ids, verbose=0), model.predict(ids, verbose=0), rtol=1e-6)

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = keras.layers.Embedding(10, 2)

        def call(self, ids):
            return self.emb(ids)

    with pytest.raises(ValueError, match="has no weights yet; call it once on a batch"):
        ttf.accelerate(Sub())


def test_a_plain_keras_model_loads_compiled_after_import_ttf(tmp_path):
    """ttf's compile hook sits on Keras 3's Trainer.compile: a Model.compile override would
    make every .keras load skip compile_from_config (with only a warning)."""
    ids = keras.Input([2])
    model = keras.Model(ids, keras.layers.Dense(1)(ids))
    model.compile("sgd", "mse")
    model.save(tmp_path / "plain.keras")
    assert isinstance(keras.saving.load_model(tmp_path / "plain.keras").optimizer, keras.optimizers.SGD)


@pytest.mark.slow  # a fresh TensorFlow process
def test_readme_api_example_runs_unchanged_on_keras_3(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    example = re.search(r"## The API in 15 lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    example = example.replace("/tmp/ttf_readme_ckpt", str(tmp_path / "ckpt"))
    proc = run_fresh(example + "import keras\nassert tf.keras.Model is keras.Model\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(re.search(r"ids in the table: (\d+)", proc.stdout).group(1)) > 0


@pytest.mark.slow  # a fresh TensorFlow process
def test_readme_keras_3_accelerate_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    example = re.search(r"On Keras 3 the same call.*?```python\n(.*?)```", readme, re.S).group(1)
    proc = run_fresh(example + "assert type(fast.layers[26]).__name__ == 'FusedLookup'\nprint('accelerated')\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accelerated" in proc.stdout
