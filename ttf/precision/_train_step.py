"""One training step with the precision chosen per step, traced once.

The float32 and the low-precision forward/backward are the two branches of one
`tf.cond` on the policy's decision, inside one tf.function: each branch is traced once,
and switching costs nothing at run time. Dense weights stay float32 master copies; the
low-precision branch casts inputs and weights to bfloat16 inside the computation and the
outputs back to float32, so loss, gradients and the update are float32.
"""
import contextlib

import tensorflow as tf
from tf_keras.src.mixed_precision import autocast_variable

# Keras layers whose weights Keras itself never autocasts (their variables are created
# with experimental_autocast=False): they read float32 weights under a mixed policy.
_NO_AUTOCAST_LAYERS = (
    tf.keras.layers.Embedding,
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.LayerNormalization,
)
_MIXED_POLICY = {tf.bfloat16: "mixed_bfloat16", tf.float16: "mixed_float16"}


@contextlib.contextmanager
def low_precision(model, dtype=tf.bfloat16):
    """Runs a Keras model built in float32 in `dtype` while the context is open.

    Use it inside the function you trace: every layer gets the mixed policy (floating
    inputs cast to `dtype`) and its float32 weights are read through AutoCastVariable
    views, cast to `dtype` inside the computation; gradients flow to the float32
    variables. On exit the model is exactly as before, so the trace taken outside the
    context stays float32. Weights held in nested containers (lists, dicts) of a custom
    layer are not reached: such a layer fails at trace time with a dtype mismatch.

    Args:
      model: a `tf.keras.layers.Layer` (a Model is a Layer), already built.
      dtype: tf.bfloat16 (default) or tf.float16 (needs loss scaling; not done here).

    Example:
      >>> model = tf.keras.Sequential([tf.keras.layers.Dense(4)])
      >>> model.build((None, 3))
      >>> with low_precision(model):
      ...     y = model(tf.ones((2, 3)))
      >>> y.dtype.name, model(tf.ones((2, 3))).dtype.name
      ('bfloat16', 'float32')
    """
    dtype = tf.as_dtype(dtype)
    if dtype not in _MIXED_POLICY:
        raise ValueError(f"dtype must be bfloat16 or float16, got {dtype.name}")
    if not isinstance(model, tf.keras.layers.Layer):
        raise TypeError(f"model must be a tf.keras Layer or Model, got {type(model).__name__}")
    mixed = tf.keras.mixed_precision.Policy(_MIXED_POLICY[dtype])
    saved_policies, saved_weights = [], []
    try:
        for layer in model._flatten_layers(include_self=True, recursive=True):  # pylint: disable=protected-access
            if layer.dtype_policy.variable_dtype != "float32":
                continue  # a layer built in another dtype keeps its own policy
            saved_policies.append((layer, layer.dtype_policy))
            layer._set_dtype_policy(mixed)  # pylint: disable=protected-access
            if isinstance(layer, _NO_AUTOCAST_LAYERS):
                continue
            for name, value in list(vars(layer).items()):
                if (isinstance(value, tf.Variable) and value.dtype == tf.float32
                        and not isinstance(value, autocast_variable.AutoCastVariable)):
                    saved_weights.append((layer, name, value))
                    # object.__setattr__: the view must not be tracked as a new weight.
                    object.__setattr__(layer, name, autocast_variable.create_autocast_variable(value))
        yield model
    finally:
        for layer, name, value in reversed(saved_weights):
            object.__setattr__(layer, name, value)
        for layer, policy in reversed(saved_policies):
            layer._set_dtype_policy(policy)  # pylint: disable=protected-access


def _current_learning_rate(optimizer):
    lr = getattr(optimizer, "_learning_rate", None)
    if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        return tf.cast(lr(optimizer.iterations), tf.float32)
    if lr is None:
        lr = getattr(optimizer, "learning_rate", None)
    return None if lr is None else tf.cast(tf.convert_to_tensor(lr), tf.float32)


def _build_optimizer(optimizer, variables):
    # Slots must exist before the first apply, which runs inside a tf.cond branch where
    # variables cannot be created.
    with tf.init_scope():
        if hasattr(optimizer, "_create_all_weights"):  # legacy Keras optimizers
            optimizer._create_all_weights(variables)  # pylint: disable=protected-access
        elif hasattr(optimizer, "build"):
            optimizer.build(variables)


