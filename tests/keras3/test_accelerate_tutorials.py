"""ttf.accelerate on Keras 3 models written as keras-rs and keras-io write them: the keras-io
DLRM tutorial (a keras.Model subclass with a dict of Embeddings and keras_rs' DotInteraction,
compiled with AdamW), keras-rs' DCN example (functional, FeatureCross, logits out), and
what Keras 3 optimizers add (loss_scale_factor, gradient_accumulation_steps)."""
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.embedding import FusedLookup

keras_rs = pytest.importorskip("keras_rs")

SPARSE = {"movie_id": 300, "user_id": 200, "user_gender": 2, "bucketized_user_age": 7, "user_occupation": 21}
DENSE = ["raw_user_age", "hour_of_day_sin", "hour_of_day_cos"]
ZIP_CODES = [f"{i:05d}" for i in range(0, 5000, 37)]


def movielens(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    x = {name: rng.integers(0, size, n).astype("int64") for name, size in SPARSE.items()}
    x.update({name: rng.normal(size=n).astype("float32") for name in DENSE})
    x["user_zip_code"] = np.array(ZIP_CODES + ["99999"])[rng.integers(0, len(ZIP_CODES) + 1, n)]  # one unknown
    bias = {name: rng.normal(size=size) for name, size in SPARSE.items()}
    y = (3 + sum(bias[name][x[name]] for name in ("movie_id", "user_id"))).astype("float32")
    return x, y


class DLRM(keras.Model):
    """keras-io's "Ranking with Deep Learning Recommendation Model" (keras_rs), as written there."""

    def __init__(self, dense_num_units_lst, mlp_num_units_lst, embedding_dim=8, **kwargs):
        super().__init__(**kwargs)
        self.embedding_layers = {}
        for feature_name, vocabulary_size in SPARSE.items():
            self.embedding_layers[feature_name] = keras.layers.Embedding(
                input_dim=vocabulary_size + 1, output_dim=embedding_dim)
        self.embedding_layers["user_zip_code"] = keras.Sequential([  # the string feature, looked up in the model
            keras.layers.StringLookup(vocabulary=ZIP_CODES, mask_token=None),
            keras.layers.Embedding(input_dim=len(ZIP_CODES) + 1, output_dim=embedding_dim)])
        self.bottom_mlp = keras.Sequential([keras.layers.Dense(units, activation="relu")
                                            for units in dense_num_units_lst])
        self.dot_layer = keras_rs.layers.DotInteraction()
        self.top_mlp = keras.Sequential([keras.layers.Dense(units, activation="relu")
                                         for units in mlp_num_units_lst])
        self.output_layer = keras.layers.Dense(1)

    def call(self, inputs):
        dense_input = keras.ops.stack([inputs[feature] for feature in DENSE], axis=-1)
        dense_output = self.bottom_mlp(dense_input)
        sparse_embeddings = [self.embedding_layers[feature](inputs[feature]) for feature in [*SPARSE, "user_zip_code"]]
        x = self.dot_layer([dense_output] + sparse_embeddings)
        x = keras.ops.concatenate([x, dense_output], axis=-1)
        return self.output_layer(self.top_mlp(x))


class SavableDLRM(DLRM):
    """The tutorial's DLRM with the get_config Keras asks for before it saves a Model subclass."""

    def __init__(self, dense_num_units_lst, mlp_num_units_lst, embedding_dim=8, **kwargs):
        super().__init__(dense_num_units_lst, mlp_num_units_lst, embedding_dim, **kwargs)
        self.arguments = dict(dense_num_units_lst=dense_num_units_lst, mlp_num_units_lst=mlp_num_units_lst,
                              embedding_dim=embedding_dim)

    def get_config(self):
        return {**super().get_config(), **self.arguments}


@pytest.mark.slow  # trains both models, loads the trained one in a fresh process
def test_keras_io_dlrm_subclassed_with_adamw(tmp_path):
    x, y = movielens()
    model = SavableDLRM(dense_num_units_lst=[32, 8], mlp_num_units_lst=[32, 16])
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=0.01), loss=keras.losses.MeanSquaredError(),
                  metrics=[keras.metrics.RootMeanSquaredError()])
    batch = {k: v[:256] for k, v in x.items()}
    model(batch)
    with pytest.raises(ValueError, match="sample="):  # Keras 3 records no input spec
        ttf.accelerate(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model, sample=batch)
    assert any("out-of-vocabulary" in str(w.message) for w in caught)  # the zip codes' StringLookup, dropped
    # Its class: SavableDLRM's subclass of the same name that records the tables in its config.
    assert isinstance(fast, SavableDLRM) and type(fast).__name__ == "SavableDLRM"
    assert len(ttf.embedding.tables_in(fast)) == len(SPARSE) + 1
    assert not any(isinstance(layer, (keras.layers.Embedding, keras.layers.StringLookup))
                   for layer in fast._flatten_layers())
    known = batch["user_zip_code"] != "99999"
    np.testing.assert_allclose(fast(batch).numpy()[known], model(batch).numpy()[known], rtol=1e-5, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.AdamW) and fast.optimizer.weight_decay == model.optimizer.weight_decay
    before = [w.numpy() for w in model.weights]
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(256)  # Keras 3 takes no numpy str arrays
    fast.fit(dataset, epochs=3, verbose=0)
    for w0, w1 in zip(before, model.weights):  # the original is untouched: the copy has variables of its own
        np.testing.assert_array_equal(w0, w1.numpy())
    rmse_before = model.evaluate(dataset, return_dict=True, verbose=0)["root_mean_squared_error"]
    rmse_ttf = fast.evaluate(dataset, return_dict=True, verbose=0)["root_mean_squared_error"]
    # Lazy Adam (untouched rows keep their m and v) learns rare ids more slowly than Keras'
    # dense Adam in 3 epochs, so the two are not compared here: SGD below compares them exactly.
    assert rmse_ttf < 0.8 * rmse_before, (rmse_ttf, rmse_before)

    # A .keras file of the trained model, loaded in a fresh process (tables rebuilt from its
    # config, rows and optimizer state from its weights), predicts what the model predicts.
    fast.save(str(tmp_path / "dlrm.keras"))
    np.save(tmp_path / "expected.npy", fast.predict(dataset, verbose=0))
    script = (
        "import sys, warnings, numpy as np, tensorflow as tf, keras, ttf\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from test_accelerate_tutorials import SavableDLRM, movielens\n"
        "x, y = movielens()\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('error')  # a variable Keras could not restore warns\n"
        "    model = keras.models.load_model(sys.argv[1], custom_objects={'SavableDLRM': SavableDLRM})\n"
        "assert type(model).__name__ == 'SavableDLRM' and len(ttf.embedding.tables_in(model)) == 6\n"
        "got = model.predict(tf.data.Dataset.from_tensor_slices((x, y)).batch(256), verbose=0)\n"
        "np.testing.assert_allclose(got, np.load(sys.argv[2]), rtol=1e-6, atol=1e-6)\n"
        "model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(256).take(2), verbose=0)  # and trains on\n"
        "print('EQUAL')\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dlrm.keras"), str(tmp_path / "expected.npy")],
                          capture_output=True, text=True, timeout=300, env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.stdout.strip().endswith("EQUAL"), proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.slow  # trains both models
