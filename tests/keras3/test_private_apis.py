"""The private Keras 3 internals ttf relies on (ttf/_keras3.py, and Layer._flatten_layers in
ttf/_keras.py and ttf/serving), checked by name: a Keras release that moves one fails here,
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
        f"private Keras internal Layer._flatten_layers (ttf/_keras.py tables_in, used by ttf/serving) is gone "
        f"in Keras {keras.__version__}")


def test_keras3_export_archive_layer_hook_is_still_there():
    module, cls, method = _keras3.EXPORT_ARCHIVE
    try:
        archive = getattr(importlib.import_module(module), cls)
        assert hasattr(archive, method) and hasattr(archive(), "_tf_trackable")
    except (ImportError, AttributeError, AssertionError) as err:
        pytest.fail(f"private Keras internal {module}.{cls}.{method} / _tf_trackable (ttf/_keras3.py: model.export() "
                    f"keeping ttf rows) changed in Keras {keras.__version__}: {err!r}")