class PrecisionTrainStep(tf.Module):
    """A training step that runs float32 or low precision as `policy` decides, per step.

    Made by `make_train_step` (your own loop) or `use_adaptive_precision` (model.fit).
    Each call: decide (policy.low_precision(step, lr)); run the forward/backward of that
    precision; feed the float32 loss to the policy; apply the gradients unless the loss
    is NaN or Inf (then no weight, no optimizer slot and no non-trainable model state such
    as BatchNormalization's moving statistics changes); advance `step`.

    Attributes:
      step: int64 variable, the next step's number (checkpointed with this object).
      trace_counts: {"float32": n, "low": n}, how often each branch was traced.
    """

    def __init__(self, model, loss_fn, optimizer, policy, variables=None,
                 low_precision_dtype=tf.bfloat16):
        super().__init__(name="precision_train_step")
        self._model = model
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self.policy = policy
        self._variables = variables
        self._dtype = tf.as_dtype(low_precision_dtype)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._trace_counts = _TraceCounts()
        self._optimizer_built = False
        self._function = tf.function(self._train_step)

    @property
    def trace_counts(self):
        return dict(self._trace_counts.counts)

    def __call__(self, features, labels, sample_weight=None):
        """Runs one step. Returns {"loss", "low_precision", "skipped"} as scalar tensors."""
        if not self._optimizer_built:
            # Before the first trace: variables created while tracing make tf.function
            # trace a second time.
            _build_optimizer(self._optimizer, self._trainable_variables())
            self._optimizer_built = True
        return self._function(features, labels, sample_weight)

    def _trainable_variables(self):
        if self._variables is not None:
            return list(self._variables)
        return self._model.trainable_variables

    def _forward_state(self):
        if isinstance(self._model, tf.keras.layers.Layer):
            return list(self._model.non_trainable_variables)
        return []

    def _forward(self, features, training):
        if isinstance(self._model, tf.keras.layers.Layer):
            return self._model(features, training=training)
        return self._model(features)

    def _branch(self, features, labels, sample_weight, low, loss_fn, variables, grad_is_none):
        label = "low" if low else "float32"
        self._trace_counts.counts[label] += 1  # runs only while tracing
        with tf.GradientTape() as tape:
            if not low:
                outputs = self._forward(features, training=True)
            elif isinstance(self._model, tf.keras.layers.Layer):
                with low_precision(self._model, self._dtype):
                    outputs = self._forward(features, training=True)
            else:  # a plain callable: cast the inputs, it casts its own weights
                outputs = self._model(
                    tf.nest.map_structure(lambda t: _cast_floating(t, self._dtype), features))
            outputs = tf.nest.map_structure(lambda t: _cast_floating(t, tf.float32), outputs)
            loss = tf.cast(loss_fn(labels, outputs, sample_weight), tf.float32)
        grads = tape.gradient(loss, variables)
        # tf.cond needs tensors in both branches: None (variable unused) becomes zeros and
        # is dropped again before the update.
        for index, grad in enumerate(grads):
            if grad is None:
                grad_is_none.add(index)
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
        return loss, outputs, grads

    def _run(self, features, labels, sample_weight, loss_fn, optimizer):
        variables = self._trainable_variables()
        _build_optimizer(optimizer, variables)
        step = self.step.read_value()
        low = self.policy.low_precision(step, _current_learning_rate(optimizer))
        # State the forward itself writes (BatchNormalization's moving statistics) is put
        # back when the step is skipped; automatic control dependencies order these reads
        # before the forward's writes.
        state = self._forward_state()
        saved_state = [tf.identity(v.read_value()) for v in state]
        grad_is_none = set()
        loss, outputs, grads = tf.cond(
            low,
            lambda: self._branch(features, labels, sample_weight, True, loss_fn, variables, grad_is_none),
            lambda: self._branch(features, labels, sample_weight, False, loss_fn, variables, grad_is_none),
        )
        skip = tf.logical_or(self.policy.observe(step, loss), tf.logical_not(tf.math.is_finite(loss)))
        pairs = [(g, v) for i, (g, v) in enumerate(zip(grads, variables)) if i not in grad_is_none]

        def apply():
            optimizer.apply_gradients(pairs)
            return tf.constant(True)

        def restore():
            for variable, value in zip(state, saved_state):
                variable.assign(value)
            return tf.constant(False)

        tf.cond(skip, restore, apply)
        self.step.assign_add(1)
        return loss, outputs, low, skip

    def _train_step(self, features, labels, sample_weight):
        def loss_fn(y, y_pred, w):
            if w is None:
                return self._loss_fn(y, y_pred)
            return self._loss_fn(y, y_pred, w)

        loss, _, low, skip = self._run(features, labels, sample_weight, loss_fn, self._optimizer)
        return {"loss": loss, "low_precision": low, "skipped": skip}

    def keras_train_step(self, data):
        """A `Model.train_step` replacement: compiled loss, metrics and optimizer of the
        model; logs gain `low_precision` and `skipped` (0/1 for this batch)."""
        model = self._model
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)

        def loss_fn(y_true, y_pred, w):
            return model.compute_loss(x, y_true, y_pred, w)

        _, y_pred, low, skip = self._run(x, y, sample_weight, loss_fn, model.optimizer)
        logs = model.compute_metrics(x, y, y_pred, sample_weight)
        logs["low_precision"] = tf.cast(low, tf.float32)
        logs["skipped"] = tf.cast(skip, tf.float32)
        return logs


class _TraceCounts:
    """Plain Python counters, kept out of tf.Module's tracking on purpose."""

    def __init__(self):
        self.counts = {"float32": 0, "low": 0}


def _cast_floating(tensor, dtype):
    tensor = tf.convert_to_tensor(tensor)
    return tf.cast(tensor, dtype) if tensor.dtype.is_floating else tensor


