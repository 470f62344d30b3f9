"""from_keras: a stock tf.keras optimizer -> its ttf twin, same hyperparameters and schedule."""
import inspect

import tensorflow as tf

import ttf.optimizers as ttf_optimizers

_TWINS = ("Adam", "AdamW", "Adagrad", "Ftrl", "SGD")


def from_keras(optimizer):
    """Returns the ttf optimizer equal to a stock tf.keras one, for models with ttf tables.

    Adam, AdamW, Adagrad, Ftrl and SGD (tf.keras.optimizers.X or tf.keras.optimizers.legacy.X,
    or their names as compile() takes them: "adam", "adamw", "sgd", ...) become ttf.optimizers.X with
    every hyperparameter: the learning rate (a float, its current value if it was changed,
    or the same LearningRateSchedule object; a legacy `decay` becomes the equivalent
    InverseTimeDecay), betas, epsilon, accumulators, FTRL's l1/l2/beta/power, clipping and
    weight decay (both reach the tables' rows), EMA (dense variables only: see
    ttf.optimizers.not_reaching_rows). The step counter carries over, so a schedule continues where it
    was; the dense optimizer slots (Adam's m and v, ...) start at zero. A ttf optimizer is
    returned as it is.

    Raises:
      ValueError: the optimizer has no ttf twin (RMSprop, Nadam, Lion, a subclass, ...),
        or uses what ttf tables cannot do (SGD momentum/nesterov, Adam amsgrad,
        gradient_accumulation_steps).

    Example:
      >>> import ttf, tensorflow as tf
      >>> opt = ttf.optimizers.from_keras(tf.keras.optimizers.Adam(
      ...     tf.keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.5), beta_1=0.8))
      >>> type(opt).__name__, opt.beta_1
      ('Adam', 0.8)
    """
    if isinstance(optimizer, ttf_optimizers._TableUpdates):
        return optimizer
    if isinstance(optimizer, str):
        optimizer = tf.keras.optimizers.get(optimizer)
    twin = _twin_class(optimizer)
    config = dict(optimizer.get_config())
    config["learning_rate"] = _learning_rate(optimizer, config)
    config.pop("decay", None)
    config.pop("is_legacy_optimizer", None)
    accepted = inspect.signature(twin.__init__).parameters
    unknown = sorted(k for k, v in config.items() if k not in accepted and v not in (None, False, 0))
    if unknown:
        raise ValueError(f"ttf.optimizers.from_keras: {type(optimizer).__name__} arguments {unknown} have no "
                         f"equivalent in ttf.optimizers.{twin.__name__}")
    converted = twin(**{k: v for k, v in config.items() if k in accepted})
    for name, value in vars(optimizer).items():  # exclude_from_weight_decay's choices, not in the config
        if name.startswith("_exclude_from_weight_decay") and "cache" not in name:
            setattr(converted, name, value)
    converted._check_table_support()
    with tf.init_scope():
        converted.iterations.assign(tf.cast(optimizer.iterations, converted.iterations.dtype))
    return converted


def _twin_class(optimizer):
    for name in _TWINS:
        legacy = getattr(tf.keras.optimizers, "legacy", None)  # tf_keras' OptimizerV2 (Keras 3: only stubs)
        stock = (getattr(tf.keras.optimizers, name), getattr(legacy, name, None))
        if type(optimizer) in stock:
            return getattr(ttf_optimizers, name)
    raise ValueError(
        f"ttf.optimizers.from_keras: {type(optimizer).__module__}.{type(optimizer).__name__} has no ttf twin; "
        f"models with ttf tables train with ttf.optimizers.{', '.join(_TWINS)} (pass one of them, or a stock "
        "tf.keras Adam/AdamW/Adagrad/Ftrl/SGD, to compile)")


def _learning_rate(optimizer, config):
    """The learning rate object to give the twin: the same schedule, or today's float value."""
    if hasattr(optimizer, "_hyper"):  # legacy OptimizerV2
        rate = optimizer._hyper["learning_rate"]
    else:
        rate = optimizer._learning_rate
    if not isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = float(tf.convert_to_tensor(rate if not callable(rate) else rate()))
    decay = float(config.get("decay", 0.0) or 0.0)
    if decay:
        if not isinstance(rate, float):
            raise ValueError("ttf.optimizers.from_keras: a legacy optimizer with both a schedule and decay "
                             "has no ttf twin; fold the decay into the schedule")
        # Legacy decay: lr / (1 + decay * iterations), which is InverseTimeDecay with decay_steps=1.
        rate = tf.keras.optimizers.schedules.InverseTimeDecay(rate, decay_steps=1, decay_rate=decay)
    return rate
