"""The training step: one mechanism for precision, non-finite skips and runaway stops.

`PrecisionTrainStep` is the only step ttf has; `make_train_step` (your own loop, and
ttf.distribute.Job) and `use_adaptive_precision` (model.fit) build it. Per call, inside one
tf.function:

1. the policy decides float32 or bfloat16 for this step, on the device (no host read);
2. forward and backward run in that precision: the two variants are the two branches of
   one `tf.cond`, each traced once, so switching never retraces. Dense weights stay
   float32 master copies; the low branch runs the model under `low_precision`, which casts
   inputs and weights to bfloat16 inside the computation; loss and gradients are float32;
3. the step is skipped whole when the loss or any gradient (dense, or a table's row
   gradients) is NaN or Inf: no weight, optimizer slot, table shard or non-trainable state
   changes; the skip is counted and the switch holds float32 for a while;
4. after `max_non_finite_steps` skipped steps in a row the call raises
   `NonFiniteTrainingError` instead of spinning for ever.
"""
import contextlib

import tensorflow as tf

from ttf._keras import KERAS3

# Keras layers whose weights Keras itself never autocasts (their variables are created
# with experimental_autocast=False): they read float32 weights under a mixed policy.
_NO_AUTOCAST_LAYERS = (
    tf.keras.layers.Embedding,
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.LayerNormalization,
)
_MIXED_POLICY = {tf.bfloat16: "mixed_bfloat16", tf.float16: "mixed_float16"}
_NON_FINITE_MARKER = "ttf: training steps in a row had a non-finite loss or gradient"


class NonFiniteTrainingError(RuntimeError):
    """Training stopped: the loss or the updates stayed NaN/Inf for too many steps in a row."""


def _keeps_float32(layer):
    """Layers left in float32 under low_precision, with everything inside them: Keras'
    embeddings and normalisations, layers (not models: a functional model never autocasts)
    built with `autocast=False`, and embedding tables (a ttf table's gradient arrives on an
    anchor variable that must stay float32)."""
    if isinstance(layer, _NO_AUTOCAST_LAYERS):
        return True
    if not isinstance(layer, tf.keras.Model) and getattr(layer, "autocast" if KERAS3 else "_autocast", True) is False:
        return True
    return any(getattr(v, "_ttf_embedding", None) is not None for v in vars(layer).values()
               if isinstance(v, tf.Variable))


def _layers_to_cast(layer):
    if _keeps_float32(layer) or layer.dtype_policy.variable_dtype != "float32":
        return  # a layer built in another dtype keeps its own policy
    yield layer
    for child in layer._flatten_layers(include_self=False, recursive=False):  # pylint: disable=protected-access
        yield from _layers_to_cast(child)


