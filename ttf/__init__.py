"""ttf: fast TensorFlow recommender training.

Importing ttf selects Keras 2 (tf_keras) for tf.keras by setting TF_USE_LEGACY_KERAS=1,
which must happen before tf.keras is first used; ttf's layers and optimizers are tf_keras
classes.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
if os.environ["TF_USE_LEGACY_KERAS"] not in ("1", "true", "True"):
    raise ImportError(
        "ttf needs Keras 2 (tf_keras): unset TF_USE_LEGACY_KERAS or set it to 1 before importing ttf."
    )

__version__ = "0.1.0"

from ttf import checkpoint, data, distribute, optimizers, precision  # noqa: E402
from ttf.embedding import DynamicEmbedding, FusedEmbedding  # noqa: E402
from ttf.serving import export_for_serving  # noqa: E402

__all__ = ["DynamicEmbedding", "FusedEmbedding", "checkpoint", "data", "distribute", "export_for_serving", "optimizers", "precision"]
