"""ttf.precision: run each training step in bfloat16 or float32, as the loss allows.

Policies (`AdaptivePrecision`): "time" (a step window), "time_lr" (the window minus
float32 holds around learning-rate changes and loss spikes) and "loss" (the
`TtfPrecisionSwitch` op decides from the loss's moving mean and deviation, plus periodic
float32 windows). `PrecisionTrainStep` is ttf's one training step: `make_train_step`
(your own loop) and `use_adaptive_precision` (model.fit) build it. It runs a Keras
model's float32 weights in bfloat16 per step without retracing, skips a step whose loss
or any gradient is NaN/Inf whole (counted), and raises `NonFiniteTrainingError` after too
many such steps in a row; given a ParameterServerStrategy, it runs on the strategy's workers.
`NonFiniteGuard` is the skip alone, for a worker step of your own written around
`strategy.run`. See docs/precision.md.
"""
from ttf.precision._config import PrecisionConfig, SwitchConfig
from ttf.precision._cpu import cpu_has_native_bf16
from ttf.precision._policy import AdaptivePrecision
from ttf.precision._presets import policy_for, resolve_precision
from ttf.precision._switch import PrecisionSwitch
from ttf.precision._train_step import (
    NonFiniteGuard,
    NonFiniteTrainingError,
    PrecisionTrainStep,
    low_precision,
    make_train_step,
    use_adaptive_precision,
)

__all__ = [
    "AdaptivePrecision",
    "NonFiniteGuard",
    "NonFiniteTrainingError",
    "PrecisionConfig",
    "PrecisionSwitch",
    "PrecisionTrainStep",
    "SwitchConfig",
    "cpu_has_native_bf16",
    "low_precision",
    "make_train_step",
    "policy_for",
    "resolve_precision",
    "use_adaptive_precision",
]
