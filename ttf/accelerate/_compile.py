"""An accelerated model compiled as the original was, with its optimizer converted."""
import sys
import warnings

import tensorflow as tf

import ttf.optimizers as ttf_optimizers
from ttf.optimizers import from_keras, not_reaching_rows


def compile_like(fast, model, config):
    config["optimizer"] = from_keras(model.optimizer)
    unreached = not_reaching_rows(config["optimizer"])
    if unreached:
        warnings.warn(f"ttf.accelerate: {model.name}'s optimizer settings {unreached} act on dense variables only, "
                      "not on the ttf tables' rows", stacklevel=3)
    if config.get("jit_compile") is True:
        warnings.warn(f"ttf.accelerate: jit_compile=True dropped for {fast.name}: ttf tables' ops run outside XLA "
                      "(XLA cannot compile a step that holds them)", stacklevel=3)
        config["jit_compile"] = False
    for name in ("loss", "metrics", "weighted_metrics"):
        config[name] = tf.nest.map_structure(_fresh, config.get(name))
    optimizer = config["optimizer"]
    # Where Keras' dense update moves rows the batch did not touch (Adam's momentum, any weight
    # decay, FTRL's l2 shrinkage), the lazy table update differs: said here, once.
    lazy = "" if not (isinstance(optimizer, ttf_optimizers.Adam) or optimizer.weight_decay or getattr(
        optimizer, "l2_shrinkage_regularization_strength", 0)) else (
        " (its table updates are lazy: only the rows a batch touches move, with their optimizer slots, where Keras "
        "also moves the other rows of an Embedding matrix each step)")
    print(f"ttf.accelerate: {fast.name} compiled like {model.name}, with ttf.optimizers.{type(optimizer).__name__}"
          f"{lazy}", file=sys.stderr)
    fast.compile(**config)


def _fresh(obj):
    """A new metric or loss object of the same config (they hold state tied to one model)."""
    if isinstance(obj, (tf.keras.metrics.Metric, tf.keras.losses.Loss)):
        return obj.__class__.from_config(obj.get_config())
    return obj