@contextlib.contextmanager
def low_precision(model, dtype=tf.bfloat16):
    """Runs a Keras model built in float32 in `dtype` while the context is open.

    This is how `PrecisionTrainStep` runs its low branch; use the step rather than this
    context to train. Inside a traced function, every layer gets the mixed policy (floating
    inputs cast to `dtype`) and its float32 weights are read through AutoCastVariable
    views, cast to `dtype` inside the computation; gradients flow to the float32
    variables. Embedding layers, normalisations and layers built with `autocast=False`
    stay float32. On exit the model is exactly as before. Weights held in nested
    containers (lists, dicts) of a custom layer are not reached: such a layer fails at
    trace time with a dtype mismatch.

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
    if KERAS3:
        with _keras3_low_precision(model, _MIXED_POLICY[dtype]):
            yield model
        return
    from tf_keras.src.mixed_precision import autocast_variable  # pylint: disable=import-outside-toplevel

    mixed = tf.keras.mixed_precision.Policy(_MIXED_POLICY[dtype])
    saved_policies, saved_weights = [], []
    try:
        for layer in _layers_to_cast(model):
            saved_policies.append((layer, layer.dtype_policy))
            layer._set_dtype_policy(mixed)  # pylint: disable=protected-access
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


@contextlib.contextmanager
def _keras3_low_precision(model, policy):
    """Keras 3: a mixed policy on a layer is all it takes (its __call__ casts floating inputs
    and reads its autocast variables in the compute dtype); the policies are put back after."""
    saved = []
    try:
        for layer in _layers_to_cast(model):
            saved.append((layer, layer.dtype_policy))
            layer.dtype_policy = policy
        yield
    finally:
        for layer, previous in reversed(saved):
            layer.dtype_policy = previous


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


def _all_finite(loss, grads):
    """One scalar bool: the loss and every gradient (dense tensors, and the row gradients
    of an IndexedSlices, which is how ttf tables receive theirs) are finite."""
    checks = [tf.math.is_finite(loss)]
    for grad in grads:
        if grad is None:
            continue
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        checks.append(tf.reduce_all(tf.math.is_finite(values)))
    return tf.reduce_all(tf.stack(checks))


def _apply_gradients(optimizer, pairs, strategy=None):
    """`optimizer.apply_gradients(pairs)`, called inside the guard's tf.cond. In a
    strategy's cross-replica step (a parameter-server worker's) the apply runs through
    `strategy.run`: ParameterServerStrategy refuses an `apply_gradients` inside a tf.cond
    within `strategy.run` (its merge_call), so the cond is outside and the run inside."""
    if strategy is None:
        optimizer.apply_gradients(pairs)
        return
    variables = [v for _, v in pairs]
    strategy.run(lambda *g: optimizer.apply_gradients(zip(g, variables)), args=tuple(g for g, _ in pairs))


def _check_max_non_finite_steps(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_non_finite_steps must be an int >= 0 (0: never stop), got {value!r}")


def _non_finite_error(max_non_finite_steps, last_step):
    return NonFiniteTrainingError(
        f"{max_non_finite_steps} training steps in a row (up to step {last_step}) had a NaN/Inf loss or "
        "gradient; their updates were skipped and training stopped. Lower the learning rate, check the "
        "input for NaN/Inf values, or train in float32.")


class NonFiniteGuard(tf.Module):
    """`PrecisionTrainStep`'s NaN/Inf protection for a step written around a distribution
    strategy's `run`, such as a parameter-server worker's (ttf.distribute.Job's parameter-server loop).

    `apply_gradients` decides once, over the loss and every gradient (dense, and each
    table's row gradients), before anything changes: a finite step is applied whole, a
    non-finite one not at all (no weight, optimizer slot or counter, and no table shard on
    any parameter server). Call it in cross-replica context: ParameterServerStrategy (like
    MirroredStrategy) cannot call `apply_gradients` inside a `tf.cond` within
    `strategy.run`, so the guard runs `strategy.run(apply)` inside its `tf.cond` instead.
    `observe` (on the host, in step order) counts skipped steps in a row and raises
    `NonFiniteTrainingError` at `max_non_finite_steps`, as the one-process step does.

    Create it under `strategy.scope()`: `skipped_steps` (int64, checkpointed with this
    object) then lives on a parameter server, counted by every worker.

    Example (a parameter-server chief; `replica_grads` returns (loss, grads) on a worker):
      >>> guard = NonFiniteGuard(max_non_finite_steps=20)  # under strategy.scope()
      >>> guard.build(optimizer, variables)
      >>> @tf.function
      ... def worker_step(iterator):
      ...     loss, grads = strategy.run(replica_grads, args=(next(iterator),))
      ...     return loss, guard.apply_gradients(optimizer, loss, zip(grads, variables), strategy)
      >>> loss, skipped = coordinator.schedule(worker_step, args=(iterator,)).fetch()
      >>> guard.observe([skipped])  # raises NonFiniteTrainingError after 20 in a row
    """

    def __init__(self, max_non_finite_steps=20):
        super().__init__(name="non_finite_guard")
        _check_max_non_finite_steps(max_non_finite_steps)
        self.max_non_finite_steps = max_non_finite_steps
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.non_finite_run = 0  # skipped steps in a row, as observed (host side)

    def build(self, optimizer, variables):
        """Creates the optimizer's slots now: they cannot be created inside the tf.cond."""
        _build_optimizer(optimizer, list(variables))

    def apply_gradients(self, optimizer, loss, grads_and_vars, strategy=None):
        """Applies `grads_and_vars` with `optimizer` when `loss` and every gradient are
        finite; returns `skipped`, a scalar bool tensor. Call it inside a tf.function in
        cross-replica context (None gradients are left out, as Keras does); `strategy`
        defaults to the current one."""
        strategy = strategy or tf.distribute.get_strategy()
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        finite = _all_finite(loss, [g for g, _ in pairs])

        def apply():
            _apply_gradients(optimizer, pairs, strategy)
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        skipped = tf.logical_not(finite)
        self.skipped_steps.assign_add(tf.cast(skipped, tf.int64))
        return skipped

    def observe(self, skipped, first_step=0):
        """Feeds the `skipped` flags of finished steps `first_step + 1, first_step + 2, ...`
        in step order (host values or tensors). Raises `NonFiniteTrainingError` once
        `max_non_finite_steps` in a row were skipped (0: never)."""
        for i, flag in enumerate(skipped):
            self.non_finite_run = self.non_finite_run + 1 if bool(flag) else 0
            if self.max_non_finite_steps and self.non_finite_run >= self.max_non_finite_steps:
                raise _non_finite_error(self.max_non_finite_steps, first_step + i + 1)


class PrecisionTrainStep(tf.Module):
    """One training step: precision per step, non-finite steps skipped whole, runaway stops.

    Made by `make_train_step` (your own loop) or `use_adaptive_precision` (model.fit).
    Each call: decide (policy.low_precision(step, lr), on the device; float32 when the
    policy is None); run the forward/backward of that precision; skip the update when the
    loss or any gradient is NaN or Inf (then no weight, optimizer slot, table row on any
    shard and no non-trainable model state such as BatchNormalization's moving statistics
    changes, and the policy's switch holds float32); count it; raise
    `NonFiniteTrainingError` once `max_non_finite_steps` steps in a row were skipped.

    Attributes (int64 variables, checkpointed with this object):
      step: steps run so far, applied or skipped (the policy's step number).
      skipped_steps: steps whose update was skipped as non-finite.
      non_finite_run: skipped steps in a row up to the last one.
      low_precision_steps: steps that ran in low precision.
    trace_counts: {"float32": n, "low": n}, how often each branch was traced.

    With a `strategy` (a ParameterServerStrategy, the step scheduled on its workers) the
    forward and backward run in `strategy.run` and the update in cross-replica context;
    made under `strategy.scope()`, the counters and the policy live on a parameter server,
    counted by every worker's steps.
    """

    def __init__(self, model, loss_fn, optimizer, policy=None, variables=None,
                 low_precision_dtype=tf.bfloat16, max_non_finite_steps=20, finite_across=None, strategy=None):
        super().__init__(name="precision_train_step")
        _check_max_non_finite_steps(max_non_finite_steps)
        self._model = model
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self.policy = policy
        self._variables = variables
        self._dtype = tf.as_dtype(low_precision_dtype)
        self._max_non_finite_steps = max_non_finite_steps
        self._finite_across = finite_across
        if strategy is not None and KERAS3:  # its optimizers update a Keras Variable, which has no ps device
            raise ValueError("a step over a parameter-server strategy needs tf_keras: Keras 3 does not train under "
                             "ParameterServerStrategy; install tf_keras and set TF_USE_LEGACY_KERAS=1, or train on "
                             "synchronous workers (ttf.distribute.SyncWorkers, HorovodRanks)")
        self._strategy = strategy
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.non_finite_run = tf.Variable(0, dtype=tf.int64, trainable=False, name="non_finite_run")
        self.low_precision_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="low_precision_steps")
        self._trace_counts = _TraceCounts()
        self._optimizer_built = False
        self._function = tf.function(self._train_step, reduce_retracing=True)  # a stream's batches vary in size
        self._loop = tf.function(self._run_steps)
        self._after_batch = None

    @property
    def trace_counts(self):
        return dict(self._trace_counts.counts)

    def trace_for_any_batch_size(self, features, labels, sample_weight=None):
        """Traces the step once for batches of any size (the first dimension of every input
        None), so batches of varying sizes never make it trace again. Data-parallel replicas
        (Horovod ranks, whose batches vary apart on a stream) need it: a trace holds the
        collectives by name, and replicas running different traces wait for each other for
        ever. The arguments are one batch (any size), for the structure and dtypes."""
        if not self._optimizer_built:
            _build_optimizer(self._optimizer, self._trainable_variables())
            self._optimizer_built = True

        def any_size(value):
            if value is None:
                return None
            if isinstance(value, tf.RaggedTensor):
                return tf.RaggedTensorSpec([None, *value.shape[1:]], value.dtype, value.ragged_rank,
                                           value.row_splits.dtype)
            value = tf.convert_to_tensor(value)
            return tf.TensorSpec([None, *value.shape[1:]], value.dtype)

        self._function.get_concrete_function(tf.nest.map_structure(any_size, features), any_size(labels),
                                             any_size(sample_weight))

    def __call__(self, features, labels, sample_weight=None):
        """Runs one step. Returns {"loss", "low_precision", "skipped"} as scalar tensors.

        Raises:
          NonFiniteTrainingError: this step made `max_non_finite_steps` skipped steps in a row.
        """
        self.prepare()  # before the first trace: variables created while tracing make it trace again
        with self.non_finite_errors():
            return self._function(features, labels, sample_weight)

    def run(self, iterator, steps, after_batch=None):
        """Runs up to `steps` steps in one tf.function call, each on the next batch
        `(features, labels)` of `iterator` (an iterator over a tf.data.Dataset), so Python
        and the function call are paid once per `steps` steps.

        Returns:
          {"loss": the last step's loss, "steps": int32 steps run}: fewer than `steps` when
          the iterator ran out (then "steps" counts the batches it still had).
          after_batch: optional fn(extra, rows) run in the same call after each step, where
            `extra` is the batch's third part when the iterator yields `(features, labels,
            extra)` (ttf.data's Reader.share_dataset: its position, for InputPosition.record).

        Raises:
          NonFiniteTrainingError: as `__call__`.
        """
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        self.prepare()
        with self.non_finite_errors():
            if after_batch != self._after_batch:  # a new hook: a new trace
                self._after_batch, self._loop = after_batch, tf.function(self._run_steps)
            return self._loop(iterator, tf.constant(steps, tf.int32))

    def traced_step(self, features, labels):
        """The step's ops for a caller's own tf.function (ttf.distribute's pipelined step traces
        the next batch's id routing beside them); returns what `__call__` returns. Call
        `prepare()` before the first trace, and the function inside `non_finite_errors()`."""
        return self._train_step(features, labels, None)

    def prepare(self):
        """Creates the optimizer's slots (before the first trace of a step)."""
        if not self._optimizer_built:
            _build_optimizer(self._optimizer, self._trainable_variables())
            self._optimizer_built = True

    @contextlib.contextmanager
    def non_finite_errors(self):
        """Turns the step's runaway check into NonFiniteTrainingError (as `__call__` does)."""
        try:
            yield
        except tf.errors.InvalidArgumentError as err:
            if _NON_FINITE_MARKER not in str(err):
                raise
            raise self._non_finite_error() from None

    def _run_steps(self, iterator, steps):
        def body(done, loss, more):
            optional = iterator.get_next_as_optional()
            more = optional.has_value()

            def step():
                batch = optional.get_value()
                features, labels = batch[0], batch[1]
                loss = self._train_step(features, labels, None)["loss"]
                if self._after_batch is None or len(batch) < 3:
                    return loss
                with tf.control_dependencies([loss]):
                    done = self._after_batch(batch[2], tf.size(labels))
                with tf.control_dependencies([done]):
                    return tf.identity(loss)

            loss = tf.cond(more, step, lambda: loss)
            return done + tf.cast(more, tf.int32), loss, more

        done, loss, _ = tf.while_loop(lambda done, loss, more: tf.logical_and(more, done < steps), body,
                                      (tf.constant(0), tf.constant(float("nan")), tf.constant(True)))
        return {"loss": loss, "steps": done}

    def _non_finite_error(self):
        return _non_finite_error(self._max_non_finite_steps, int(self.step.numpy()))

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

        def forward_backward():
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
            return loss, outputs, tape.gradient(loss, variables)

        if self._strategy is None:
            loss, outputs, grads = forward_backward()
        else:  # a parameter-server worker's step: its forward and backward in replica context
            loss, outputs, grads = self._strategy.run(forward_backward)
        grad_is_none.update(i for i, grad in enumerate(grads) if grad is None)
        finite = _all_finite(loss, grads)
        # tf.cond needs like structures in both branches: a None gradient (variable unused)
        # becomes zeros and is dropped again before the update; IndexedSlices (table row
        # gradients, Keras Embedding gradients) go through as (values, indices[, dense_shape]).
        flat = [tf.zeros_like(v) if g is None else _slices_parts(g) if isinstance(g, tf.IndexedSlices) else g
                for g, v in zip(grads, variables)]
        return loss, outputs, finite, flat

    def _run(self, features, labels, sample_weight, loss_fn, optimizer):
        variables = self._trainable_variables()
        _build_optimizer(optimizer, variables)
        step = self.step.read_value()
        if self.policy is None:
            low = tf.constant(False)
        else:
            low = self.policy.low_precision(step, _current_learning_rate(optimizer))
        # State the forward itself writes (BatchNormalization's moving statistics) is put
        # back when the step is skipped; automatic control dependencies order these reads
        # before the forward's writes.
        state = self._forward_state()
        saved_state = [tf.identity(tf.convert_to_tensor(v)) for v in state]  # a Keras 3 Variable has no read_value
        grad_is_none = set()
        branch = lambda is_low: lambda: self._branch(  # noqa: E731
            features, labels, sample_weight, is_low, loss_fn, variables, grad_is_none)
        if self.policy is None:
            loss, outputs, finite, flat = branch(False)()
        else:
            loss, outputs, finite, flat = tf.cond(low, branch(True), branch(False))
        if self._finite_across is not None:  # every replica takes the same skip decision
            finite = self._finite_across(finite)
        # A non-finite gradient counts as a non-finite loss for the switch: it holds float32.
        observed = tf.where(finite, loss, tf.constant(float("nan")))
        if self.policy is not None:
            self.policy.observe(step, observed)
        pairs = [(tf.IndexedSlices(*g) if isinstance(g, tuple) else g, v)
                 for i, (g, v) in enumerate(zip(flat, variables)) if i not in grad_is_none]

        def apply():
            _apply_gradients(optimizer, pairs, self._strategy)
            return tf.constant(True)

        def restore():
            for variable, value in zip(state, saved_state):
                variable.assign(value)
            return tf.constant(False)

        tf.cond(finite, apply, restore)
        skip = tf.logical_not(finite)
        run = tf.where(finite, tf.constant(0, tf.int64), self.non_finite_run + 1)
        updates = [self.non_finite_run.assign(run), self.skipped_steps.assign_add(tf.cast(skip, tf.int64)),
                   self.low_precision_steps.assign_add(tf.cast(low, tf.int64)), self.step.assign_add(1)]
        if self._max_non_finite_steps:
            with tf.control_dependencies(updates):
                tf.debugging.Assert(run < self._max_non_finite_steps, [_NON_FINITE_MARKER, run])
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

        loss, y_pred, low, skip = self._run(x, y, sample_weight, loss_fn, model.optimizer)
        if KERAS3:  # Keras 3's compute_loss leaves the loss metric to train_step
            from ttf import _keras3  # pylint: disable=import-outside-toplevel
            _keras3.track_loss(model, loss, x)
        logs = model.compute_metrics(x, y, y_pred, sample_weight)
        logs["low_precision"] = tf.cast(low, tf.float32)
        logs["skipped"] = tf.cast(skip, tf.float32)
        return logs


class _TraceCounts:
    """Plain Python counters, kept out of tf.Module's tracking on purpose."""

    def __init__(self):
        self.counts = {"float32": 0, "low": 0}


def _slices_parts(slices):
    """An IndexedSlices as the tuple tf.IndexedSlices(*parts) rebuilds (Keras 3's optimizers
    need the dense_shape that a Keras Embedding's gradient has)."""
    if slices.dense_shape is None:
        return slices.values, slices.indices
    return slices.values, slices.indices, slices.dense_shape


def _cast_floating(tensor, dtype):
    tensor = tf.convert_to_tensor(tensor)
    return tf.cast(tensor, dtype) if tensor.dtype.is_floating else tensor


def make_train_step(model, loss_fn, optimizer, policy=None, variables=None,
                    low_precision_dtype=tf.bfloat16, max_non_finite_steps=20, finite_across=None, strategy=None):
    """Returns a callable running one training step, in the precision `policy` picks.

    The one training step of ttf (ttf.distribute.Job runs it too). Both precision variants
    are traced once (the two branches of a `tf.cond`), whatever the switching pattern. A
    NaN/Inf loss or gradient (dense or table) skips the whole update: no weight, slot,
    table row or optimizer counter changes (the returned "skipped" is True, and
    `step_fn.skipped_steps` counts it).

    Args:
      model: a `tf.keras` Model/Layer with ordinary float32 weights (run in low precision
        through `low_precision`), or a callable `model(features) -> outputs` that casts
        its own weights to its inputs' dtype; then `variables` is required.
      loss_fn: `loss_fn(labels, outputs) -> scalar` (or with a third `sample_weight`
        argument when you pass one); it always receives float32 outputs.
      optimizer: a tf.keras optimizer (new or legacy) or a ttf optimizer.
      policy: an `AdaptivePrecision`, or None for float32 on every step.
      variables: the variables to train (default: `model.trainable_variables`).
      low_precision_dtype: tf.bfloat16 (default).
      max_non_finite_steps: raise `NonFiniteTrainingError` when this many steps in a row
        were skipped as non-finite (default 20; 0 never stops).
      finite_across: data-parallel replicas (Horovod ranks): `finite_across(flag) -> flag`,
        True only when the flag is True on every replica (e.g.
        `ttf.distribute.horovod.all_ranks`), so all skip the same steps. A replica that
        skipped alone would miss the others' gradient allreduce.
      strategy: a ParameterServerStrategy whose workers run the step (scheduled by its
        ClusterCoordinator inside your tf.function); make the step under its scope.

    Returns:
      A `PrecisionTrainStep`: `step_fn(features, labels, sample_weight=None)` returns
      {"loss": float32, "low_precision": bool, "skipped": bool} scalar tensors.

    Raises:
      ValueError: a plain callable without `variables`, or a bad `max_non_finite_steps`.

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
    return PrecisionTrainStep(model, loss_fn, optimizer, policy, variables, low_precision_dtype,
                              max_non_finite_steps, finite_across, strategy)


def use_adaptive_precision(model, policy, max_non_finite_steps=20):
    """Makes `model.fit` run `PrecisionTrainStep`: precision per batch as `policy` decides,
    non-finite batches skipped whole and counted, a runaway run stopped.

    Replaces the compiled model's `train_step` (loss, metrics and optimizer are the ones
    given to `compile`) and resets its traced train function. Logs gain `low_precision`
    and `skipped`. Call it after `model.compile`; checkpoint the returned object
    (its counters and the policy) with `tf.train.Checkpoint(precision=...)`.

    Returns:
      The `PrecisionTrainStep` installed.
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError("call model.compile(...) before use_adaptive_precision(model, policy)")
    train_step = PrecisionTrainStep(model, None, None, policy, max_non_finite_steps=max_non_finite_steps)
    if model.built:
        _build_optimizer(model.optimizer, model.trainable_variables)
    model.train_step = train_step.keras_train_step
    model.train_function = None
    return train_step
