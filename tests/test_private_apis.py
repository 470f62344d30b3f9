"""Every private TensorFlow / tf_keras internal ttf relies on, checked by name: when a TensorFlow
or Keras release moves or renames one, this test fails naming it (and the ttf module that
uses it) instead of ttf failing deep inside a model. Keep this list in step with the code:
a new private use goes here too (issue 20, "Private APIs")."""
import importlib

import pytest
import tensorflow as tf

import ttf  # noqa: F401  (Keras 2 before tf.keras is used)

# (module, attribute, the ttf modules that use it)
MODULE_ATTRS = [
    ("tf_keras.src.saving.legacy.hdf5_format", "save_model_to_hdf5", "ttf/_keras_hooks.py"),
    ("tf_keras.src.saving.legacy.hdf5_format", "save_weights_to_hdf5_group", "ttf/_keras_hooks.py"),
    ("tf_keras.src.engine.keras_tensor", "KerasTensor", "ttf/accelerate/_functional.py"),
    ("tf_keras.src.mixed_precision.autocast_variable", "AutoCastVariable", "ttf/precision/_train_step.py"),
    ("tf_keras.src.mixed_precision.autocast_variable", "create_autocast_variable", "ttf/precision/_train_step.py"),
    ("tensorflow.python.eager.record", "could_possibly_record", "ttf/embedding/_layers.py"),
    ("tensorflow.python.saved_model.nested_structure_coder", "encode_structure", "ttf/embedding/_table.py"),
    ("tensorflow.python.saved_model.nested_structure_coder", "decode_proto", "ttf/embedding/_table.py"),
    ("tensorflow.python.saved_model.registration", "register_serializable", "ttf/embedding/_table.py"),
    ("tensorflow", "keras.optimizers.legacy.Optimizer", "ttf/_keras_hooks.py"),
    ("tensorflow.python.framework.func_graph", "FuncGraph.capture_call_time_value", "ttf/distribute/collectives/_tf.py"),
]
# Private members of a functional tf.keras model: (attribute, the ttf modules that use it)
MODEL_ATTRS = [
    ("_flatten_layers", "ttf/embedding/_layers.py (tables_in), ttf/accelerate/, ttf/distribute/_table_sharding.py, ttf/precision/_train_step.py"),
    ("_nodes_by_depth", "ttf/_keras.py (FunctionalGraph: ttf/accelerate, ttf/distribute/_table_sharding.py)"),
]


@pytest.mark.parametrize("module,attr,users", MODULE_ATTRS, ids=[f"{m}.{a}" for m, a, _ in MODULE_ATTRS])
def test_private_module_attribute_is_still_there(module, attr, users):
    try:
        value = importlib.import_module(module)
        for part in attr.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"private internal {module}.{attr} (used by {users}) is gone in TensorFlow {tf.__version__}: {err}")


@pytest.mark.parametrize("attr,users", MODEL_ATTRS, ids=[a for a, _ in MODEL_ATTRS])
def test_private_model_member_is_still_there(attr, users):
    inputs = tf.keras.Input([2])
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
    assert hasattr(model, attr), (
        f"private internal tf.keras.Model.{attr} (used by {users}) is gone in {type(model).__module__} "
        f"with TensorFlow {tf.__version__}")
