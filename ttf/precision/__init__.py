"""Adaptive mixed precision: bf16 for the dense part while training is calm, fp32 when it is not.

Three policies, picked by `AdaptivePrecision(policy=...)`:
  time     low precision for start_step <= step < end_step.
  time_lr  as time, plus fp32 for lr_hold_steps after the learning rate changes and while
           the loss fluctuates (relative change above loss_fluctuation).
  loss     the switch op (TtfPrecisionSwitch): low precision once the loss is stable
           (moving mean and deviation after warmup_steps, calm_steps calm steps in a row),
           fp32 for hold_steps after a spike (loss > mean + spike_k * deviation) or a
           NaN/Inf loss, plus periodic fp32 windows of interval_hold steps every interval
           steps. Its state is checkpointed with the AdaptivePrecision object.

`enable_mixed_precision(step, lr=None, loss=None)` answers for one step, so any training
loop can use it; `DualPrecisionStep` runs a step function traced once per precision and
picks the variant per step (no retracing when the policy switches).

Example:
  >>> import ttf
  >>> policy = ttf.precision.AdaptivePrecision("loss", warmup_steps=3, calm_steps=2, hold_steps=2)
  >>> [policy.enable_mixed_precision(step, loss=0.5) for step in range(6)]
  [False, False, False, True, True, True]
"""
import dataclasses
import itertools
import math

import tensorflow as tf

from ttf._ops import ops