def make_train_step(model, loss_fn, optimizer, policy, variables=None,
                    low_precision_dtype=tf.bfloat16):
    """Returns a callable running one training step in the precision `policy` picks.

    Both variants are traced once (the two branches of a `tf.cond`), whatever the
    switching pattern. A NaN/Inf loss skips the update: no weight, slot or optimizer
    counter changes (the returned "skipped" is True).

    Args:
      model: a `tf.keras` Model/Layer with ordinary float32 weights (run in low precision
        through `low_precision`), or a callable `model(features) -> outputs` that casts
        its own weights to its inputs' dtype; then `variables` is required.
      loss_fn: `loss_fn(labels, outputs) -> scalar` (or with a third `sample_weight`
        argument when you pass one); it always receives float32 outputs.
      optimizer: a tf.keras optimizer (new or legacy).
      policy: an `AdaptivePrecision`.
      variables: the variables to train (default: `model.trainable_variables`).
      low_precision_dtype: tf.bfloat16 (default).

    Returns:
      A `PrecisionTrainStep`: `step_fn(features, labels, sample_weight=None)` returns
      {"loss": float32, "low_precision": bool, "skipped": bool} scalar tensors.

    Example:
      >>> model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
      >>> model.build((None, 3))
      >>> step_fn = make_train_step(model, tf.keras.losses.MeanSquaredError(),
      ...                           tf.keras.optimizers.SGD(0.1), AdaptivePrecision("time", start_step=1))
      >>> [bool(step_fn(tf.ones((4, 3)), tf.ones((4, 1)))["low_precision"]) for _ in range(3)]
      [False, True, True]
    """
    if not isinstance(model, tf.keras.layers.Layer) and variables is None:
        raise ValueError("model is a plain callable: pass the variables to train in variables=")
    return PrecisionTrainStep(model, loss_fn, optimizer, policy, variables, low_precision_dtype)


def use_adaptive_precision(model, policy):
    """Makes `model.fit` choose float32 or low precision per batch as `policy` decides.

    Replaces the compiled model's `train_step` (loss, metrics and optimizer are the ones
    given to `compile`) and resets its traced train function. Logs gain `low_precision`
    and `skipped`. Call it after `model.compile`; checkpoint the returned object
    (its `step` and the policy) with `tf.train.Checkpoint(precision=...)`.

    Returns:
      The `PrecisionTrainStep` installed.
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError("call model.compile(...) before use_adaptive_precision(model, policy)")
    train_step = PrecisionTrainStep(model, None, None, policy)
    if model.built:
        _build_optimizer(model.optimizer, model.trainable_variables)
    model.train_step = train_step.keras_train_step
    model.train_function = None
    return train_step


def apply_if_finite(optimizer, loss, grads, variables):
    """Applies `grads` to `variables` only when `loss` is finite; returns whether it did.

    A NaN/Inf step leaves every weight, slot and the optimizer's step counter untouched.
    Inside a tf.function, build the optimizer's slots first (`optimizer.build(variables)`),
    since the update runs in a tf.cond branch; for the same reason it does not work under
    ParameterServerStrategy. `make_train_step` does all this (and restores non-trainable
    state); this is the piece for a hand-written step.

    Example:
      >>> v = tf.Variable([1.0]); opt = tf.keras.optimizers.SGD(1.0); opt.build([v])
      >>> bool(apply_if_finite(opt, tf.constant(float("nan")), [tf.constant([1.0])], [v])), v.numpy()
      (False, array([1.], dtype=float32))
    """
    def apply():
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    return tf.cond(tf.math.is_finite(tf.cast(loss, tf.float32)), apply, lambda: tf.constant(False))


class DualPrecisionStep:
    """A step written once as `step_fn(compute_dtype, *args)`, traced once per precision.

    The float32 and the bfloat16 variant are two tf.functions; `step(use_low_precision,
    *args)` picks one per call in Python (so `use_low_precision` is a Python bool, e.g.
    from `AdaptivePrecision.enable_mixed_precision`). `step_fn` keeps its variables in
    float32 and casts at the boundary. `traces` counts the traces of each variant
    ({"fp32": 1, "bf16": 1} in steady use: switching never retraces).

    Example:
      >>> w = tf.Variable(2.0)
      >>> step = DualPrecisionStep(lambda dtype, x: tf.cast(tf.cast(x, dtype) * tf.cast(w, dtype), tf.float32))
      >>> [float(step(low, tf.constant(3.0))) for low in (False, True, False)], step.traces
      ([6.0, 6.0, 6.0], {'fp32': 1, 'bf16': 1})
    """

    def __init__(self, step_fn, low_precision_dtype=tf.bfloat16):
        self.traces = {"fp32": 0, "bf16": 0}

        def variant(dtype, name):
            def traced(*args):
                self.traces[name] += 1  # runs only while tracing
                return step_fn(dtype, *args)
            return tf.function(traced)

        self._fp32 = variant(tf.float32, "fp32")
        self._low = variant(tf.as_dtype(low_precision_dtype), "bf16")

    def __call__(self, use_low_precision, *args):
        return (self._low if use_low_precision else self._fp32)(*args)
