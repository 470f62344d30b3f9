"""AdaptivePrecision: the windows of each policy and its configuration."""
import pytest
import tensorflow as tf

from ttf.precision import AdaptivePrecision, PrecisionConfig, SwitchConfig


def decisions(policy, steps, lrs=None, losses=None):
    """enable_mixed_precision over steps; losses[i] is the loss of step i (fed at i + 1)."""
    out = []
    for step in steps:
        lr = None if lrs is None else lrs[step]
        loss = None if losses is None or step == 0 else losses[step - 1]
        out.append(policy.enable_mixed_precision(step, lr=lr, loss=loss))
    return out


def test_time_policy_is_low_inside_the_window_only():
    policy = AdaptivePrecision("time", start_step=3, end_step=7)
    assert decisions(policy, range(10)) == [False] * 3 + [True] * 4 + [False] * 3
    assert policy.switch is None


def test_time_policy_without_end_stays_low():
    policy = AdaptivePrecision("time", start_step=0)
    assert all(decisions(policy, range(5)))


def test_time_lr_holds_float32_after_each_learning_rate_change():
    policy = AdaptivePrecision("time_lr", start_step=2, lr_hold_steps=3)
    lrs = [0.1] * 8 + [0.01] * 12
    got = decisions(policy, range(20), lrs=lrs)
    # Window from step 2; the lr change at step 8 holds float32 for steps 8, 9, 10.
    assert got == [False, False] + [True] * 6 + [False] * 3 + [True] * 9


def test_time_lr_holds_float32_after_a_loss_spike():
    policy = AdaptivePrecision("time_lr", start_step=0, warmup_steps=5, calm_steps=2, hold_steps=4)
    losses = [1.0] * 10 + [9.0] + [1.0] * 9
    got = decisions(policy, range(20), lrs=[0.1] * 20, losses=losses)
    # Warm-up does not hold "time_lr" back (only spikes and NaN do): low from step 0.
    assert got[:11] == [True] * 11
    # Spike at step 10 (fed before step 11): float32 for steps 11..14, then the calm run
    # (steps 11, 12) is complete and step 15 is low again.
    assert got[11:15] == [False] * 4
    assert got[15:] == [True] * 5


def test_loss_policy_follows_the_switch_with_periodic_float32_windows():
    policy = AdaptivePrecision("loss", warmup_steps=3, calm_steps=2, hold_steps=2, interval=10, interval_hold=2)
    got = decisions(policy, range(30), losses=[1.0] * 30)
    # The switch: warm-up from the losses of steps 0-2, calm run 3, 4 -> low from step 5.
    # Windows: steps 10, 11 and 20, 21 are float32.
    expected = [False] * 5 + [True] * 5 + [False, False] + [True] * 8 + [False, False] + [True] * 8
    assert got == expected


def test_loss_policy_goes_float32_on_nan_and_reports_skip():
    policy = AdaptivePrecision("loss", warmup_steps=3, calm_steps=1, hold_steps=2, interval=0)
    decisions(policy, range(6), losses=[1.0] * 6)
    assert policy.enable_mixed_precision(6, loss=1.0)
    assert bool(policy.observe(6, float("nan")))  # step 6's loss is NaN
    # hold_steps=2: steps 7 and 8 float32, step 9 low again.
    assert policy.enable_mixed_precision(7) is False
    assert [policy.enable_mixed_precision(step, loss=1.0) for step in (8, 9)] == [False, True]


def test_time_policy_skips_non_finite_losses_too():
    policy = AdaptivePrecision("time")
    assert bool(policy.observe(0, float("inf")))
    assert not bool(policy.observe(0, 1.0))


def test_policy_state_survives_a_checkpoint(tmp_path):
    policy = AdaptivePrecision("time_lr", start_step=0, lr_hold_steps=5, warmup_steps=2, hold_steps=3)
    decisions(policy, range(4), lrs=[0.1, 0.1, 0.1, 0.05], losses=[1.0] * 4)
    path = tf.train.Checkpoint(precision=policy).save(str(tmp_path / "ckpt"))
    restored = AdaptivePrecision("time_lr", start_step=0, lr_hold_steps=5, warmup_steps=2, hold_steps=3)
    tf.train.Checkpoint(precision=restored).restore(path).assert_consumed()
    # The lr hold started at step 3 lasts through step 7 in both.
    assert [restored.enable_mixed_precision(s, lr=0.05) for s in range(4, 10)] == [False] * 4 + [True] * 2
    assert restored.switch.state() == policy.switch.state()


def test_options_route_to_the_right_config():
    policy = AdaptivePrecision("loss", hold_steps=7, interval=50, interval_hold=5)
    assert policy.config == PrecisionConfig(
        policy="loss", interval=50, interval_hold=5, switch=SwitchConfig(hold_steps=7))
    assert policy.switch.config.hold_steps == 7


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"policy": "sometimes"}, ValueError, "policy must be one of"),
        ({"policy": "time", "start_step": 5, "end_step": 5}, ValueError, "end_step must be >= 6"),
        ({"policy": "loss", "interval": 10, "interval_hold": 10}, ValueError, "interval_hold must be < interval=10"),
        ({"policy": "loss", "lr_hold_steps": -2}, ValueError, "lr_hold_steps must be >= 0, got -2"),
        ({"policy": "loss", "hold_step": 3}, TypeError, r"unknown precision option\(s\) \['hold_step'\]"),
    ],
)
def test_bad_options_are_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        AdaptivePrecision(**kwargs)


def test_config_is_frozen():
    config = PrecisionConfig()
    with pytest.raises(Exception, match="cannot assign"):
        config.policy = "time"
