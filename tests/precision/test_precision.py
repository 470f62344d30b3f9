"""The precision switch and policies on scripted loss sequences, checkpointing, trace counts,
and a toy model whose accuracy with the loss policy matches fp32."""
import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.precision import AdaptivePrecision, DualPrecisionStep


def decisions(policy, losses, **kwargs):
    return [policy.enable_mixed_precision(step, loss=loss, **kwargs) for step, loss in enumerate(losses)]


def calm(n, rng, level=0.5, noise=0.01):
    return list(level + noise * rng.standard_normal(n))


def test_calm_loss_goes_low_after_warmup_and_calm_steps():
    rng = np.random.default_rng(0)
    p = AdaptivePrecision("loss", warmup_steps=20, calm_steps=10, hold_steps=30)
    got = decisions(p, calm(100, rng))
    assert not any(got[:20]) and all(got[30:])  # warm-up 20 + at least 10 calm steps


def test_spike_forces_fp32_for_the_hold_window_then_returns():
    rng = np.random.default_rng(1)
    p = AdaptivePrecision("loss", warmup_steps=20, calm_steps=5, hold_steps=30)
    losses = calm(60, rng) + [5.0] + calm(60, rng)
    got = decisions(p, losses)
    assert all(got[40:60])
    assert not any(got[60:90])  # the spike's step and the 30-step hold that follows
    assert all(got[95:])


def test_nan_loss_skips_the_update_and_forces_fp32():
    rng = np.random.default_rng(2)
    p = AdaptivePrecision("loss", warmup_steps=10, calm_steps=3, hold_steps=8)
    got = decisions(p, calm(30, rng))
    assert got[-1]
    assert p.enable_mixed_precision(30, loss=float("nan")) is False and p.last_skip_update
    assert not any(decisions(p, calm(7, rng)))
    assert all(decisions(p, calm(20, rng))[5:])
    low, skip = ops().ttf_precision_switch_update(p.switch.resource_handle, float("inf"))
    assert not bool(low) and bool(skip)


def test_non_finite_loss_leaves_every_weight_untouched():
    layer = tf.keras.layers.Dense(4)
    layer.build((None, 3))
    opt = tf.keras.optimizers.Adam(0.1)
    opt.build(layer.trainable_variables)

    def step_fn(dtype, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(tf.matmul(tf.cast(x, dtype), tf.cast(layer.kernel, dtype)), tf.float32))
        grads = tape.gradient(loss, layer.trainable_variables)
        return ttf.precision.apply_if_finite(opt, loss, grads, layer.trainable_variables)

    step = DualPrecisionStep(step_fn)
    before = [w.numpy().copy() for w in layer.weights]
    assert not bool(step(False, tf.constant([[np.nan, 1.0, 2.0]])))
    assert not bool(step(True, tf.constant([[np.inf, 1.0, 2.0]])))
    for w, b in zip(layer.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)
    assert int(opt.iterations) == 0
    assert bool(step(False, tf.constant([[0.5, 1.0, 2.0]])))
    assert not np.array_equal(layer.kernel.numpy(), before[0])


def test_noise_does_not_flap():
    rng = np.random.default_rng(3)
    p = AdaptivePrecision("loss", warmup_steps=50, calm_steps=20, hold_steps=50)
    got = decisions(p, calm(2000, rng, noise=0.05))
    switches = int(np.sum(np.diff(np.array(got, int)) != 0))
    assert switches <= 6 and np.mean(got[100:]) > 0.9


def test_time_and_time_lr_windows():
    p = AdaptivePrecision("time", start_step=10, end_step=20)
    assert [p.enable_mixed_precision(s) for s in range(25)] == [10 <= s < 20 for s in range(25)]
    p = AdaptivePrecision("time_lr", start_step=0, end_step=100, lr_hold_steps=5, loss_fluctuation=0.5)
    got = [p.enable_mixed_precision(s, lr=0.1 if s < 30 else 0.01, loss=1.0 if s != 60 else 3.0) for s in range(100)]
    assert all(got[:30]) and not any(got[30:35]) and all(got[35:60])
    assert not any(got[60:66]) and all(got[66:])  # fluctuation at 60, and back at 61


