"""PrecisionSwitch: the checkpointable Python wrapper of the TtfPrecisionSwitch resource."""
import tensorflow as tf

from ttf._ops import ops, unique_resource_name
from ttf.precision._config import SwitchConfig

_STATS = "stats"
_COUNTERS = "counters"
_COUNTER_NAMES = (
    "format_version", "observed", "use_low_precision", "hold_until_step", "calm_run",
    "last_step", "spikes", "non_finite", "holding",
)


class PrecisionSwitch(tf.saved_model.experimental.TrackableResource):
    """Decides per step between low precision and float32 from the loss it is fed.

    The state lives in a C++ resource; `tf.train.Checkpoint` saves and restores it
    (keys `stats` and `counters`). The rule is described in `SwitchConfig`.

    Args:
      config: the rule; defaults to `SwitchConfig()`.

    Example:
      >>> switch = PrecisionSwitch(SwitchConfig(warmup_steps=2, calm_steps=1, hold_steps=3))
      >>> [bool(switch.update(1.0, step)[0]) for step in range(4)]
      [False, False, True, True]
    """

    def __init__(self, config=None):
        self._config = config if config is not None else SwitchConfig()
        if not isinstance(self._config, SwitchConfig):
            raise TypeError(f"config must be a SwitchConfig, got {type(self._config).__name__}")
        self._shared_name = unique_resource_name("ttf_precision_switch")
        super().__init__()
        with tf.init_scope():  # create it now, even when first built inside a tf.function
            self.resource_handle  # pylint: disable=pointless-statement

    @property
    def config(self):
        return self._config

    def _create_resource(self):
        c = self._config
        return ops().ttf_precision_switch(
            warmup_steps=c.warmup_steps, decay=c.decay, spike_k=c.spike_k, calm_k=c.calm_k,
            calm_steps=c.calm_steps, hold_steps=c.hold_steps,
            min_relative_deviation=c.min_relative_deviation, shared_name=self._shared_name,
        )

    def _destroy_resource(self):
        if self._resource_handle is not None and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self._resource_handle, ignore_lookup_error=True)

    def update(self, loss, step):
        """Feeds the loss of training step `step`.

        Args:
          loss: scalar loss of that step (bfloat16, float16, float32 or float64).
          step: scalar int, >= 0.

        Returns:
          (use_low_precision, skip_update): scalar bool tensors. The first says whether
          step `step + 1` should run in low precision; the second is true when `loss` is
          NaN or Inf, so this step's update must not be applied.

        Raises:
          tf.errors.InvalidArgumentError: a non-scalar loss or step, a negative step, or a
            loss of another dtype.
        """
        loss = tf.convert_to_tensor(loss)
        if not loss.dtype.is_floating:  # the op's type list rejects it too; say it in Python terms
            raise tf.errors.InvalidArgumentError(
                None, None, f"loss must be a floating-point scalar, got dtype {loss.dtype.name}")
        step = tf.cast(step, tf.int64)
        return ops().ttf_precision_switch_update(self.resource_handle, loss, step)

    def read(self):
        """(use_low_precision, holding) without feeding a loss; holding means float32
        because of a spike or a NaN/Inf loss, not because of warm-up."""
        return ops().ttf_precision_switch_read(self.resource_handle)

    def state(self):
        """The state as a dict of Python numbers (eager only), for logs and tests."""
        stats, counters = ops().ttf_precision_switch_export(self.resource_handle)
        state = dict(zip(_COUNTER_NAMES, (int(c) for c in counters.numpy())))
        state["mean"], variance = (float(s) for s in stats.numpy())
        state["deviation"] = variance ** 0.5
        return state

    def _serialize_to_tensors(self):
        stats, counters = ops().ttf_precision_switch_export(self.resource_handle)
        return {_STATS: stats, _COUNTERS: counters}

    def _restore_from_tensors(self, restored_tensors):
        return ops().ttf_precision_switch_import(
            self.resource_handle, restored_tensors[_STATS], restored_tensors[_COUNTERS]
        )
