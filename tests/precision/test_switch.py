"""The TtfPrecisionSwitch op through its wrapper, PrecisionSwitch: decisions, state, errors."""
import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from ttf._ops import ops
from ttf.precision import PrecisionSwitch, SwitchConfig


def feed(switch, losses, first_step=0):
    """Feeds losses at consecutive steps; returns (use_low_next, skip) per step as lists."""
    lows, skips = [], []
    for offset, loss in enumerate(losses):
        low, skip = switch.update(tf.constant(loss, tf.float32), first_step + offset)
        lows.append(bool(low))
        skips.append(bool(skip))
    return lows, skips


class ReferenceSwitch:
    """The rule written out in plain Python (docs/precision.md), to check the op against."""

    def __init__(self, c):
        # The op's float attrs are float32: round the same way.
        self.c = dataclasses.replace(c, **{
            name: float(np.float32(getattr(c, name)))
            for name in ("decay", "spike_k", "calm_k", "min_relative_deviation")})
        self.mean = self.var = 0.0
        self.observed = self.calm_run = self.hold_until = 0
        self.low = False

    def fold(self, loss):
        if self.observed == 0:
            self.mean, self.var = loss, 0.0
        else:
            alpha = 1 - self.c.decay
            diff = loss - self.mean
            self.mean += alpha * diff
            self.var = (1 - alpha) * (self.var + diff * alpha * diff)
        self.observed += 1

    def hold(self, step):
        self.low, self.calm_run = False, 0
        self.hold_until = max(self.hold_until, step + self.c.hold_steps + 1)

    def update(self, loss, step):
        if not math.isfinite(loss):
            self.hold(step)
            return False, True
        if self.observed < max(self.c.warmup_steps, 1):
            self.fold(loss)
            return False, False
        dev = max(math.sqrt(self.var), self.c.min_relative_deviation * abs(self.mean))
        spike = loss > self.mean + self.c.spike_k * dev
        calm = loss <= self.mean + self.c.calm_k * dev
        self.fold(loss)
        if spike:
            self.hold(step)
        elif calm:
            self.calm_run += 1
        else:
            self.calm_run = 0
        if not self.low and step + 1 >= self.hold_until and self.calm_run >= self.c.calm_steps:
            self.low = True
        return self.low, False


SMALL = SwitchConfig(warmup_steps=5, calm_steps=3, hold_steps=4)


def test_calm_loss_goes_low_after_warmup_and_calm_run():
    lows, skips = feed(PrecisionSwitch(SMALL), [1.0] * 12)
    # Steps 0-4 warm up; the calm run counts steps 5, 6, 7; step 8 is the first in bf16.
    assert lows == [False] * 7 + [True] * 5
    assert not any(skips)


def test_spike_forces_float32_for_the_hold_window_then_returns():
    losses = [1.0] * 10 + [3.0] + [1.0] * 10
    lows, skips = feed(PrecisionSwitch(SMALL), losses)
    assert lows[9] is True  # low before the spike
    # The spike at step 10 -> steps 11..14 (hold_steps=4) float32; the calm run (3 steps:
    # 11, 12, 13) is already complete, so step 15 is low again.
    assert lows[10:14] == [False] * 4
    assert lows[14] is True
    assert not any(skips)


def test_nan_and_inf_skip_the_update_and_hold_float32_without_touching_statistics():
    switch = PrecisionSwitch(SMALL)
    feed(switch, [1.0] * 10)
    before = switch.state()
    for bad, step in ((float("nan"), 10), (float("inf"), 11), (-float("inf"), 12)):
        low, skip = switch.update(tf.constant(bad), step)
        assert (bool(low), bool(skip)) == (False, True)
    after = switch.state()
    assert after["mean"] == before["mean"] and after["deviation"] == before["deviation"]
    assert after["non_finite"] == 3 and after["holding"] == 1
    assert after["hold_until_step"] == 12 + SMALL.hold_steps + 1
    lows, skips = feed(switch, [1.0] * 6, first_step=13)
    # Float32 through step 16 (hold), then low once the calm run (13, 14, 15) is there.
    assert lows == [False, False, False, True, True, True] and not any(skips)
    assert switch.state()["holding"] == 0


def test_noise_within_the_calm_band_never_flaps():
    rng = np.random.default_rng(0)
    losses = 0.5 + 0.01 * rng.standard_normal(3000)
    lows, _ = feed(PrecisionSwitch(SwitchConfig(warmup_steps=50)), losses.tolist())
    first_low = lows.index(True)
    assert first_low < 200
    assert all(lows[first_low:]), "Gaussian noise triggered a switch back to float32"


def test_losses_between_the_thresholds_keep_the_current_mode():
    config = SwitchConfig(warmup_steps=3, calm_steps=2, hold_steps=0, decay=0.5, spike_k=4.0, calm_k=1.0,
                          min_relative_deviation=0.1)
    switch = PrecisionSwitch(config)
    lows, _ = feed(switch, [1.0] * 6)
    assert lows[-1] is True
    # deviation floor 0.1: 1.25 is 2.5 deviations above the mean: above calm, below spike.
    lows, _ = feed(switch, [1.25], first_step=6)
    assert lows == [True]  # low stays low
    state = switch.state()
    assert state["calm_run"] == 0 and state["spikes"] == 0


