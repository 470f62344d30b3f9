"""Keras 3 (the `keras` package, TensorFlow backend): the private Keras internals ttf needs
when tf.keras resolves to it (only then imported: see ttf/_keras.py). Everything here is checked
by tests/keras3/test_private_apis.py, which fails naming the internal when a Keras release changes it.

- Model.compile is wrapped where Keras 3 defines it (its trainer class), see install_compile.
- A replaced train_step (ttf.precision.use_adaptive_precision) updates the model's loss
  metric itself, as Keras 3's own train_step does (track_loss).
- Legacy HDF5 saving (model.save("m.h5")) writes the layers' variables only, so a model
  holding ttf tables is refused before anything is written (as ttf/_keras_hooks.py does for
  tf_keras); there is no public hook for it.
"""
import importlib

import keras
import tensorflow as tf

from ttf._functional_graph import FunctionalGraph as _TfKerasGraph

# keras.src's classes are read where they are used (keras imports them all): a Keras release
# that moves one fails the ttf function that needs it, not `import ttf`.

# Model.compile is the trainer's compile: wrapping it there (not as Model.compile) keeps Keras 3's
# `.keras` loading compiling the model (compile_from_config skips a class that overrides it). The
# class is found through Model's MRO, not by name: Keras 3.16 (TensorFlow 2.22.0rc0's keras-nightly)
# renamed keras.src.trainers.trainer.Trainer to BaseTrainer.
TRAINER_MODULE = "keras.src.trainers.trainer"


def trainer_class():
    """The class of keras.src.trainers.trainer whose compile keras.Model.compile is (Trainer up to
    Keras 3.15, BaseTrainer from 3.16)."""
    owner = next((c for c in keras.Model.__mro__ if "compile" in vars(c)), None)
    if owner is None or owner.__module__ != TRAINER_MODULE:
        raise ImportError(f"ttf: keras.Model.compile is no longer defined in {TRAINER_MODULE} (it is "
                          f"{getattr(owner, '__qualname__', None)} of {getattr(owner, '__module__', None)}): "
                          "this Keras moved a private internal ttf wraps; install the Keras your TensorFlow pins")
    return owner


def install_compile(wrap):
    """Wraps Keras 3's trainer compile (which Model.compile is) with `wrap(original)`."""
    trainer = trainer_class()
    trainer.compile = wrap(trainer.compile)


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
# checkpoint entry), so the archive is given those too. No public hook for it either. The
# TensorFlow backend's archive class is found by its method, not its name: Keras 3.16 renamed
# TFExportArchive to SavedModelExportArchive.
EXPORT_MODULE, EXPORT_HOOK = "keras.src.backend.tensorflow.export", "_backend_track_layer"


def export_archive_class():
    """The TensorFlow backend's export archive: the class of EXPORT_MODULE that defines EXPORT_HOOK
    (TFExportArchive up to Keras 3.15, SavedModelExportArchive from 3.16)."""
    module = importlib.import_module(EXPORT_MODULE)
    found = [c for c in vars(module).values()
             if isinstance(c, type) and c.__module__ == EXPORT_MODULE and EXPORT_HOOK in vars(c)]
    if len(found) != 1:
        raise ImportError(f"ttf: {EXPORT_MODULE} has {len(found)} classes defining {EXPORT_HOOK}, not one: this Keras "
                          "moved a private internal ttf hooks into; install the Keras your TensorFlow pins")
    return found[0]


def install_export_tables(tables_in):
    """Makes Keras 3's export archive keep the rows of every ttf layer in a tracked layer."""
    archive = export_archive_class()
    original = getattr(archive, EXPORT_HOOK)

    def track_layer(self, layer):
        original(self, layer)
        held = getattr(self._tf_trackable, "ttf_logical_tables", None) or []
        held += [t.logical_table for t in tables_in(layer) if all(t.logical_table is not h for h in held)]
        self._tf_trackable.ttf_logical_tables = held  # tracked: the SavedModel's checkpoint holds the rows

    setattr(archive, EXPORT_HOOK, track_layer)


class FunctionalGraph(_TfKerasGraph):
    """The functional-model internals ttf walks, in Keras 3's spelling where it differs from
    tf_keras' (ttf/_functional_graph.py): a node's operation and its call's arguments, a built Sequential's
    Functional, and the model's input/output structures."""
    NODE_LAYER = "operation"

    @staticmethod
    def functional(model):
        """The Functional behind `model` (a built Sequential holds one), or None."""
        functional = keras.src.models.functional.Functional
        if isinstance(model, functional):
            return model
        inner = getattr(model, "_functional", None)  # keras.Sequential, once built
        return inner if isinstance(inner, functional) else None

    @staticmethod
    def inputs(node):
        return list(node.arguments.keras_tensors)

    @staticmethod
    def arguments(node):
        return node.arguments.args, node.arguments.kwargs

    @staticmethod
    def filled(node, tensors):
        return node.arguments.fill_in(tensors)

    @classmethod
    def new_input(cls, tensor):
        return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse, ragged=tensor.ragged,
                           name=cls.producer(tensor)[0].name)

    @staticmethod
    def is_dense(tensor):
        return not (tensor.sparse or tensor.ragged)

    @staticmethod
    def structures(model):
        return model._inputs_struct, model._outputs_struct  # pylint: disable=protected-access

    @staticmethod
    def compile_config(model):
        if not getattr(model, "compiled", False) or not hasattr(model, "_compile_config"):
            return None
        return dict(model._compile_config.config)  # pylint: disable=protected-access


def track_loss(model, loss, x):
    """What Keras 3's train_step does after compute_loss: the batch's loss into the model's
    loss metric (the `loss` of fit's logs), weighted by the batch size."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    model._loss_tracker.update_state(loss, sample_weight=tf.shape(first)[0])  # pylint: disable=protected-access


def tracker_class():
    """Keras 3's Tracker: a layer's record of its sublayers and variables (ttf.accelerate's copy of
    a Keras 3 model gives each copy its own)."""
    return keras.src.utils.tracking.Tracker
