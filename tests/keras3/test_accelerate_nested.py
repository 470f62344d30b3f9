"""ttf.accelerate on Keras 3 of a functional model whose features are nested
keras.Sequential([lookup, Embedding]) blocks (TensorFlow Recommenders' per-feature blocks): each
block converts (its lookup dropped, its rows carried over), checked against the original model
(the tf_keras twin: tests/accelerate/test_nested_blocks.py)."""
import warnings

import keras
import numpy as np
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

USERS = [f"u{i}" for i in range(30)]
MOVIES = [7 * i + 3 for i in range(40)]  # int ids, not 0..N: the IntegerLookup's vocabulary


def blocks_model():
    user = keras.Input([], dtype="string", name="user")
    movie = keras.Input([], dtype="int64", name="movie")
    user_block = keras.Sequential([keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
                                   keras.layers.Embedding(len(USERS) + 1, 8)], name="user_block")
    movie_block = keras.Sequential([keras.layers.IntegerLookup(vocabulary=MOVIES, mask_token=None),
                                    keras.layers.Embedding(len(MOVIES) + 1, 8)], name="movie_block")
    x = keras.layers.Concatenate()([user_block(user), movie_block(movie)])
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model([user, movie], keras.layers.Dense(1)(x))


def ratings(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    user, movie = rng.integers(0, len(USERS), n), rng.integers(0, len(MOVIES), n)
    bias_u, bias_m = rng.normal(size=len(USERS)), rng.normal(size=len(MOVIES))
    x = [tf.constant(np.array(USERS)[user]), tf.constant(np.array(MOVIES, np.int64)[movie])]
    return x, (3 + bias_u[user] + bias_m[movie]).astype(np.float32)


def test_keras_3_nested_lookup_embedding_blocks_convert_match_and_train():
    model = blocks_model()
    model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse")
    x, y = ratings()
    model.fit(x, y, epochs=1, batch_size=256, verbose=0)  # trained rows, to be carried over
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    messages = " | ".join(str(w.message) for w in caught)
    assert "stay Keras Embeddings" not in messages and "out-of-vocabulary" in messages
    tables = ttf.embedding.tables_in(fast)
    assert len(tables) == 2 and all(isinstance(t, FusedLookup) for t in tables)
    assert sorted(t.key_kinds[0] for t in tables) == ["int", "string"]
    assert not any(isinstance(layer, (keras.layers.Embedding, keras.layers.StringLookup, keras.layers.IntegerLookup))
                   for layer in fast._flatten_layers())
    # Rows and dense weights copied, the same ops in the same order: equal to float rounding (rtol 1e-6).
    probe = [t[:512] for t in x]
    np.testing.assert_allclose(fast(probe).numpy(), model(probe).numpy(), rtol=1e-6, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.Adagrad)

    history = fast.fit(x, y, epochs=3, batch_size=256, verbose=0)
    model.fit(x, y, epochs=3, batch_size=256, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    loss_ttf, loss_keras = fast.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0)
    assert loss_ttf < 0.5 and abs(loss_ttf - loss_keras) < 0.1, (loss_ttf, loss_keras)
    assert all(int(t.size()) > 0 for t in tables)
