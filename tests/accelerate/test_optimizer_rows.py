"""What a Keras optimizer does to an Embedding's rows, ttf's twin does to the table's rows
after ttf.accelerate: AdamW's decoupled weight decay, clipnorm / clipvalue /
global_clipnorm; what cannot reach the rows is warned about or refused.

The reference is the original Keras model trained by stock Keras on the same batches.
Each batch holds every id exactly once, so Keras' dense Adam equals ttf's lazy Adam (every
row is touched every step) and Keras' per-occurrence clipping equals ttf's per-id clipping;
the tolerance (1e-5) covers float32 summation order over a few steps."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

IDS, DIM, STEPS = 8, 4, 6


def model_and_data(optimizer):
    ids = tf.keras.Input([1], dtype=tf.int64, name="ids")
    emb = tf.keras.layers.Embedding(IDS + 2, DIM, embeddings_initializer=tf.keras.initializers.RandomUniform(-1, 1, 3),
                                    name="emb")(ids)
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(
        tf.keras.layers.Flatten()(emb))
    model = tf.keras.Model(ids, out)
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.permutation(IDS) for _ in range(STEPS)])[:, None].astype(np.int64)  # ids 0..7, never 8, 9
    y = rng.normal(size=(len(x), 1)).astype(np.float32) * 3
    return model, x, y


def rows(model, ids):
    layer = next((lay for lay in model.layers if isinstance(lay, (FusedLookup, tf.keras.layers.Embedding))))
    return layer(tf.constant(ids, tf.int64)).numpy().reshape(len(ids), DIM)


OPTIMIZERS = {
    "adamw": lambda: tf.keras.optimizers.AdamW(0.05, weight_decay=0.5),
    "sgd_decay": lambda: tf.keras.optimizers.SGD(0.3, weight_decay=0.5),
    "adam": lambda: tf.keras.optimizers.Adam(0.05),
    "sgd": lambda: tf.keras.optimizers.SGD(0.5),
    "sgd_clipnorm": lambda: tf.keras.optimizers.SGD(0.5, clipnorm=0.05),
    "sgd_clipvalue": lambda: tf.keras.optimizers.SGD(0.5, clipvalue=0.01),
    "sgd_global_clipnorm": lambda: tf.keras.optimizers.SGD(0.5, global_clipnorm=0.05),
}
_TRAINED = {}


def trained(name):
    """(Keras model, its accelerated twin, the untouched rows before training), each trained
    once per test session: several tests compare against the same run."""
    if name not in _TRAINED:
        _TRAINED[name] = train_both(OPTIMIZERS[name]())
    return _TRAINED[name]


def train_both(optimizer):
    model, x, y = model_and_data(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = ttf.accelerate(model)
    untouched = rows(model, [IDS, IDS + 1])
    model.fit(x, y, batch_size=IDS, epochs=1, shuffle=False, verbose=0)
    fast.fit(x, y, batch_size=IDS, epochs=1, shuffle=False, verbose=0)
    return model, fast, untouched


@pytest.mark.parametrize("optimizer", ["adamw", "sgd_decay"])
def test_weight_decay_reaches_touched_rows_as_keras(optimizer):
    model, fast, untouched = trained(optimizer)
    assert type(fast.optimizer).__name__ == type(model.optimizer).__name__
    touched = np.arange(IDS)
    np.testing.assert_allclose(rows(fast, touched), rows(model, touched), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast.predict(touched[:, None], verbose=0), model.predict(touched[:, None], verbose=0),
                               rtol=1e-5, atol=1e-5)
    # Lazy: ids no batch held keep their carried-over rows (Keras decays every row every step).
    np.testing.assert_array_equal(rows(fast, [IDS, IDS + 1]), untouched)
    assert np.abs(rows(model, [IDS, IDS + 1]) - untouched).max() > 1e-3


def test_without_decay_the_rows_differ():
    """The reference can tell: AdamW's decay moves the rows by more than the tolerance."""
    decayed, _, _ = trained("adamw")
    _, plain, _ = trained("adam")
    assert np.abs(rows(plain, np.arange(IDS)) - rows(decayed, np.arange(IDS))).max() > 1e-2


@pytest.mark.parametrize("clip", ["clipnorm", "clipvalue", "global_clipnorm"])
def test_clipping_reaches_rows_as_keras(clip):
    # SGD: Adam's step is nearly invariant to the gradient's scale, so it would hide clipping.
    model, fast, _ = trained(f"sgd_{clip}")
    assert getattr(fast.optimizer, clip) == getattr(model.optimizer, clip) > 0
    touched = np.arange(IDS)
    np.testing.assert_allclose(rows(fast, touched), rows(model, touched), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast.predict(touched[:, None], verbose=0), model.predict(touched[:, None], verbose=0),
                               rtol=1e-5, atol=1e-5)
    unclipped, _, _ = trained("sgd")
    assert np.abs(rows(unclipped, touched) - rows(model, touched)).max() > 1e-2  # clipping mattered


def test_an_id_looked_up_twice_is_clipped_once_on_its_summed_gradient():
    """Two lookups of one table in a step: the tape concatenates their slices; clipnorm
    clips the table's gradient with each id's rows summed (the dense gradient's norm)."""
    layer = ttf.DynamicEmbedding(2, initializer="zeros")
    opt = ttf.optimizers.SGD(1.0, clipnorm=1.0)
    ids = tf.constant([1, 2], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True) * [[3.0, 0.0], [0.0, 4.0]]) + tf.reduce_sum(
            layer(ids[:1], training=True) * [[3.0, 0.0]])
    grads = tape.gradient(loss, layer.trainable_variables)
    opt.apply_gradients(zip(grads, layer.trainable_variables))
    # Summed: id 1 -> [6, 0], id 2 -> [0, 4]; norm sqrt(52); clipped to norm 1.
    expected = -np.array([[6.0, 0.0], [0.0, 4.0]]) / np.sqrt(52.0)
    np.testing.assert_allclose(layer(ids).numpy(), expected, rtol=1e-6)


def test_settings_that_do_not_reach_rows_are_named():
    model, _, _ = model_and_data(tf.keras.optimizers.Adam(0.01, use_ema=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ttf.accelerate(model)
    assert any("use_ema=True" in str(w.message) and "not on the ttf tables' rows" in str(w.message) for w in caught)
    assert ttf.optimizers.not_reaching_rows(tf.keras.optimizers.AdamW(weight_decay=0.1, clipnorm=1.0)) == []
