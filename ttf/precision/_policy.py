"""AdaptivePrecision: the three policies (time, time_lr, loss) behind one decision method."""
import tensorflow as tf

from ttf.precision._config import PrecisionConfig
from ttf.precision._switch import PrecisionSwitch


class AdaptivePrecision(tf.Module):
    """Decides per training step whether to run in low precision (bfloat16) or float32.

    Policies (see `PrecisionConfig` for every option and its default):
      "time": low precision for steps in [start_step, end_step).
      "time_lr": "time", but float32 for `lr_hold_steps` steps from every learning-rate
        change, and while the loss switch holds float32 after a spike or NaN/Inf loss.
      "loss": the loss switch (`PrecisionSwitch`) decides, with float32 windows of
        `interval_hold` steps at every multiple of `interval`.

    Its state (the switch, the last learning rate and the lr hold) is checkpointed with
    `tf.train.Checkpoint(precision=policy)`.

    Args:
      policy: "time", "time_lr" or "loss".
      config: a full `PrecisionConfig`; if given, `policy` and `options` must be unset.
      **options: fields of `PrecisionConfig` or `SwitchConfig` by name
        (e.g. `hold_steps=50, interval=0`).

    Raises:
      TypeError: an unknown option. ValueError: an option out of its range.

    Example (a user loop; `loss` is the previous step's loss):
      >>> policy = AdaptivePrecision("time", start_step=2, end_step=4)
      >>> [policy.enable_mixed_precision(step) for step in range(5)]
      [False, False, True, True, False]
    """

    def __init__(self, policy="loss", config=None, **options):
        super().__init__(name="adaptive_precision")
        if config is not None:
            if options or policy != "loss" and policy != config.policy:
                raise TypeError("pass either config or policy/options, not both")
            if not isinstance(config, PrecisionConfig):
                raise TypeError(f"config must be a PrecisionConfig, got {type(config).__name__}")
            self._config = config
        else:
            self._config = PrecisionConfig.from_options(policy, **options)
        c = self._config
        self.switch = PrecisionSwitch(c.switch) if c.policy in ("loss", "time_lr") else None
        # time_lr: the learning rate seen last (NaN: none yet) and the first step after
        # the float32 hold that its last change started.
        self._last_lr = tf.Variable(float("nan"), dtype=tf.float32, trainable=False, name="last_lr")
        self._lr_hold_until = tf.Variable(0, dtype=tf.int64, trainable=False, name="lr_hold_until")

    @property
    def config(self):
        return self._config

    @property
    def policy(self):
        return self._config.policy

    def low_precision(self, step, lr=None):
        """Whether step `step` runs in low precision, as a scalar bool tensor (graph-safe).

        Args:
          step: scalar int, the training step about to run.
          lr: the learning rate this step uses (scalar float), or None. Only "time_lr"
            reads it; a change from the last value seen starts a float32 hold.
        """
        c = self._config
        step = tf.cast(step, tf.int64)
        if c.policy == "loss":
            low, _ = self.switch.read()
            if c.interval > 0:
                low = tf.logical_and(low, step % c.interval >= c.interval_hold)
            return low
        low = step >= c.start_step
        if c.end_step is not None:
            low = tf.logical_and(low, step < c.end_step)
        if c.policy == "time_lr":
            if lr is not None:
                lr = tf.cast(lr, tf.float32)
                changed = tf.logical_and(
                    tf.logical_not(tf.math.is_nan(self._last_lr)), tf.not_equal(lr, self._last_lr))
                self._lr_hold_until.assign(
                    tf.where(changed, step + c.lr_hold_steps, self._lr_hold_until))
                self._last_lr.assign(lr)
            _, holding = self.switch.read()
            low = tf.logical_and(low, step >= self._lr_hold_until)
            low = tf.logical_and(low, tf.logical_not(holding))
        return low

    def observe(self, step, loss):
        """Feeds the loss of step `step`; returns `skip_update` (scalar bool tensor): true
        when the loss is NaN or Inf, so that step's update must not be applied."""
        if self.switch is None:
            return tf.logical_not(tf.math.is_finite(tf.cast(loss, tf.float32)))
        _, skip = self.switch.update(loss, step)
        return skip

    def enable_mixed_precision(self, step, lr=None, loss=None):
        """Whether step `step` should run in low precision, for a user's own training loop.

        Args:
          step: the step about to run (int >= 0).
          lr: its learning rate (float) or None; "time_lr" holds float32 after a change.
          loss: the loss of the previous step (step - 1), or None if there is none yet.
            "loss" and "time_lr" feed it to the switch.

        Returns:
          A Python bool (eager mode). Inside a tf.function use `low_precision` and
          `observe`, which return tensors.
        """
        if loss is not None:
            self.observe(max(int(step) - 1, 0), loss)
        return bool(self.low_precision(step, lr))