def test_keras_io_dlrm_trained_with_sgd_equals_keras(tmp_path):
    """SGD moves exactly the rows a batch touches in both, so the accelerated DLRM must train
    to Keras' numbers (float32 order aside: 1e-5). No out-of-vocabulary zip code here: the
    dropped lookup's OOV row trains differently (warned about)."""
    x, y = movielens(1024)
    x["user_zip_code"] = np.where(x["user_zip_code"] == "99999", ZIP_CODES[0], x["user_zip_code"])
    model = DLRM(dense_num_units_lst=[32, 8], mlp_num_units_lst=[32, 16])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse")
    batch = {k: v[:256] for k, v in x.items()}
    model(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = ttf.accelerate(model, sample=batch)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
    fast.fit(dataset, epochs=2, verbose=0)
    model.fit(dataset, epochs=2, verbose=0)
    np.testing.assert_allclose(fast(batch).numpy(), model(batch).numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(fast(batch).numpy() - model(batch).numpy()).max() < 1e-3 * model(batch).numpy().std()
    for saved in (model, fast):  # the tutorial's class has no get_config: Keras refuses to save either
        with pytest.raises(NotImplementedError, match="get_config"):
            saved.save(str(tmp_path / "dlrm.keras"))


def dcn_example():
    """keras-rs' DCN example: functional, stacked FeatureCross over the embeddings, logits out."""
    inputs = {name: keras.Input(shape=(), dtype="int64", name=name) for name in SPARSE}
    embeddings = [keras.layers.Embedding(size + 1, 8, name=f"{name}_embedding")(inputs[name])
                  for name, size in SPARSE.items()]
    x0 = keras.layers.Concatenate()(embeddings)
    x = keras_rs.layers.FeatureCross()(x0, x0)
    x = keras_rs.layers.FeatureCross()(x0, x)
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


@pytest.mark.slow  # trains and exports
def test_keras_rs_dcn_example_fuses_trains_and_serves_logits(tmp_path):
    x, y = movielens(1024)
    x = {name: x[name] for name in SPARSE}
    model = dcn_example()
    model.compile(keras.optimizers.Adam(0.01, clipnorm=1.0), keras.losses.MeanSquaredError())
    fast = ttf.accelerate(model)
    (fused,) = [layer for layer in fast.layers if isinstance(layer, FusedLookup)]
    assert fused.tags == list(range(len(SPARSE)))  # one table, one op call for the five features
    np.testing.assert_allclose(fast.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert fast.optimizer.clipnorm == 1.0
    losses = fast.fit(x, y, batch_size=128, epochs=2, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    version = ttf.export_for_serving(fast, str(tmp_path / "dcn"))
    served = tf.saved_model.load(version).signatures["serving_default"](
        **{name: tf.constant(x[name][:16]) for name in SPARSE})
    assert list(served) == ["logits"]
    np.testing.assert_allclose(served["logits"].numpy(), fast.predict({k: v[:16] for k, v in x.items()}, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_loss_scale_factor_reaches_rows_and_accumulation_is_refused():
    ids = keras.Input([1], dtype="int64")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(8, 2, name="emb")(ids)))
    x, y = np.arange(8)[:, None], np.linspace(-1, 1, 8)[:, None].astype("float32")
    results = []
    for scale in (None, 128.0):
        model = keras.Model(ids, out)
        model.compile(keras.optimizers.SGD(0.5, loss_scale_factor=scale), "mse")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = ttf.accelerate(model)
        fast.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
        results.append(fast.predict(x, verbose=0))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)  # unscaled: the same steps
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        ttf.optimizers.from_keras(keras.optimizers.Adam(gradient_accumulation_steps=2))
