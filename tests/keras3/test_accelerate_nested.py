"""ttf.accelerate on Keras 3 of a functional model whose features are nested
Sequential([lookup, Embedding]) blocks (TensorFlow Recommenders' per-feature blocks): the tf_keras
set's tests (tests/accelerate/test_nested_blocks.py, written against tf.keras, which is Keras 3 in
this process) run here unchanged: each block converts, its outputs equal the original's before
training (1e-6), it trains; a Hashing block converts and a kept block stays."""
import importlib.util
import os

import keras
import tensorflow as tf

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "accelerate",
                     "test_nested_blocks.py")
_spec = importlib.util.spec_from_file_location("tf_keras_nested_blocks_tests", _path)
_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tests)
globals().update({name: getattr(_tests, name) for name in dir(_tests) if name.startswith("test_")})


def test_these_run_on_keras_3():
    assert tf.keras.layers.Embedding is keras.layers.Embedding and keras.__version__.startswith("3.")