def test_decisions_and_statistics_match_the_reference_rule():
    rng = np.random.default_rng(1)
    losses = (0.6 * np.exp(-np.arange(800) / 300) + 0.02 * rng.standard_normal(800)).tolist()
    for index in (150, 151, 400, 620):
        losses[index] *= 3.0  # spikes
    losses[300] = float("nan")
    losses[500] = float("inf")
    losses = [float(np.float32(loss)) for loss in losses]  # what the op sees
    config = SwitchConfig(warmup_steps=20, calm_steps=5, hold_steps=30, spike_k=3.0, calm_k=1.5)
    switch, reference = PrecisionSwitch(config), ReferenceSwitch(config)
    lows, skips = feed(switch, losses)
    expected = [reference.update(loss, step) for step, loss in enumerate(losses)]
    assert lows == [e[0] for e in expected]
    assert skips == [e[1] for e in expected]
    state = switch.state()
    # Same formula and order, both in float64: equal up to the last bits.
    np.testing.assert_allclose(state["mean"], reference.mean, rtol=1e-12)
    np.testing.assert_allclose(state["deviation"], math.sqrt(reference.var), rtol=1e-9)
    assert state["spikes"] >= 3 and state["non_finite"] == 2
    assert 0 < sum(lows) < len(lows)  # the run exercised both modes


def test_other_loss_dtypes_are_accepted():
    switch = PrecisionSwitch(SMALL)
    for dtype in (tf.bfloat16, tf.float16, tf.float64):
        low, skip = switch.update(tf.constant(1.0, dtype), 0)
        assert not bool(skip)
    assert switch.state()["observed"] == 3


def test_state_survives_a_checkpoint_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    losses = (1.0 + 0.05 * rng.standard_normal(60)).tolist()
    losses[30] = 5.0
    original = PrecisionSwitch(SMALL)
    feed(original, losses[:32])
    path = tf.train.Checkpoint(switch=original).save(str(tmp_path / "ckpt"))
    saved_state = original.state()
    continued, _ = feed(original, losses[32:], first_step=32)

    restored = PrecisionSwitch(SMALL)
    feed(restored, [7.0] * 3)  # state that the restore must overwrite
    tf.train.Checkpoint(switch=restored).restore(path).assert_consumed()
    assert restored.state() == saved_state
    resumed, _ = feed(restored, losses[32:], first_step=32)
    assert resumed == continued
    assert restored.state() == original.state()


def test_switches_do_not_share_state():
    first, second = PrecisionSwitch(SMALL), PrecisionSwitch(SMALL)
    feed(first, [1.0] * 4)
    assert second.state()["observed"] == 0


def test_non_scalar_loss_is_rejected_eagerly_and_in_graphs():
    switch = PrecisionSwitch(SMALL)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"loss must be a scalar, got shape \[2\]"):
        switch.update(tf.constant([1.0, 2.0]), 0)

    @tf.function
    def graph_update(loss):
        return switch.update(loss, 0)

    with pytest.raises(ValueError, match=r"loss must be a scalar, got shape \[3\]"):
        graph_update.get_concrete_function(tf.TensorSpec([3], tf.float32))


def test_bad_step_and_dtype_are_rejected():
    switch = PrecisionSwitch(SMALL)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step must be >= 0, got -1"):
        switch.update(1.0, -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step must be a scalar"):
        switch.update(1.0, [1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="loss must be a floating-point scalar, got dtype int32"):
        switch.update(tf.constant(1), 0)
    # Straight to the op: the registration's type list rejects it.
    with pytest.raises(tf.errors.InvalidArgumentError, match="attr 'T' of int32 is not in the list"):
        ops().ttf_precision_switch_update(switch.resource_handle, tf.constant(1), tf.constant(0, tf.int64))


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"hold_steps": -1}, "attr 'hold_steps' of -1 must be at least minimum 0"),
        ({"warmup_steps": -3}, "attr 'warmup_steps' of -3 must be at least minimum 0"),
        ({"calm_steps": 0}, "attr 'calm_steps' of 0 must be at least minimum 1"),
        ({"decay": 1.5}, r"decay must be in \(0, 1\), got 1.5"),
        ({"spike_k": -1.0}, "spike_k must be finite and > 0"),
        ({"calm_k": 5.0, "spike_k": 4.0}, r"calm_k must be in \[0, spike_k=4\], got 5"),
        ({"min_relative_deviation": -0.1}, "min_relative_deviation must be finite and >= 0"),
    ],
)
def test_bad_attrs_are_rejected_by_the_op(attrs, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops().ttf_precision_switch(shared_name="bad_attrs", **attrs)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hold_steps": -1}, "hold_steps must be >= 0, got -1"),
        ({"decay": 1.0}, r"decay must be in \(0, 1\)"),
        ({"calm_k": 5.0}, r"calm_k must be in \[0, spike_k=4.0\]"),
        ({"calm_steps": 2.5}, "calm_steps must be an int"),
    ],
)
def test_bad_config_is_rejected_in_python(fields, message):
    with pytest.raises(ValueError, match=message):
        SwitchConfig(**fields)


def test_import_rejects_malformed_state():
    switch = PrecisionSwitch(SMALL)
    stats, counters = ops().ttf_precision_switch_export(switch.resource_handle)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"stats must have shape \[2\]"):
        ops().ttf_precision_switch_import(switch.resource_handle, tf.zeros([3], tf.float64), counters)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"counters must have shape \[9\]"):
        ops().ttf_precision_switch_import(switch.resource_handle, stats, counters[:4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="format version"):
        ops().ttf_precision_switch_import(
            switch.resource_handle, stats, tf.tensor_scatter_nd_update(counters, [[0]], [7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="finite variance"):
        ops().ttf_precision_switch_import(
            switch.resource_handle, tf.constant([1.0, -1.0], tf.float64), counters)
