"""Keras 3 (the `keras` package, TensorFlow backend): the private Keras internals ttf needs
when tf.keras resolves to it. Everything here is checked by tests/keras3/test_private_apis.py,
which fails naming the internal when a Keras release changes it.

- Legacy HDF5 saving (model.save("m.h5")) writes the layers' variables only, so a model
  holding ttf tables is refused before anything is written (as ttf/_keras.py does for
  tf_keras); there is no public hook for it.
"""
import importlib

# (module, function) pairs of Keras 3's legacy HDF5 writer.
HDF5_SAVERS = (("keras.src.legacy.saving.legacy_h5_format", "save_model_to_hdf5"),
               ("keras.src.legacy.saving.legacy_h5_format", "save_weights_to_hdf5_group"))


def install_h5_refusal(refuse):
    """Wraps Keras 3's HDF5 writers with `refuse(original)`."""
    for module_name, function in HDF5_SAVERS:
        module = importlib.import_module(module_name)
        setattr(module, function, refuse(getattr(module, function)))


# Keras 3's model.export() saves the variables and the lookup-table resources it finds, but
# not other checkpointed state: a ttf layer's rows live in its LogicalTable (the layer's
# checkpoint entry), so the archive is given those too. No public hook for it either.
EXPORT_ARCHIVE = ("keras.src.backend.tensorflow.export", "TFExportArchive", "_backend_track_layer")


def install_export_tables(tables_in):
    """Makes Keras 3's export archive keep the rows of every ttf layer in a tracked layer."""
    module_name, class_name, method = EXPORT_ARCHIVE
    archive = getattr(importlib.import_module(module_name), class_name)
    original = getattr(archive, method)

    def track_layer(self, layer):
        original(self, layer)
        held = getattr(self._tf_trackable, "ttf_logical_tables", None) or []
        held += [t.logical_table for t in tables_in(layer) if all(t.logical_table is not h for h in held)]
        self._tf_trackable.ttf_logical_tables = held  # tracked: the SavedModel's checkpoint holds the rows

    setattr(archive, method, track_layer)
