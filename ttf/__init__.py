"""ttf: fast TensorFlow recommender training.

ttf works with whichever Keras tf.keras resolves to and never switches it: Keras 3 (the
default of TF 2.16+, `import keras`) or Keras 2 (tf_keras, with TF_USE_LEGACY_KERAS=1 set
before anything uses tf.keras). Its layers and optimizers subclass that Keras' classes;
the tables, ops and fused updates are the same under both. `import ttf` also loads ttf's
op library, so a SavedModel holding ttf layers loads in a fresh process after it.
"""
import os

# Quiet by default: TensorFlow's C++ INFO and WARNING lines say nothing to a ttf user (they
# apply when ttf is imported before TensorFlow). TF_CPP_MIN_LOG_LEVEL, when set, wins;
# TTF_VERBOSE=1 shows everything.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if os.environ.get("TTF_VERBOSE") == "1" else "2")

import tensorflow as _tf  # noqa: E402

__version__ = "0.1.0"

from ttf._ops import LIBRARY_PATH as _LIBRARY_PATH  # noqa: E402

if os.path.exists(_LIBRARY_PATH):  # (ttf._ops.ops() says how to rebuild when it is missing or stale)
    # Registers ttf's op types, which tf.saved_model.load of a model with ttf layers needs;
    # runs no op, so TensorFlow's context (devices) stays unconfigured until the user's code.
    _tf.load_op_library(_LIBRARY_PATH)

from ttf import _keras_hooks, checkpoint, data, distribute, optimizers, precision, summary  # noqa: E402
# The function, not its package: ttf.accelerate(model) (the package's modules import by full name).
from ttf.accelerate import accelerate  # noqa: E402
from ttf.embedding import DynamicEmbedding, FusedEmbedding  # noqa: E402
from ttf.serving import export_for_serving  # noqa: E402

_keras_hooks.install()

__all__ = ["DynamicEmbedding", "FusedEmbedding", "accelerate", "checkpoint", "data", "distribute", "export_for_serving",
           "optimizers", "precision", "summary"]
