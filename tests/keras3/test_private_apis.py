"""The private Keras 3 internals ttf relies on (ttf/_keras3.py, and Layer._flatten_layers in
ttf/embedding's tables_in and ttf.accelerate), checked by name: a Keras release that moves one fails here,
naming it, instead of deep inside a model."""
import importlib

import keras
import pytest

from ttf import _keras3


@pytest.mark.parametrize("module,attr", _keras3.HDF5_SAVERS, ids=[a for _, a in _keras3.HDF5_SAVERS])
def test_keras3_hdf5_writer_is_still_there(module, attr):
    try:
        getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"private Keras internal {module}.{attr} (ttf/_keras3.py: refusing .h5 saves of ttf tables) is "
                    f"gone in Keras {keras.__version__}: {err}")


def test_keras3_layer_flatten_layers_is_still_there():
    assert hasattr(keras.layers.Layer, "_flatten_layers"), (
        f"private Keras internal Layer._flatten_layers (ttf/embedding tables_in, ttf.accelerate) is gone "
        f"in Keras {keras.__version__}")


def test_keras3_export_archive_layer_hook_is_still_there():
    try:
        archive = _keras3.export_archive_class()
        assert hasattr(archive(), "_tf_trackable")
    except (ImportError, AttributeError, AssertionError) as err:
        pytest.fail(f"private Keras internal {_keras3.EXPORT_MODULE} {_keras3.EXPORT_HOOK} / _tf_trackable (ttf/_keras3.py: "
                    f"model.export() keeping ttf rows) changed in Keras {keras.__version__}: {err!r}")


def test_keras3_trainer_compile_is_still_where_ttf_wraps_it():
    """Model.compile is defined once, in keras.src.trainers.trainer (Trainer up to Keras 3.15, BaseTrainer
    from 3.16), which compile_from_config compares a loaded model's compile against."""
    try:
        trainer = _keras3.trainer_class()
    except ImportError as err:
        pytest.fail(f"private Keras internal (ttf/_keras3.py install_compile) moved in Keras {keras.__version__}: {err}")
    assert keras.Model.compile is trainer.compile and "compile" not in vars(keras.Model)
    assert "compile_from_config" in vars(trainer), (
        f"{trainer.__qualname__}.compile_from_config moved in Keras {keras.__version__}: .keras loading may skip compile")


def test_keras3_functional_graph_internals_are_still_there():
    """ttf.accelerate walks a Functional through _keras3.FunctionalGraph."""
    from keras.src.models.functional import Functional
    ids = keras.Input([1], dtype="int64", name="ids")
    model = keras.Sequential([ids, keras.layers.Embedding(10, 2), keras.layers.Flatten()])
    graph = _keras3.FunctionalGraph.functional(model)
    try:
        assert isinstance(graph, Functional)
        node = graph._nodes_by_depth[0][0]
        assert node.operation is model.layers[-1] and node.outputs and node.arguments.keras_tensors
        assert _keras3.FunctionalGraph.producer(node.arguments.keras_tensors[0])[0] is model.layers[0]
        assert graph._inputs_struct is not None and graph._outputs_struct is not None
        node.arguments.fill_in({id(t): t for t in node.arguments.keras_tensors})
    except (AttributeError, AssertionError, ImportError) as err:
        pytest.fail(f"private Keras internals of functional models (ttf/_keras3.py FunctionalGraph, used by "
                    f"ttf.accelerate) changed in Keras {keras.__version__}: {err!r}")


def test_keras3_loss_tracker_is_still_there():
    ids = keras.Input([2])
    model = keras.Model(ids, keras.layers.Dense(1)(ids))
    model.compile("sgd", "mse")
    assert hasattr(getattr(model, "_loss_tracker", None), "update_state"), (
        f"private Keras internal Model._loss_tracker (ttf/_keras3.py track_loss: the loss in model.fit's logs "
        f"under ttf.precision) changed in Keras {keras.__version__}")


def test_keras3_layer_tracker_is_still_there():
    """ttf.accelerate's Keras 3 copy of a subclassed model gives each copied layer's Tracker the
    copies' ids, and unlocks a built model's trackers to swap its Embeddings."""
    try:
        tracker = keras.layers.Dense(1)._tracker
        assert isinstance(tracker, _keras3.tracker_class())
        assert all(hasattr(tracker, name) for name in ("stored_ids", "config", "locked", "untrack"))
    except (AttributeError, AssertionError) as err:
        pytest.fail(f"private Keras internal keras.src.utils.tracking.Tracker (ttf/_keras3.py tracker_class, used by "
                    f"ttf/accelerate/_keras3_copy.py and _paths.py) moved in Keras {keras.__version__}: {err!r}")
