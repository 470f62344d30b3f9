"""ttf.accelerate on models written the way their tutorials write them (tf_keras):
TensorFlow Recommenders' ranking tutorial (a tfrs.Model subclass holding a keras.Model
subclass whose features are Sequential([StringLookup, Embedding])), a plain subclassed
model with Embeddings in attributes, a list and a dict, and DeepCTR with use_hash=True."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

USERS = [f"u{i}" for i in range(40)]
MOVIES = [f"m{i}" for i in range(60)]


def ratings(n=2048, seed=0):
    """MovieLens-like rows: a rating planted from per-user and per-movie offsets."""
    rng = np.random.default_rng(seed)
    user, movie = rng.integers(0, len(USERS), n), rng.integers(0, len(MOVIES), n)
    bias_u, bias_m = rng.normal(size=len(USERS)), rng.normal(size=len(MOVIES))
    return {"user_id": np.array(USERS)[user], "movie_title": np.array(MOVIES)[movie],
            "user_rating": (3 + bias_u[user] + bias_m[movie]).astype(np.float32)}


def tfrs_ranking_tutorial():
    """https://www.tensorflow.org/recommenders/examples/basic_ranking, as written there."""
    tfrs = pytest.importorskip("tensorflow_recommenders")

    class RankingModel(tf.keras.Model):
        def __init__(self):
            super().__init__()
            embedding_dimension = 32
            self.user_embeddings = tf.keras.Sequential([
                tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
                tf.keras.layers.Embedding(len(USERS) + 1, embedding_dimension)])
            self.movie_embeddings = tf.keras.Sequential([
                tf.keras.layers.StringLookup(vocabulary=MOVIES, mask_token=None),
                tf.keras.layers.Embedding(len(MOVIES) + 1, embedding_dimension)])
            self.ratings = tf.keras.Sequential([
                tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(16, activation="relu"),
                tf.keras.layers.Dense(1)])

        def call(self, inputs):
            user_id, movie_title = inputs
            user_embedding = self.user_embeddings(user_id)
            movie_embedding = self.movie_embeddings(movie_title)
            return self.ratings(tf.concat([user_embedding, movie_embedding], axis=1))

    class MovielensModel(tfrs.models.Model):
        def __init__(self):
            super().__init__()
            self.ranking_model = RankingModel()
            self.task = tfrs.tasks.Ranking(loss=tf.keras.losses.MeanSquaredError(),
                                           metrics=[tf.keras.metrics.RootMeanSquaredError()])

        def call(self, features):
            return self.ranking_model((features["user_id"], features["movie_title"]))

        def compute_loss(self, features, training=False):
            labels = features.pop("user_rating")
            return self.task(labels=labels, predictions=self(features))

    model = MovielensModel()
    model.compile(optimizer=tf.keras.optimizers.Adagrad(learning_rate=0.1))
    return model


@pytest.mark.slow  # trains both models
def test_tfrs_ranking_tutorial_converts_matches_trains_and_serves(tmp_path):
    model = tfrs_ranking_tutorial()
    data = ratings()
    features = {k: tf.constant(v) for k, v in data.items() if k != "user_rating"}
    model(features)  # built, as after a first fit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    messages = " | ".join(str(w.message) for w in caught)
    assert "out-of-vocabulary" in messages  # the two StringLookups were dropped
    assert isinstance(fast, type(model)) and type(fast).__name__ == type(model).__name__ and fast is not model
    tables = [layer for layer in ttf.embedding.tables_in(fast)]
    assert len(tables) == 2 and all(isinstance(t, FusedLookup) for t in tables)
    assert not any(isinstance(layer, (tf.keras.layers.Embedding, tf.keras.layers.StringLookup))
                   for layer in fast._flatten_layers())
    np.testing.assert_allclose(fast(features).numpy(), model(features).numpy(), rtol=1e-5, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.Adagrad)

    dataset = tf.data.Dataset.from_tensor_slices(data).batch(256)
    model.fit(dataset, epochs=3, verbose=0)
    history = fast.fit(dataset, epochs=3, verbose=0)
    loss_keras = model.evaluate(dataset, return_dict=True, verbose=0)["root_mean_squared_error"]
    loss_ttf = fast.evaluate(dataset, return_dict=True, verbose=0)["root_mean_squared_error"]
    assert loss_ttf < 0.6 and abs(loss_ttf - loss_keras) < 0.1, (loss_ttf, loss_keras)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert all(int(t.size()) > 0 for t in tables)
    probe = {k: v[:64] for k, v in features.items()}
    serve = tf.saved_model.load(ttf.export_for_serving(fast, str(tmp_path / "ranking"))).signatures["serving_default"]
    served = serve(**probe)
    assert list(served) == ["logits"]  # a rating, not a probability
    np.testing.assert_allclose(served["logits"].numpy(), fast(probe).numpy(), rtol=1e-5, atol=1e-6)
    fast.save(str(tmp_path / "ranking.keras"))  # the config names the tables and where they go
    loaded = tf.keras.models.load_model(str(tmp_path / "ranking.keras"), custom_objects={"MovielensModel": type(model)})
    assert type(loaded) is type(fast) and len(ttf.embedding.tables_in(loaded)) == 2
    np.testing.assert_allclose(loaded(probe).numpy(), fast(probe).numpy(), rtol=1e-6, atol=1e-6)


