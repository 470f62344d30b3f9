"""ttf.accelerate of a functional model whose features are nested Sequential([lookup, Embedding])
blocks (TensorFlow Recommenders' per-feature blocks): each block converts as it does inside a
subclassed model (the lookup dropped, the rows carried over), checked against the original model."""
import warnings

import numpy as np
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

USERS = [f"u{i}" for i in range(30)]
MOVIES = [7 * i + 3 for i in range(40)]  # int ids, not 0..N: the IntegerLookup's vocabulary


def blocks_model():
    """user (string) -> Sequential([StringLookup, Embedding]); movie (int) ->
    Sequential([IntegerLookup, Embedding]); the two embeddings -> an MLP -> a rating."""
    user = tf.keras.Input([], dtype=tf.string, name="user")
    movie = tf.keras.Input([], dtype=tf.int64, name="movie")
    user_block = tf.keras.Sequential([tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
                                      tf.keras.layers.Embedding(len(USERS) + 1, 8)], name="user_block")
    movie_block = tf.keras.Sequential([tf.keras.layers.IntegerLookup(vocabulary=MOVIES, mask_token=None),
                                       tf.keras.layers.Embedding(len(MOVIES) + 1, 8)], name="movie_block")
    x = tf.keras.layers.Concatenate()([user_block(user), movie_block(movie)])
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    return tf.keras.Model([user, movie], tf.keras.layers.Dense(1)(x))


def ratings(n=2048, seed=0):
    """In-vocabulary users and movies with a rating planted from per-user and per-movie offsets."""
    rng = np.random.default_rng(seed)
    user, movie = rng.integers(0, len(USERS), n), rng.integers(0, len(MOVIES), n)
    bias_u, bias_m = rng.normal(size=len(USERS)), rng.normal(size=len(MOVIES))
    x = [tf.constant(np.array(USERS)[user]), tf.constant(np.array(MOVIES, np.int64)[movie])]
    return x, (3 + bias_u[user] + bias_m[movie]).astype(np.float32)


def test_nested_lookup_embedding_blocks_convert_match_and_train():
    model = blocks_model()
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
    x, y = ratings()
    model.fit(x, y, epochs=1, batch_size=256, verbose=0)  # trained rows, to be carried over
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    messages = " | ".join(str(w.message) for w in caught)
    assert "stay Keras Embeddings" not in messages  # the old behaviour: warned and left as they were
    assert "out-of-vocabulary" in messages and "string_lookup" in messages and "integer_lookup" in messages
    tables = ttf.embedding.tables_in(fast)
    assert len(tables) == 2 and all(isinstance(t, FusedLookup) for t in tables)
    assert sorted(t.key_kinds[0] for t in tables) == ["int", "string"]
    assert not any(isinstance(layer, (tf.keras.layers.Embedding, tf.keras.layers.StringLookup,
                                      tf.keras.layers.IntegerLookup)) for layer in fast._flatten_layers())
    # Before training, the same function: rows and dense weights are copied, not recomputed,
    # and the ops add in the same order, so the outputs agree to float rounding (rtol 1e-6).
    probe = [t[:512] for t in x]
    np.testing.assert_allclose(fast(probe).numpy(), model(probe).numpy(), rtol=1e-6, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.Adagrad)

    before = [w.copy() for w in model.get_weights()]
    history = fast.fit(x, y, epochs=3, batch_size=256, verbose=0)
    model.fit(x, y, epochs=3, batch_size=256, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    loss_ttf, loss_keras = fast.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0)
    assert loss_ttf < 0.5 and abs(loss_ttf - loss_keras) < 0.1, (loss_ttf, loss_keras)
    assert all(int(t.size()) > 0 for t in tables)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # Keras trained its own


def test_a_nested_hashing_block_converts_and_a_kept_block_stays():
    """A Hashing block converts (its rows cannot carry over: said); a block named in keep stays
    a Keras block, and the warning names it."""
    user = tf.keras.Input([], dtype=tf.string, name="user")
    movie = tf.keras.Input([], dtype=tf.int64, name="movie")
    # The Input says the ids are strings: Keras 3 gives a Sequential without one the Hashing's int64.
    hashed = tf.keras.Sequential([tf.keras.Input([], dtype=tf.string), tf.keras.layers.Hashing(64),
                                  tf.keras.layers.Embedding(64, 4)], name="hashed")
    kept = tf.keras.Sequential([tf.keras.layers.IntegerLookup(vocabulary=MOVIES, mask_token=None),
                                tf.keras.layers.Embedding(len(MOVIES) + 1, 4)], name="kept")
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([hashed(user), kept(movie)]))
    model = tf.keras.Model([user, movie], out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model, keep=["kept"])
    messages = " | ".join(str(w.message) for w in caught)
    assert "Hashing dropped" in messages and "stay Keras Embeddings: kept" in messages
    (table,) = ttf.embedding.tables_in(fast)
    assert table.key_kinds == ["string"] and table.name.startswith("hashed_")
    assert sum(isinstance(layer, tf.keras.layers.Embedding) for layer in fast._flatten_layers()) == 1
