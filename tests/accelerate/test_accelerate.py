"""ttf.accelerate on plain Keras models: lookups dropped, rows carried over, shared
embeddings stay shared, sequences keep their mask, what cannot convert is named; and
ttf.optimizers.from_keras."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "delhi"]


def keras_model():
    """city (string) -> StringLookup -> Embedding; item and its history (ints) share one
    Embedding; the history [B, 4] (0 = padding) has mask_zero and is averaged with the mask."""
    city = tf.keras.Input([1], dtype=tf.string, name="city")
    item = tf.keras.Input([1], dtype=tf.int64, name="item")
    history = tf.keras.Input([4], dtype=tf.int64, name="history")
    city_ids = tf.keras.layers.StringLookup(vocabulary=CITIES, name="city_lookup")(city)
    city_emb = tf.keras.layers.Embedding(len(CITIES) + 1, 4, name="city_emb")(city_ids)
    item_table = tf.keras.layers.Embedding(50, 4, name="item_emb")
    item_emb = item_table(item)
    seq = tf.keras.layers.Embedding(50, 4, mask_zero=True, name="history_emb")(history)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(seq)  # uses the mask
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(city_emb), tf.keras.layers.Flatten()(item_emb),
                                       pooled, tf.keras.layers.Flatten()(item_table(history[:, :1]))])
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    return tf.keras.Model([city, item, history], tf.keras.layers.Dense(1, activation="sigmoid")(x))


def data(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    city = rng.choice(CITIES, size=(n, 1))
    item = rng.integers(1, 50, size=(n, 1))
    history = rng.integers(1, 50, size=(n, 4)) * (rng.random((n, 4)) < 0.7)  # zeros: padding
    history[:, 0] = rng.integers(1, 50, size=n)  # never all padding (the masked mean would be 0/0)
    label = ((np.isin(city[:, 0], CITIES[:3])) ^ (item[:, 0] % 2 == 0)).astype(np.float32)
    return [tf.constant(city), tf.constant(item, tf.int64), tf.constant(history, tf.int64)], label


def test_string_lookup_model_converts_matches_and_trains(tmp_path):
    model = keras_model()
    model.compile(optimizer=tf.keras.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["AUC"])
    x, y = data()
    model.fit(x, y, epochs=1, batch_size=256, verbose=0)  # trained rows, to be carried over
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    oov = [str(w.message) for w in caught if "out-of-vocabulary" in str(w.message)]
    assert len(oov) == 1 and "city_lookup" in oov[0] and "predictions differ" in oov[0]
    layers = {type(layer).__name__ for layer in fast.layers}
    assert "StringLookup" not in layers and "Embedding" not in layers
    # One table, one op call for all three Embeddings (equal dim and initializer): city_emb
    # keyed by the string's hash, item_emb's two uses (the input, and a slice of history
    # computed inside the model) sharing a tag, history_emb ([B, 4], mask_zero) masking 0.
    (fused,) = [layer for layer in fast.layers if isinstance(layer, FusedLookup)]
    assert sorted(fused.key_kinds) == ["int", "int", "int", "string"] and sorted(set(fused.tags)) == [0, 1, 2]
    assert [m for m in fused.mask_values if m is not None] == [0]
    np.testing.assert_allclose(fast.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert int(fused.size()) == len(CITIES) + 2 * 50  # the vocabulary, keyed by hash (no OOV row), and ids 0..49
    fast.fit(x, y, epochs=4, batch_size=256, verbose=0)
    assert fast.evaluate(x, y, verbose=0, return_dict=True)["auc"] > 0.9
    unseen = [tf.constant([["berlin"]]), tf.constant([[7]], tf.int64), tf.constant([[7, 0, 0, 0]], tf.int64)]
    assert np.isfinite(fast.predict(unseen, verbose=0)).all()
    fast.save(str(tmp_path / "fast.keras"))  # FusedLookup / TableLookup serialise
    loaded = tf.keras.models.load_model(str(tmp_path / "fast.keras"))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), fast.predict(x, verbose=0), rtol=1e-6, atol=1e-7)


def test_shared_embedding_stays_shared_and_ids_keep_their_rows():
    ids_a = tf.keras.Input([1], dtype=tf.int32)
    ids_b = tf.keras.Input([1], dtype=tf.int32)
    other = tf.keras.Input([1], dtype=tf.int32)
    shared = tf.keras.layers.Embedding(10, 3, name="shared")
    out = tf.keras.layers.Concatenate(axis=1)([shared(ids_a), shared(ids_b),
                                               tf.keras.layers.Embedding(10, 3, name="own")(other)])
    model = tf.keras.Model([ids_a, ids_b, other], out)
    fast = ttf.accelerate(model)
    (fused,) = [layer for layer in fast.layers if isinstance(layer, FusedLookup)]
    assert fused.tags == [0, 0, 1]  # both uses of `shared` read the same rows
    x = [np.arange(10)[:, None]] * 3
    np.testing.assert_array_equal(fast.predict(x, verbose=0), model.predict(x, verbose=0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fast([np.array([[3]]), np.array([[3]]), np.array([[3]])])[:, :2])
    grad = tape.gradient(loss, fused.anchor)
    by_key = dict(zip(grad.indices.numpy(), grad.values.numpy()))
    np.testing.assert_array_equal(by_key[3], [2.0] * 3)  # one shared key (tag 0), both uses summed
    np.testing.assert_array_equal(by_key[(1 << 56) | 3], [0.0] * 3)  # `own` (tag 1): not in the loss


def test_what_cannot_convert_is_named():
    ids = tf.keras.Input([1], dtype=tf.int32)
    emb = tf.keras.layers.Embedding(10, 3, embeddings_regularizer="l2", name="reg_emb")
    hashed = tf.keras.layers.Hashing(20, name="hasher")(tf.keras.Input([1], dtype=tf.string, name="s"))
    out = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb(ids)), tf.keras.layers.Flatten()(
        tf.keras.layers.Embedding(20, 3, name="hashed_emb")(hashed))])
    model = tf.keras.Model([ids, hashed._keras_history.layer.input], out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    messages = " | ".join(str(w.message) for w in caught)
    assert "regularizer dropped" in messages and "reg_emb" in messages
    assert "Hashing dropped" in messages and "hasher" in messages
    with pytest.raises(ValueError, match="already holds ttf tables"):  # its copy's tables would start empty
        ttf.accelerate(fast)

    class Tied(tf.keras.layers.Layer):  # reads the Embedding's matrix: weight tying
        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def call(self, x):
            return tf.matmul(x, self.embedding.embeddings, transpose_b=True)

    tied_emb = tf.keras.layers.Embedding(10, 3, name="tied_emb")
    h = tf.keras.layers.Flatten()(tied_emb(ids))
    tied = tf.keras.Model(ids, Tied(tied_emb, name="tied_out")(h))
    with pytest.raises(ValueError, match="tied_out reads Embedding tied_emb's matrix.*keep"):
        ttf.accelerate(tied)
    kept = ttf.accelerate(tied, keep=["tied_emb"])
    assert any(isinstance(layer, tf.keras.layers.Embedding) for layer in kept.layers)

    class Subclassed(tf.keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="subclassed"):
        ttf.accelerate(Subclassed())


# ---------------------------------------------------------------- from_keras

def test_from_keras_keeps_hyperparameters_and_schedules():
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    adam = ttf.optimizers.from_keras(tf.keras.optimizers.Adam(schedule, beta_1=0.8, beta_2=0.99, epsilon=1e-5,
                                                               clipnorm=1.0))
    assert isinstance(adam, ttf.optimizers.Adam) and adam._learning_rate is schedule
    assert (adam.beta_1, adam.beta_2, adam.epsilon, adam.clipnorm) == (0.8, 0.99, 1e-5, 1.0)
    ftrl = ttf.optimizers.from_keras(tf.keras.optimizers.Ftrl(0.3, l1_regularization_strength=0.01, beta=0.5))
    assert isinstance(ftrl, ttf.optimizers.Ftrl) and (ftrl.l1_regularization_strength, ftrl.beta) == (0.01, 0.5)
    adagrad = ttf.optimizers.from_keras("adagrad")
    assert isinstance(adagrad, ttf.optimizers.Adagrad) and float(adagrad.learning_rate) == pytest.approx(0.001)
    sgd = ttf.optimizers.from_keras(tf.keras.optimizers.SGD(0.5))
    assert isinstance(sgd, ttf.optimizers.SGD) and float(sgd.learning_rate) == 0.5
    stock = tf.keras.optimizers.Adam(0.01)
    stock.learning_rate = 0.002  # a changed rate is today's rate
    assert float(ttf.optimizers.from_keras(stock).learning_rate) == pytest.approx(0.002)
    legacy = ttf.optimizers.from_keras(tf.keras.optimizers.legacy.Adagrad(0.2, decay=0.1))
    rate = legacy._learning_rate
    assert isinstance(rate, tf.keras.optimizers.schedules.InverseTimeDecay)
    assert float(rate(10)) == pytest.approx(0.2 / (1 + 0.1 * 10))  # legacy decay: lr / (1 + decay * t)
    assert ttf.optimizers.from_keras(adam) is adam


def test_from_keras_refuses_what_ttf_lacks():
    with pytest.raises(ValueError, match="RMSprop has no ttf twin.*ttf.optimizers.Adam, AdamW, Adagrad, Ftrl, SGD"):
        ttf.optimizers.from_keras("rmsprop")
    with pytest.raises(ValueError, match="Nadam has no ttf twin"):
        ttf.optimizers.from_keras(tf.keras.optimizers.Nadam())
    with pytest.raises(ValueError, match="momentum"):
        ttf.optimizers.from_keras(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    with pytest.raises(ValueError, match="amsgrad"):
        ttf.optimizers.from_keras(tf.keras.optimizers.Adam(amsgrad=True))


def test_ids_wider_than_56_bits_are_hashed_never_cut():
    """The tag of a fused table sits in the top 8 bits; an id that needs them (>= 2**56 or
    negative) must not lose them and land on another id's row."""
    user = tf.keras.Input([1], dtype=tf.int64)
    item = tf.keras.Input([1], dtype=tf.int64)
    out = tf.keras.layers.Concatenate(axis=1)([tf.keras.layers.Embedding(10, 3, name="user")(user),
                                               tf.keras.layers.Embedding(10, 3, name="item")(item)])
    fast = ttf.accelerate(tf.keras.Model([user, item], out))
    (fused,) = [layer for layer in fast.layers if isinstance(layer, FusedLookup)]
    ids = np.array([[5], [(1 << 56) + 5], [-5], [(1 << 63) - 1], [(1 << 57) + 5]], np.int64)
    keys = fused.keys_of([ids, ids])[0].numpy().reshape(2, -1).T  # column after column -> [N, 2]
    assert keys[0, 0] == 5 and keys[0, 1] == (1 << 56) | 5  # in range: the id itself, tagged
    assert len(set(keys[:, 0].tolist())) == len(ids)  # no two ids share a row
    assert len(set(keys.ravel().tolist())) == 2 * len(ids)  # nor do the two tables' keys
    np.testing.assert_array_equal(keys[:, 1] >> 56, 1)  # the tag is intact
    np.testing.assert_array_equal(keys, fused.keys_of([ids, ids])[0].numpy().reshape(2, -1).T)  # the same keys every call
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fast([ids[:2], ids[:2]])[:, 0])
    grad = tape.gradient(loss, fused.anchor)
    assert len(set(grad.indices.numpy().tolist())) == 4  # 5 and 2**56 + 5: two rows per table


def test_models_saved_with_table_lookup_still_load():
    """TableLookup (what accelerate made before FusedLookup took any shape) stays registered:
    its old config (key_kind, mask_value) and its own get_config both give the same lookup."""
    from ttf.embedding import TableLookup  # pylint: disable=import-outside-toplevel
    written = TableLookup(4, key_kind="string", mask_value="", name="history").get_config()
    old_style = {k: v for k, v in written.items() if k not in ("tags", "key_kinds", "mask_values")}
    old_style.update(key_kind="string", mask_value="")
    ids = tf.constant([["a", ""], ["b", "a"]])
    for config in (written, old_style):
        layer = tf.keras.utils.deserialize_keras_object({"class_name": "ttf>TableLookup", "config": config})
        assert isinstance(layer, FusedLookup) and layer.key_kinds == ["string"] and layer.tags == [None]
        np.testing.assert_array_equal(layer.keys_of(ids)[0].numpy(),  # untagged, as the saved table's keys
                                      tf.strings.to_hash_bucket_fast(tf.reshape(ids, [-1]), 1 << 56).numpy())
        np.testing.assert_array_equal(layer.compute_mask(ids).numpy(), [[True, False], [True, True]])
        assert layer(ids).shape == (2, 2, 4)