class Subclassed(tf.keras.Model):
    """Embeddings held as an attribute, in a list and in a dict, one shared by two features."""

    def __init__(self, dim=4):
        super().__init__()
        self.user = tf.keras.layers.Embedding(30, dim)
        self.items = [tf.keras.layers.Embedding(50, dim), tf.keras.layers.Embedding(20, dim, mask_zero=True)]
        self.by_name = {"shared": self.user}
        self.head = tf.keras.layers.Dense(1, activation="sigmoid")

    def call(self, x):
        pooled = tf.reduce_mean(self.items[1](x["history"]), axis=1)
        return self.head(tf.concat([self.user(x["user"]), self.items[0](x["item"]), pooled,
                                    self.by_name["shared"](x["friend"])], axis=1))


def test_subclassed_model_embeddings_in_attributes_lists_and_dicts(tmp_path):
    rng = np.random.default_rng(2)
    x = {"user": rng.integers(0, 30, 64), "item": rng.integers(0, 50, 64), "friend": rng.integers(0, 30, 64),
         "history": rng.integers(0, 20, (64, 5))}
    y = rng.integers(0, 2, (64, 1)).astype(np.float32)
    model = Subclassed()
    model(x)
    model.compile(tf.keras.optimizers.AdamW(0.01, weight_decay=0.01), "binary_crossentropy")
    fast = ttf.accelerate(model)
    tables = ttf.embedding.tables_in(fast)
    assert len(tables) == 3 and fast.user is fast.by_name["shared"]  # held twice, one table
    assert not any(isinstance(w, tf.Variable) and "embeddings" in w.name for w in fast.trainable_weights)
    np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.AdamW) and fast.optimizer.weight_decay == 0.01
    before = [w.numpy() for w in model.weights]
    fast.fit(x, y, epochs=2, batch_size=16, verbose=0)
    for w0, w1 in zip(before, model.weights):  # the original is untouched
        np.testing.assert_array_equal(w0, w1.numpy())
    assert int(fast.user.size()) == 30 and not np.allclose(fast(x).numpy(), model(x).numpy())
    fast.save(str(tmp_path / "subclassed.keras"))  # tables in an attribute, a list and a dict, one held twice
    loaded = tf.keras.models.load_model(str(tmp_path / "subclassed.keras"), custom_objects={"Subclassed": Subclassed})
    assert len(ttf.embedding.tables_in(loaded)) == 3 and loaded.user is loaded.by_name["shared"]
    assert [int(t.size()) for t in ttf.embedding.tables_in(loaded)] == [int(t.size()) for t in tables]
    np.testing.assert_allclose(loaded(x).numpy(), fast(x).numpy(), rtol=1e-6, atol=1e-7)


def test_subclassed_model_that_cannot_be_rebuilt_names_the_fix():
    class NoConfig(tf.keras.Model):  # a constructor argument Keras cannot put in a config
        def __init__(self, embedding):
            super().__init__()
            self.emb = embedding

        def call(self, x):
            return self.emb(x)

    model = NoConfig(tf.keras.layers.Embedding(7, 2))
    model(tf.constant([1, 2]))
    with pytest.raises(ValueError, match="cannot make a new NoConfig.*get_config"):
        ttf.accelerate(model)


def test_deepctr_use_hash_features_are_fused():
    deepctr_models = pytest.importorskip("deepctr.models")
    from deepctr.feature_column import SparseFeat  # pylint: disable=import-outside-toplevel

    feats = [SparseFeat(f"C{i}", 100, embedding_dim=4, use_hash=True, dtype="string") for i in range(6)]
    model = deepctr_models.DeepFM(feats, feats, dnn_hidden_units=(16,), seed=1)
    model.compile("adam", "binary_crossentropy")
    rng = np.random.default_rng(3)
    x = {f"C{i}": rng.choice([f"v{j}" for j in range(300)], 512) for i in range(6)}
    y = rng.integers(0, 2, 512).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    hashing = [str(w.message) for w in caught if "Hashing dropped" in str(w.message)]
    assert hashing and "keep=" in hashing[0]  # named, with the way to keep the bucketing
    fused = [layer for layer in fast.layers if isinstance(layer, FusedLookup)]
    # Two tables (dim 4 and the linear part's dim 1), one op call each, keyed by the raw string.
    assert sorted(layer.dim for layer in fused) == [1, 4] and all(set(f.key_kinds) == {"string"} for f in fused)
    assert not any(type(layer).__name__ == "Hash" for layer in fast.layers)
    fast.fit(x, y, epochs=1, batch_size=128, verbose=0)
    assert int(fused[0].size()) > 300  # distinct strings get distinct rows: more than the 100 buckets
