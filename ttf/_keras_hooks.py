"""Where stock Keras meets ttf tables outside ttf's own classes; installed by `import ttf`.

Works with either Keras tf.keras resolves to; Keras 3's private places for these hooks are in
ttf/_keras3.py, tf_keras' here.

- Model.compile with a stock Keras optimizer (object or name) on a model holding ttf
  tables converts it to its ttf twin (ttf.optimizers.from_keras) with a one-line notice,
  or raises naming ttf.optimizers when there is no twin.
- A stock Keras optimizer's apply_gradients given a ttf table's gradient (a custom loop)
  raises naming ttf.optimizers.from_keras, instead of failing inside ResourceScatterAdd.
- Legacy HDF5 saving (model.save("m.h5"), save_weights("w.h5")) of a model holding ttf
  tables raises naming the formats that keep the rows, before writing anything; HDF5
  would save the layers' variables only and reload empty tables.
- Keras 3's model.export() keeps the rows of the ttf layers it exports.
"""
import functools
import sys

import tensorflow as tf

from ttf._keras import KERAS3
from ttf.embedding import embedding_of, tables_in
from ttf.optimizers import _TableUpdates, from_keras

if KERAS3:
    from ttf import _keras3
else:  # tf_keras' legacy HDF5 writer (tf_keras is absent where Keras 3 is the only Keras)
    from tf_keras.src.saving.legacy import hdf5_format


def _compile(original):
    @functools.wraps(original)
    def compile(self, optimizer="rmsprop", *args, **kwargs):  # noqa: A001  (Keras' name)
        if tables_in(self) and not isinstance(optimizer, _TableUpdates):
            stock = tf.keras.optimizers.get(optimizer)
            try:
                optimizer = from_keras(stock)
            except ValueError as err:
                raise ValueError(f"{self.name} holds ttf tables, which train only with ttf.optimizers: {err}") from None
            print(f"ttf: {self.name} holds ttf tables; compile's {type(stock).__name__} was converted to "
                  f"ttf.optimizers.{type(optimizer).__name__} with the same hyperparameters", file=sys.stderr)
        return original(self, optimizer, *args, **kwargs)

    return compile


def _apply_gradients(original):
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if not isinstance(self, _TableUpdates):
            tables = sorted({embedding_of(v).name for _, v in grads_and_vars if embedding_of(v) is not None})
            if tables:
                raise TypeError(
                    f"{type(self).__name__} is a stock Keras optimizer and cannot train ttf tables {tables}; use "
                    f"ttf.optimizers (ttf.optimizers.from_keras(opt) converts Adam, Adagrad, Ftrl and SGD)")
        return original(self, grads_and_vars, *args, **kwargs)

    return apply_gradients


def _refuse_h5(original):
    @functools.wraps(original)
    def save(*args, **kwargs):
        model = next(a for a in args if isinstance(a, tf.keras.layers.Layer))
        names = [layer.name for layer in tables_in(model)]
        if names:
            raise ValueError(
                f"{model.name} holds ttf tables {names}, whose rows HDF5 (.h5) saving cannot hold; save with "
                "model.save('model.keras'), model.save_weights('w.weights.h5'), a SavedModel directory "
                "(tf.saved_model.save / model.save('dir')) or tf.train.Checkpoint")
        return original(*args, **kwargs)

    return save


def install():
    """Installs the hooks once (idempotent)."""
    if getattr(tf.keras.Model.compile, "_ttf_hook", False):
        return
    if KERAS3:  # on the class defining it: Keras 3 skips compile_from_config when Model overrides it
        _keras3.install_compile(_compile)
    else:
        tf.keras.Model.compile = _compile(tf.keras.Model.compile)
    legacy = () if KERAS3 else (tf.keras.optimizers.legacy.Optimizer,)  # tf_keras' OptimizerV2 (gone in Keras 3)
    for base in (tf.keras.optimizers.Optimizer,) + legacy:
        base.apply_gradients = _apply_gradients(base.apply_gradients)
    if KERAS3:
        _keras3.install_h5_refusal(_refuse_h5)
        _keras3.install_export_tables(tables_in)
    else:
        hdf5_format.save_model_to_hdf5 = _refuse_h5(hdf5_format.save_model_to_hdf5)
        hdf5_format.save_weights_to_hdf5_group = _refuse_h5(hdf5_format.save_weights_to_hdf5_group)
    tf.keras.Model.compile._ttf_hook = True
