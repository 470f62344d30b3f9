"""ttf.precision on Keras 3: the tf_keras set's train-step tests (tests/precision/
test_train_step.py, written against tf.keras, which is Keras 3 in this process) run here
unchanged: one trace per variant, bf16 matmuls with float32 weights, skipped non-finite
steps, model.fit's hook, and the loss policy matching float32 AUC."""
import importlib.util
import os

import keras
import tensorflow as tf

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "precision", "test_train_step.py")
_spec = importlib.util.spec_from_file_location("tf_keras_train_step_tests", _path)
_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tests)
globals().update({name: getattr(_tests, name) for name in dir(_tests) if name.startswith("test_")})


def test_these_run_on_keras_3():
    assert tf.keras.layers.Dense is keras.layers.Dense and keras.__version__.startswith("3.")
