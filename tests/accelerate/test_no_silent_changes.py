"""Differences between a model and its accelerated twin are either gone or said: jit_compile,
the serving output's name, and loading a ttf model without `import ttf`."""
import json
import os
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
import tensorflow as tf

import ttf
import ttf._ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_model(activation=None):
    user = tf.keras.Input([1], dtype=tf.int64, name="user")
    item = tf.keras.Input([1], dtype=tf.int64, name="item")
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 4)(user)),
                                       tf.keras.layers.Flatten()(tf.keras.layers.Embedding(30, 4)(item))])
    return tf.keras.Model([user, item], tf.keras.layers.Dense(1, activation=activation)(x))


def data(n=64):
    rng = np.random.default_rng(1)
    return [rng.integers(0, 20, (n, 1)), rng.integers(0, 30, (n, 1))], rng.random((n, 1)).astype(np.float32)


def test_jit_compile_is_dropped_with_a_warning_and_fit_runs():
    model = small_model()
    model.compile(tf.keras.optimizers.Adam(0.01), "mse", jit_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    (message,) = [str(w.message) for w in caught if "jit_compile" in str(w.message)]
    assert "outside XLA" in message
    x, y = data()
    history = fast.fit(x, y, batch_size=16, epochs=1, verbose=0)  # with XLA: a Fingerprint kernel error
    assert np.isfinite(history.history["loss"][-1])


@pytest.mark.parametrize("activation, name", [(None, "logits"), ("sigmoid", "probability")])
def test_serving_output_is_named_after_what_the_model_returns(tmp_path, activation, name):
    model = small_model(activation)
    fast = ttf.accelerate(model)
    x, _ = data(8)
    expected = fast.predict(x, verbose=0)
    version = ttf.export_for_serving(fast, str(tmp_path / "m"))
    outputs = tf.saved_model.load(version).signatures["serving_default"](
        user=tf.constant(x[0], tf.int64), item=tf.constant(x[1], tf.int64))
    assert list(outputs) == [name]
    np.testing.assert_allclose(outputs[name].numpy(), expected, rtol=1e-6, atol=1e-7)
    named = ttf.export_for_serving(fast, str(tmp_path / "m"), output_name="score")
    assert list(tf.saved_model.load(named).signatures["serving_default"].structured_outputs) == ["score"]


@pytest.mark.slow  # a fresh process that imports TensorFlow
def test_loading_without_import_ttf_fails_as_the_docs_say(tmp_path):
    """Keras and TensorFlow raise before ttf can run: the saved config names ttf (module and
    registered name), and docs/accelerate.md lists the exact errors with the fix."""
    fast = ttf.accelerate(small_model())
    fast.save(str(tmp_path / "fast.keras"))
    tf.saved_model.save(fast, str(tmp_path / "saved"))
    with zipfile.ZipFile(tmp_path / "fast.keras") as archive:
        layers = json.loads(archive.read("config.json"))["config"]["layers"]
    (fused,) = [layer for layer in layers if layer["class_name"] == "FusedLookup"]
    assert fused["module"].startswith("ttf.") and fused["registered_name"] == "ttf>FusedLookup"
    script = ("import sys, tensorflow as tf\n"
              "for load in (lambda: tf.keras.models.load_model(sys.argv[1]), lambda: tf.saved_model.load(sys.argv[2])):\n"
              "    try:\n        load()\n        print('LOADED')\n"
              "    except Exception as err:\n        print('ERROR', type(err).__name__, str(err).splitlines()[0][:300])\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "fast.keras"), str(tmp_path / "saved")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    keras_error, op_error = [line for line in proc.stdout.splitlines() if line.startswith(("ERROR", "LOADED"))]
    assert "TypeError 'str' object is not callable" in keras_error, keras_error  # tf_keras' own message
    # The first ttf op TensorFlow meets names the error; which one it meets first varies with the
    # graph's order (TtfEmbeddingLookup, TtfTableExport, TtfEmbeddingGrad were all seen), so the
    # docs give the pattern and the test checks the name is one of ttf's ops.
    assert "Op type not registered 'Ttf" in op_error, op_error
    op_name = op_error.split("'")[1]
    assert hasattr(ttf._ops.ops(), op_name), op_name  # the op library's Python module names each op
    doc = open(os.path.join(ROOT, "docs", "accelerate.md")).read()
    for message in ("'str' object is not callable", "Could not locate class 'FusedLookup'", "Op type not registered 'Ttf"):
        assert message in doc, message
