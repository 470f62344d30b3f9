"""ttf.accelerate: a user's Keras model with its Embedding layers turned into ttf tables."""
from ttf.accelerate._functional import accelerate

__all__ = ["accelerate"]