POLICIES = ("time", "time_lr", "loss")
_switch_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    """Settings of every policy; each policy reads the ones it names (see the module doc)."""

    policy: str = "loss"
    start_step: int = 0
    end_step: int = 2**62
    lr_hold_steps: int = 100
    loss_fluctuation: float = 0.5
    interval: int = 0  # 0: no periodic fp32 windows
    interval_hold: int = 0
    warmup_steps: int = 100
    ema_decay: float = 0.98
    spike_k: float = 3.0
    hold_steps: int = 200
    calm_steps: int = 50

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("start_step", "end_step", "lr_hold_steps", "interval", "interval_hold", "warmup_steps",
                     "hold_steps", "calm_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.start_step > self.end_step:
            raise ValueError(f"start_step ({self.start_step}) must not exceed end_step ({self.end_step})")
        if not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {self.ema_decay}")
        if self.spike_k <= 0 or self.loss_fluctuation <= 0:
            raise ValueError("spike_k and loss_fluctuation must be > 0")
        if self.interval and self.interval_hold >= self.interval:
            raise ValueError(f"interval_hold ({self.interval_hold}) must be below interval ({self.interval})")


class PrecisionSwitch(tf.saved_model.experimental.TrackableResource):
    """The loss-driven switch op's state (checkpointable)."""

    def __init__(self, config):
        self._config = config
        self._shared_name = f"precision_switch_{next(_switch_ids)}"
        super().__init__()
        with tf.init_scope():
            self.resource_handle  # noqa: B018  (creates the resource now)

    def _create_resource(self):
        c = self._config
        return ops().ttf_precision_switch(warmup_steps=c.warmup_steps, ema_decay=c.ema_decay, spike_k=c.spike_k,
                                          hold_steps=c.hold_steps, calm_steps=c.calm_steps,
                                          shared_name=self._shared_name)

    def update(self, loss):
        """-> (use_low_precision, skip_update) for this loss."""
        return ops().ttf_precision_switch_update(self.resource_handle, tf.cast(loss, tf.float32))

    def _serialize_to_tensors(self):
        counters, stats = ops().ttf_precision_switch_export(self.resource_handle)
        return {"counters": counters, "stats": stats}

    def _restore_from_tensors(self, restored_tensors):
        return ops().ttf_precision_switch_import(self.resource_handle, restored_tensors["counters"],
                                                 restored_tensors["stats"])


class AdaptivePrecision(tf.Module):
    """Decides, step by step, whether the dense part runs in bf16 (see the module doc).

    Args: policy ("time" | "time_lr" | "loss") and any PrecisionConfig field.
    Checkpoint it (tf.train.Checkpoint(precision=...)) to keep the loss policy's state.
    """

    def __init__(self, policy="loss", **settings):
        super().__init__(name="adaptive_precision")
        self.config = PrecisionConfig(policy=policy, **settings)
        self.switch = PrecisionSwitch(self.config) if policy == "loss" else None
        self.last_skip_update = False
        self._last_lr = None
        self._last_loss = None
        self._last_low = False
        self._fp32_until = -1  # time_lr: fp32 up to and including this step
        self.low_steps = 0
        self.steps = 0

    def enable_mixed_precision(self, step, lr=None, loss=None):
        """Whether `step` should run in low precision. `loss` is the latest known loss (the
        loss policy needs it, time_lr uses it); `lr` the current learning rate (time_lr)."""
        c = self.config
        step = int(step)
        self.last_skip_update = loss is not None and not math.isfinite(float(loss))
        if c.policy == "loss":
            low = self._loss_decision(loss)
        else:
            low = c.start_step <= step < c.end_step
            if c.policy == "time_lr":
                low = self._time_lr_decision(step, lr, loss) and low
        if c.interval and step % c.interval < c.interval_hold:
            low = False  # periodic full-precision window
        self.steps += 1
        self.low_steps += int(low)
        return low

    def _loss_decision(self, loss):
        if loss is None:  # nothing new to judge: keep the last decision
            return self._last_low
        low, _ = self.switch.update(float(loss))
        self._last_low = bool(low)
        return self._last_low

    def _time_lr_decision(self, step, lr, loss):
        c = self.config
        if lr is not None:
            lr = float(lr)
            if self._last_lr is not None and not math.isclose(lr, self._last_lr, rel_tol=1e-9):
                self._fp32_until = step + c.lr_hold_steps - 1
            self._last_lr = lr
        if loss is not None:
            loss = float(loss)
            previous = self._last_loss
            if not math.isfinite(loss) or (previous is not None and previous > 0
                                           and abs(loss - previous) / previous > c.loss_fluctuation):
                self._fp32_until = step + c.lr_hold_steps - 1
            if math.isfinite(loss):
                self._last_loss = loss
        return step > self._fp32_until

    @property
    def low_fraction(self):
        """Share of the decided steps that ran in low precision."""
        return self.low_steps / self.steps if self.steps else 0.0


def apply_if_finite(optimizer, loss, grads, variables):
    """Applies the gradients only when `loss` is finite: a NaN/Inf step leaves every weight
    (and the optimizer's step) untouched. Returns whether it applied. Build the optimizer's
    slots first (optimizer.build(variables)) when calling this inside a tf.function.
    Works where apply_gradients may run inside a tf.cond: single-process training (not
    under ParameterServerStrategy, whose update path cannot run in a branch)."""
    def apply():
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    return tf.cond(tf.math.is_finite(loss), apply, lambda: tf.constant(False))


class DualPrecisionStep:
    """A training step traced once in fp32 and once in bf16, picked per call.

    step_fn(compute_dtype, *args) builds the step's graph for one precision; it must keep
    its variables in fp32 and cast at the boundary. `traces` counts how often each variant
    was traced (1 each in steady use: switching precision never retraces).
    """

    def __init__(self, step_fn):
        self.traces = {"fp32": 0, "bf16": 0}

        def variant(dtype, name):
            def traced(*args):
                self.traces[name] += 1
                return step_fn(dtype, *args)
            return tf.function(traced)

        self._fp32 = variant(tf.float32, "fp32")
        self._bf16 = variant(tf.bfloat16, "bf16")

    def __call__(self, use_low_precision, *args):
        return (self._bf16 if use_low_precision else self._fp32)(*args)


__all__ = ["AdaptivePrecision", "DualPrecisionStep", "POLICIES", "PrecisionConfig", "PrecisionSwitch", "apply_if_finite"]
