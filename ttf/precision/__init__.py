"""ttf.precision: run each training step in bfloat16 or float32, as the loss allows.

Policies (`AdaptivePrecision`): "time" (a step window), "time_lr" (the window minus
float32 holds around learning-rate changes and loss spikes) and "loss" (the
`TtfPrecisionSwitch` op decides from the loss's moving mean and deviation, plus periodic
float32 windows). `make_train_step` and `use_adaptive_precision` run a Keras model's
float32 weights in bfloat16 per step without retracing. See docs/precision.md.
"""
from ttf.precision._config import PrecisionConfig, SwitchConfig
from ttf.precision._policy import AdaptivePrecision
from ttf.precision._switch import PrecisionSwitch
from ttf.precision._train_step import (
    DualPrecisionStep,
    PrecisionTrainStep,
    apply_if_finite,
    low_precision,
    make_train_step,
    use_adaptive_precision,
)

__all__ = [
    "AdaptivePrecision",
    "DualPrecisionStep",
    "PrecisionConfig",
    "PrecisionSwitch",
    "PrecisionTrainStep",
    "SwitchConfig",
    "apply_if_finite",
    "low_precision",
    "make_train_step",
    "use_adaptive_precision",
]
