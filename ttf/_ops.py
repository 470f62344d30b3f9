"""Loads ttf's op library (ttf/_ttf_ops.tf<X.Y>.so, built for TensorFlow X.Y) once, on first use.

Every module that needs an op calls `ops()`; nothing else loads the library. A library
loads only in the TensorFlow minor it was built for (another one's absl symbols differ), so
its name carries that minor and the running TensorFlow's is the one loaded. The error says
how to rebuild when it is missing or was built for another TensorFlow.
"""
import functools
import glob
import importlib.metadata
import os
import sys
import uuid

import tensorflow as tf

_DIR = os.path.dirname(os.path.abspath(__file__))
TF_MINOR = ".".join(tf.__version__.split(".")[:2])
LIBRARY_PATH = os.path.join(_DIR, f"_ttf_ops.tf{TF_MINOR}.so")
_REBUILD = (
    f"Rebuild it for TensorFlow {tf.__version__}: from the ttf checkout, ./scripts/setup_env.sh (or: python setup.py "
    "build_ext --inplace); in your own env, pip install --no-build-isolation <ttf checkout>."
)


def _other_builds():
    found = sorted(os.path.basename(p)[len("_ttf_ops.tf"):-len(".so")] for p in glob.glob(os.path.join(_DIR, "_ttf_ops.tf*.so")))
    return f" (this install has builds for TensorFlow {', '.join(found)} only)" if found else ""


def _wheel_mismatch():
    """The one-line error of a wheel under another TensorFlow minor, or None.

    A source checkout (or editable install) builds libraries for any TensorFlow; a wheel holds the
    one library of the TensorFlow minor it was built for, and nothing can rebuild it."""
    if os.path.exists(LIBRARY_PATH) or os.path.exists(os.path.join(_DIR, os.pardir, "setup.py")):
        return None
    built = sorted(os.path.basename(p)[len("_ttf_ops.tf"):-len(".so")] for p in glob.glob(os.path.join(_DIR, "_ttf_ops.tf*.so")))
    if not built:
        return None
    try:
        version = importlib.metadata.version("ttf").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        version = "*"
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return (f"ttf: this ttf wheel is built for TensorFlow {' and '.join(built)}, but TensorFlow {tf.__version__} is running; "
            f"install the wheel built for it, ttf-{version}+tf{TF_MINOR}-{py}-{py}-manylinux_*_x86_64.whl "
            f"(scripts/build_wheel.sh in the ttf checkout builds it), or TensorFlow {built[-1]}")


_MISMATCH = _wheel_mismatch()
if _MISMATCH:  # `import ttf` refuses at once: nothing in this install can run under this TensorFlow
    raise ImportError(_MISMATCH)


@functools.lru_cache(maxsize=None)
def ops():
    """Returns the loaded op module (generated Python wrappers of every ttf op)."""
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(f"ttf: the op library {LIBRARY_PATH} for TensorFlow {TF_MINOR} is missing{_other_builds()}. {_REBUILD}")
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
