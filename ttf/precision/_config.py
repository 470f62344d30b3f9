"""Configuration of the adaptive precision policies: two small frozen dataclasses."""
import dataclasses
import math
from typing import Optional

POLICIES = ("time", "time_lr", "loss")


@dataclasses.dataclass(frozen=True)
class SwitchConfig:
    """The loss-driven switch's rule (the `TtfPrecisionSwitch` op's attributes).

    The switch keeps an exponential moving mean and variance of the loss. After
    `warmup_steps` finite losses, a loss above `mean + spike_k * deviation` is a spike;
    one at or below `mean + calm_k * deviation` is calm. A spike or a NaN/Inf loss forces
    float32 for the next `hold_steps` steps; low precision comes back only after the hold
    and `calm_steps` consecutive calm losses. Between the two thresholds nothing changes,
    so noise does not make the mode flap.

    Attributes:
      warmup_steps: finite losses that only feed the statistics (float32 meanwhile).
      decay: weight of the old statistics per update, in (0, 1); 0.98 averages over
        about 50 steps.
      spike_k: deviations above the mean that make a spike, > 0.
      calm_k: deviations above the mean still counted as calm, in [0, spike_k].
      calm_steps: consecutive calm losses needed before low precision, >= 1.
      hold_steps: float32 steps after a spike or a non-finite loss, >= 0.
      min_relative_deviation: floor of the deviation relative to |mean|, >= 0, so an
        almost flat loss does not turn rounding noise into spikes.

    Raises:
      ValueError: a value out of its range (the message names the field).
    """

    warmup_steps: int = 100
    decay: float = 0.98
    spike_k: float = 4.0
    calm_k: float = 2.0
    calm_steps: int = 10
    hold_steps: int = 100
    min_relative_deviation: float = 0.01

    def __post_init__(self):
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_int("calm_steps", self.calm_steps, 1)
        _check_int("hold_steps", self.hold_steps, 0)
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")
        if not (math.isfinite(self.spike_k) and self.spike_k > 0):
            raise ValueError(f"spike_k must be finite and > 0, got {self.spike_k}")
        if not 0.0 <= self.calm_k <= self.spike_k:
            raise ValueError(f"calm_k must be in [0, spike_k={self.spike_k}], got {self.calm_k}")
        if not (math.isfinite(self.min_relative_deviation) and self.min_relative_deviation >= 0):
            raise ValueError(
                f"min_relative_deviation must be finite and >= 0, got {self.min_relative_deviation}"
            )


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    """Which policy picks low precision, and its windows.

    Attributes:
      policy: "time": low precision for steps in [start_step, end_step).
        "time_lr": the same, minus float32 holds of `lr_hold_steps` steps from each
        learning-rate change and the switch's holds after a loss spike or NaN/Inf.
        "loss": the switch decides (see SwitchConfig), minus periodic float32 windows
        of `interval_hold` steps starting at every multiple of `interval`.
      start_step: first low-precision step of "time" and "time_lr", >= 0.
      end_step: first float32 step after the window (None: the window never ends).
      lr_hold_steps: float32 steps from a learning-rate change ("time_lr"), >= 0.
      interval: period of the float32 windows of "loss", >= 0 (0: no windows).
      interval_hold: length of each such window, in [0, interval).
      switch: the loss switch's rule (used by "loss" and "time_lr").

    Raises:
      ValueError: a value out of its range or an unknown policy.
    """

    policy: str = "loss"
    start_step: int = 100
    end_step: Optional[int] = None
    lr_hold_steps: int = 100
    interval: int = 1000
    interval_hold: int = 20
    switch: SwitchConfig = dataclasses.field(default_factory=SwitchConfig)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        _check_int("start_step", self.start_step, 0)
        if self.end_step is not None:
            _check_int("end_step", self.end_step, self.start_step + 1)
        _check_int("lr_hold_steps", self.lr_hold_steps, 0)
        _check_int("interval", self.interval, 0)
        _check_int("interval_hold", self.interval_hold, 0)
        if self.interval > 0 and self.interval_hold >= self.interval:
            raise ValueError(
                f"interval_hold must be < interval={self.interval}, got {self.interval_hold}"
            )
        if not isinstance(self.switch, SwitchConfig):
            raise ValueError(f"switch must be a SwitchConfig, got {type(self.switch).__name__}")

    @classmethod
    def from_options(cls, policy="loss", **options):
        """Builds a config from flat keyword options (fields of this class or of SwitchConfig).

        Raises:
          TypeError: an option that is neither a PrecisionConfig nor a SwitchConfig field.
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"switch", "policy"}
        switch_fields = {f.name for f in dataclasses.fields(SwitchConfig)}
        unknown = set(options) - own - switch_fields
        if unknown:
            raise TypeError(
                f"unknown precision option(s) {sorted(unknown)}; known: {sorted(own | switch_fields)}"
            )
        switch = SwitchConfig(**{k: v for k, v in options.items() if k in switch_fields})
        return cls(policy=policy, switch=switch, **{k: v for k, v in options.items() if k in own})


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