def test_periodic_fp32_windows():
    p = AdaptivePrecision("time", interval=10, interval_hold=2)
    got = [p.enable_mixed_precision(s) for s in range(30)]
    assert got == [s % 10 >= 2 for s in range(30)]
    assert p.low_fraction == pytest.approx(0.8)


def test_switch_state_survives_a_checkpoint(tmp_path):
    rng = np.random.default_rng(4)
    a = AdaptivePrecision("loss", warmup_steps=10, calm_steps=5, hold_steps=20)
    decisions(a, calm(40, rng) + [9.0])  # inside a hold window now
    path = tf.train.Checkpoint(precision=a).write(str(tmp_path / "p"))
    b = AdaptivePrecision("loss", warmup_steps=10, calm_steps=5, hold_steps=20)
    tf.train.Checkpoint(precision=b).read(path).assert_consumed()
    for x, y in zip(ops().ttf_precision_switch_export(a.switch.resource_handle),
                    ops().ttf_precision_switch_export(b.switch.resource_handle)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    tail = calm(40, rng)
    assert decisions(a, tail) == decisions(b, tail)


def test_bad_input_and_settings():
    with pytest.raises(ValueError, match="policy must be one of"):
        AdaptivePrecision("sometimes")
    with pytest.raises(ValueError, match="hold_steps must be >= 0"):
        AdaptivePrecision("loss", hold_steps=-1)
    with pytest.raises(ValueError, match="interval_hold"):
        AdaptivePrecision("time", interval=5, interval_hold=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ema_decay must be in"):
        ops().ttf_precision_switch(ema_decay=1.5, shared_name="bad_switch")
    p = AdaptivePrecision("loss")
    with pytest.raises(tf.errors.InvalidArgumentError, match="loss must be a scalar"):
        ops().ttf_precision_switch_update(p.switch.resource_handle, [0.1, 0.2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="counters must have 4 elements"):
        ops().ttf_precision_switch_import(p.switch.resource_handle, tf.zeros([3], tf.int64), tf.zeros([2], tf.float64))


def toy_problem(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8192, 32)).astype(np.float32)
    w = rng.normal(size=(32,)).astype(np.float32)
    y = (rng.random(8192) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float32)
    return x, y


def train_toy(policy):
    x, y = toy_problem()
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)]
    opt = tf.keras.optimizers.Adam(0.01)

    def forward(dtype, xb):
        h = xb
        for layer in layers:
            if not layer.built:
                layer.build(h.shape)
            h = tf.matmul(tf.cast(h, dtype), tf.cast(layer.kernel, dtype)) + tf.cast(layer.bias, dtype)
            if layer.activation is not None:
                h = layer.activation(h)
        return tf.cast(h[:, 0], tf.float32)

    def step_fn(dtype, xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(yb, forward(dtype, xb)))
        variables = [v for layer in layers for v in layer.trainable_variables]
        grads = tape.gradient(loss, variables)
        ttf.precision.apply_if_finite(opt, loss, grads, variables)
        return loss

    forward(tf.float32, x[:2])
    opt.build([v for layer in layers for v in layer.trainable_variables])
    step = DualPrecisionStep(step_fn)
    loss = None
    for epoch in range(3):
        for i in range(0, 8192, 256):
            use_low = policy.enable_mixed_precision(opt.iterations.numpy(), loss=loss) if policy else False
            loss = float(step(use_low, x[i:i + 256], y[i:i + 256]))
    probs = tf.sigmoid(forward(tf.float32, x)).numpy()
    return ttf.data.best_auc(y, probs), step


def test_loss_policy_matches_fp32_accuracy_and_traces_each_variant_once():
    auc_fp32, _ = train_toy(None)
    policy = AdaptivePrecision("loss", warmup_steps=10, calm_steps=5, hold_steps=10, interval=40, interval_hold=4)
    auc_auto, step = train_toy(policy)
    assert policy.low_fraction > 0.5  # it really ran in bf16 most of the time
    assert step.traces == {"fp32": 1, "bf16": 1}  # switching never retraced
    assert abs(auc_auto - auc_fp32) < 0.005, (auc_auto, auc_fp32)
