"""Loads ttf's op library (ttf/_ttf_ops.so) once, on first use.

Every module that needs an op calls `ops()`; nothing else loads the library. The error
says how to rebuild when the library is missing or was built for another TensorFlow.
"""
import functools
import os
import uuid

import tensorflow as tf

_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(_DIR, "_ttf_ops.so")
_REBUILD = "Rebuild it from the ttf checkout with ./scripts/setup_env.sh (or: python setup.py build_ext --inplace)."


@functools.lru_cache(maxsize=None)
def ops():
    """Returns the loaded op module (generated Python wrappers of every ttf op)."""
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(f"ttf: the op library {LIBRARY_PATH} is missing. {_REBUILD}")
    try:
        module = tf.load_op_library(LIBRARY_PATH)
    except tf.errors.NotFoundError as err:  # undefined symbols: built against another TF
        raise ImportError(f"ttf: loading {LIBRARY_PATH} failed ({err}). {_REBUILD}") from err
    with tf.init_scope():  # eager even when first called while a graph is being traced
        built_for = module.ttf_build_info().numpy().decode()
    if built_for != tf.__version__:
        raise ImportError(
            f"ttf: the op library was built for TensorFlow {built_for}, but TensorFlow "
            f"{tf.__version__} is running. {_REBUILD}"
        )
    return module


def unique_resource_name(prefix):
    """The `shared_name` of a new ttf resource (table, precision switch): `prefix` plus a
    random uuid. Unique per object across processes and hosts: eager mode caches kernels by
    attributes, a parameter server holds the resources of every process that connects to
    it, and a SavedModel loaded here must neither share nor (when garbage-collected)
    destroy another object's resource."""
    return f"{prefix}_{uuid.uuid4().hex}"
