"""ttf.accelerate on a real client: DeepCTR 0.9.4 (installed with --no-deps by
scripts/setup_env.sh) DeepFM, WDL, DCN and xDeepFM, converted and trained."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import ttf  # before deepctr: deepctr imports tf.keras, which must resolve to tf_keras

deepctr_models = pytest.importorskip("deepctr.models")
from deepctr.feature_column import DenseFeat, SparseFeat  # noqa: E402

FIELDS, VOCAB, ROWS = 8, 200, 4096


def planted_data(seed=0):
    """Label = planted per-id weights of 3 fields above their median: learnable only
    through the embeddings."""
    rng = np.random.default_rng(seed)
    x = {f"C{i}": rng.integers(0, VOCAB, ROWS).astype(np.int32) for i in range(FIELDS)}
    x["I0"] = rng.random(ROWS).astype(np.float32)
    weights = rng.normal(size=(3, VOCAB))
    score = sum(weights[i][x[f"C{i}"]] for i in range(3))
    return x, (score > np.median(score)).astype(np.float32)


def build(name):
    feats = [SparseFeat(f"C{i}", VOCAB, embedding_dim=8) for i in range(FIELDS)] + [DenseFeat("I0", 1)]
    kwargs = dict(task="binary", seed=1)
    if name == "DeepFM":
        model = deepctr_models.DeepFM(feats, feats, dnn_hidden_units=(32, 16), **kwargs)
    elif name == "WDL":
        model = deepctr_models.WDL(feats, feats, dnn_hidden_units=(32, 16), **kwargs)
    elif name == "DCN":
        model = deepctr_models.DCN(feats, feats, cross_num=2, dnn_hidden_units=(32, 16), **kwargs)
    else:
        model = deepctr_models.xDeepFM(feats, feats, dnn_hidden_units=(32, 16), cin_layer_size=(16, 16), **kwargs)
    model.compile(tf.keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["AUC"])
    return model


def check_converted_and_trains(name):
    model = build(name)
    x, y = planted_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ttf.accelerate(model)
    regularizer = [str(w.message) for w in caught if "regularizer dropped" in str(w.message)]
    assert regularizer and "sparse_emb_C0" in regularizer[0]  # DeepCTR's l2_reg_embedding, named
    assert not any(isinstance(layer, tf.keras.layers.Embedding) for layer in fast.layers)
    fused = [layer for layer in fast.layers if isinstance(layer, ttf.embedding.FusedLookup)]
    # one lookup per embedding width: 8 (the DNN/FM/CIN/cross fields) and 1 (the linear part)
    assert sorted(layer.dim for layer in fused) == [1, 8]
    np.testing.assert_allclose(fast.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert isinstance(fast.optimizer, ttf.optimizers.Adam) and float(fast.optimizer.learning_rate) == pytest.approx(0.01)
    before = model.get_weights()
    fast.fit(x, y, epochs=3, batch_size=256, verbose=0)
    auc = fast.evaluate(x, y, verbose=0, return_dict=True)["auc"]
    assert auc > 0.8, auc
    for w0, w1 in zip(before, model.get_weights()):  # the original model is untouched
        np.testing.assert_array_equal(w0, w1)
    return fast


def test_deepfm_converted_matches_and_trains():
    check_converted_and_trains("DeepFM")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["WDL", "DCN", "xDeepFM"])
def test_other_deepctr_models_converted_match_and_train(name):
    check_converted_and_trains(name)


@pytest.mark.slow  # DeepFM with 26 x 100,000 rows carried over
def test_readme_accelerate_example_runs(tmp_path):
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    readme = open(os.path.join(root, "README.md")).read()
    example = re.search(r"## Bring your own Keras model: `ttf.accelerate`\n\n```python\n(.*?)```", readme, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(example + "print('auc', fast.history.history['auc'][-1])\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(re.search(r"auc ([0-9.]+)", proc.stdout).group(1)) > 0.5
