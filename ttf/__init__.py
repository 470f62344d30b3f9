"""ttf: fast TensorFlow recommender training.

Importing ttf selects Keras 2 (tf_keras) for tf.keras by setting TF_USE_LEGACY_KERAS=1,
which must happen before tf.keras is first used; ttf's layers and optimizers are tf_keras
classes. If tf.keras already resolved to Keras 3 (something imported it first without
that variable), `import ttf` raises, naming the fix. It also loads ttf's op library, so a
SavedModel holding ttf layers loads in a fresh process after `import ttf`.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
if os.environ["TF_USE_LEGACY_KERAS"] not in ("1", "true", "True"):
    raise ImportError(
        "ttf needs Keras 2 (tf_keras): unset TF_USE_LEGACY_KERAS or set it to 1 before importing ttf."
    )

import tensorflow as _tf  # noqa: E402

if not _tf.keras.Model.__module__.startswith("tf_keras."):
    raise ImportError(
        f"ttf needs tf.keras to be Keras 2 (tf_keras), but tf.keras already resolved to "
        f"{_tf.keras.Model.__module__.split('.')[0]} (Keras 3): something used tf.keras before `import ttf` (deepctr does) "
        "while TF_USE_LEGACY_KERAS was unset. Fix: `import ttf` before that module, or set "
        "TF_USE_LEGACY_KERAS=1 in the environment before anything imports TensorFlow."
    )

__version__ = "0.1.0"

from ttf._ops import LIBRARY_PATH as _LIBRARY_PATH  # noqa: E402

if os.path.exists(_LIBRARY_PATH):  # (ttf._ops.ops() says how to rebuild when it is missing or stale)
    # Registers ttf's op types, which tf.saved_model.load of a model with ttf layers needs;
    # runs no op, so TensorFlow's context (devices) stays unconfigured until the user's code.
    _tf.load_op_library(_LIBRARY_PATH)

from ttf import _keras, checkpoint, data, distribute, optimizers, precision  # noqa: E402
from ttf._accelerate import accelerate  # noqa: E402
from ttf.embedding import DynamicEmbedding, FusedEmbedding  # noqa: E402
from ttf.serving import export_for_serving  # noqa: E402

_keras.install()

__all__ = ["DynamicEmbedding", "FusedEmbedding", "accelerate", "checkpoint", "data", "distribute", "export_for_serving",
           "optimizers", "precision"]
