"""Keras optimizers that also train ttf tables.

Each is the tf.keras optimizer of the same name (same arguments, same defaults) for dense
variables; the gradient of a ttf embedding (an IndexedSlices of row gradients keyed by id)
goes to the table's fused sparse update instead: one op call per table shard per step,
updating only the touched rows and their slots, which live beside the rows. Works with
model.compile/fit and with tape.gradient + apply_gradients.

What reaches a table's rows, as Keras does it to a variable, in Keras' order:
- `loss_scale_factor` (Keras 3): the row gradients are unscaled too;
- `clipvalue` clips each element of the step's row gradients (an id's gradients in the
  batch summed first, i.e. the dense Embedding gradient's elements); `clipnorm` clips a
  table's gradient by its norm (the table is one variable, as the Embedding matrix was);
  `global_clipnorm` takes one norm over the dense gradients and every table's;
- `weight_decay` (AdamW, or any optimizer's `weight_decay=`): decoupled decay
  row -= row * weight_decay * learning_rate before the update.
Differences from Keras for tables, by design: updates are lazy: only the rows an id
touched this step move, and untouched rows and their slots neither decay nor update (as
DeepRec's and TorchRec's fused sparse optimizers do; a dense Embedding under Keras' AdamW
decays every row every step). EMA (`use_ema`) applies to dense variables only
(`not_reaching_rows` names it, and ttf.accelerate warns). Table updates need plain SGD
(momentum=0), Adam/AdamW without amsgrad, and no `gradient_accumulation_steps`.
The learning rate (a float, a changed value, or a LearningRateSchedule) is read at the
current step, for tables as for dense variables.

`from_keras(opt)` converts a stock tf.keras Adam, AdamW, Adagrad, Ftrl or SGD (an object
or a name) to its ttf twin with the same hyperparameters and schedule.
"""
import warnings

import tensorflow as tf

from ttf._ops import ops
from ttf.embedding import embedding_of


class _TableUpdates:
    """Mixin: routes table gradients to the fused op, the rest to the Keras optimizer."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        table_pairs = [(g, v) for g, v in grads_and_vars if embedding_of(v) is not None]
        dense_pairs = [(g, v) for g, v in grads_and_vars if embedding_of(v) is None]
        if not table_pairs:
            return super().apply_gradients(dense_pairs, *args, **kwargs)
        self._check_table_support()
        step = tf.cast(self.iterations, tf.int64) + 1  # Keras' 1-based local step
        lr = tf.cast(self._learning_rate_now(), tf.float32)
        for grad, var in table_pairs:
            if grad is None:
                warnings.warn(
                    f"ttf: table {embedding_of(var).name} got no gradient, so its rows do not train this step. "
                    "Likely cause: the model was called with training=False (or outside the GradientTape); "
                    "call it as model(x) or model(x, training=True) inside the tape.", stacklevel=2)
            elif not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"the gradient of ttf table anchor {var.name} must be IndexedSlices, got {type(grad)}")
        table_pairs = [(g, v) for g, v in table_pairs if g is not None]
        table_pairs, dense_pairs = self._unscale_and_clip(table_pairs, dense_pairs)
        updates = []
        for grad, var in table_pairs:
            decay = float(self.weight_decay or 0.0) if self._decays(var) else 0.0
            updates += embedding_of(var).apply_gradient(
                grad, lambda table, keys, rows: self._apply_table(table, keys, rows, lr, step, decay))
        with tf.control_dependencies(updates):
            if any(g is not None for g, _ in dense_pairs):
                global_clipnorm = self.global_clipnorm
                self.global_clipnorm = None  # applied above, over the tables' gradients too
                try:
                    return super().apply_gradients(dense_pairs, *args, **kwargs)
                finally:
                    self.global_clipnorm = global_clipnorm
            return self.iterations.assign_add(1)

    def _unscale_and_clip(self, table_pairs, dense_pairs):
        """What Keras does to a gradient before the update, done to the tables' row gradients:
        unscale (Keras 3's loss_scale_factor), then clipvalue / clipnorm per table, or
        global_clipnorm over dense and table gradients together (the dense ones scaled here
        by the same factor). -> (table_pairs, dense_pairs)."""
        scale = getattr(self, "loss_scale_factor", None)
        if scale is not None:
            table_pairs = [(_map_rows(g, lambda rows: rows / scale), v) for g, v in table_pairs]
        if not (self.clipvalue or self.clipnorm or self.global_clipnorm):
            return table_pairs, dense_pairs
        table_pairs = [(_summed_by_key(g), v) for g, v in table_pairs]  # an id's gradients summed first
        if self.clipnorm:
            table_pairs = [(_map_rows(g, lambda rows: tf.clip_by_norm(rows, self.clipnorm)), v) for g, v in table_pairs]
        elif self.global_clipnorm:
            # One norm over every gradient, unscaled (super() unscales the dense ones it is given).
            unscale = 1.0 if scale is None else scale
            norm = tf.linalg.global_norm([g.values for g, _ in table_pairs] +
                                         [_scaled(g, 1.0 / unscale) for g, _ in dense_pairs if g is not None])
            factor = self.global_clipnorm / tf.maximum(norm, self.global_clipnorm)
            table_pairs = [(_map_rows(g, lambda rows: rows * factor), v) for g, v in table_pairs]
            dense_pairs = [(_scaled(g, factor), v) for g, v in dense_pairs]
        elif self.clipvalue:
            table_pairs = [(_map_rows(g, lambda rows: tf.clip_by_value(rows, -self.clipvalue, self.clipvalue)), v)
                           for g, v in table_pairs]
        return table_pairs, dense_pairs

    def _decays(self, variable):
        """Whether weight decay applies to this table (Keras' exclude_from_weight_decay)."""
        if not self.weight_decay:
            return False
        use = getattr(self, "_use_weight_decay", None)
        return True if use is None else bool(use(variable))

    def build(self, var_list):
        # Table anchors have no Keras slots (their slots live beside the rows), so a model
        # loaded from a .keras file builds the same variables as the one that was saved.
        super().build([v for v in var_list if embedding_of(v) is None])

    def _learning_rate_now(self):
        """The learning rate of this step, as Keras computes it for dense variables (a
        schedule is evaluated at the current iterations, not read from last step's cache)."""
        learning_rate = getattr(self, "_learning_rate", None)
        if isinstance(learning_rate, tf.keras.optimizers.schedules.LearningRateSchedule):
            if hasattr(self, "_compute_current_learning_rate"):  # tf_keras: keeps opt.learning_rate current
                self._compute_current_learning_rate()
            return learning_rate(self.iterations)
        return self.learning_rate

    def _check_table_support(self):
        if getattr(self, "gradient_accumulation_steps", None):
            raise ValueError(f"ttf.optimizers.{type(self).__name__}: gradient_accumulation_steps is not supported for "
                             "ttf tables (their rows would update every step); use a larger batch instead")

    def _apply_table(self, table, keys, rows, lr, step, weight_decay):
        raise NotImplementedError


def _map_rows(grad, fn):
    return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)


def _scaled(grad, factor):
    """A dense gradient (a tensor, IndexedSlices or None) times a scalar."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return _map_rows(grad, lambda rows: rows * tf.cast(factor, rows.dtype))
    return grad * tf.cast(factor, grad.dtype)


def _summed_by_key(grad):
    """A table gradient with one row per id (the tape concatenates the slices of several
    lookups of one table, so an id may come more than once)."""
    keys, inverse = tf.unique(tf.cast(grad.indices, tf.int64), out_idx=tf.int32)
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(grad.values, inverse, tf.size(keys)), keys, grad.dense_shape)


def not_reaching_rows(optimizer):
    """The settings of a (ttf or stock) optimizer that act on dense variables only, never on
    a ttf table's rows, as 'name=value' strings (empty when everything reaches the rows)."""
    return [f"use_ema=True (ema_momentum={getattr(optimizer, 'ema_momentum', None)})"] if getattr(
        optimizer, "use_ema", False) else []


@tf.keras.utils.register_keras_serializable(package="ttf")
class SGD(_TableUpdates, tf.keras.optimizers.SGD):
    __doc__ = "tf.keras.optimizers.SGD; ttf tables get row -= lr * grad.\n\n" + tf.keras.optimizers.SGD.__doc__

    def _check_table_support(self):
        super()._check_table_support()
        if self.momentum != 0 or self.nesterov:
            raise ValueError("ttf.optimizers.SGD updates tables with plain SGD; momentum/nesterov are not supported "
                             "for ttf tables (use Adam or Adagrad)")

    def _apply_table(self, table, keys, rows, lr, step, weight_decay):
        return ops().ttf_table_apply_sgd(table.resource_handle, keys, rows, lr, step, weight_decay=weight_decay)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Adagrad(_TableUpdates, tf.keras.optimizers.Adagrad):
    __doc__ = "tf.keras.optimizers.Adagrad; ttf tables keep the accumulator beside each row.\n\n" + (
        tf.keras.optimizers.Adagrad.__doc__)

    def _apply_table(self, table, keys, rows, lr, step, weight_decay):
        return ops().ttf_table_apply_adagrad(table.resource_handle, keys, rows, lr, self.epsilon, step,
                                             initial_accumulator_value=self.initial_accumulator_value,
                                             weight_decay=weight_decay)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Adam(_TableUpdates, tf.keras.optimizers.Adam):
    __doc__ = "tf.keras.optimizers.Adam; ttf tables get lazy Adam with m and v beside each row.\n\n" + (
        tf.keras.optimizers.Adam.__doc__)

    def _check_table_support(self):
        super()._check_table_support()
        name = type(self).__name__
        if self.amsgrad:
            raise ValueError(f"ttf.optimizers.{name} does not support amsgrad for ttf tables")
        if getattr(self, "adaptive_epsilon", False):
            raise ValueError(f"ttf.optimizers.{name} does not support adaptive_epsilon for ttf tables")

    def _apply_table(self, table, keys, rows, lr, step, weight_decay):
        return ops().ttf_table_apply_adam(table.resource_handle, keys, rows, lr, self.beta_1, self.beta_2,
                                          self.epsilon, step, weight_decay=weight_decay)


@tf.keras.utils.register_keras_serializable(package="ttf")
class AdamW(Adam, tf.keras.optimizers.AdamW):
    __doc__ = ("tf.keras.optimizers.AdamW; ttf tables get lazy Adam with m and v beside each row and decoupled "
               "weight decay on the rows each step touches (row -= row * weight_decay * learning_rate before the "
               "Adam step; untouched rows do not decay).\n\n" + tf.keras.optimizers.AdamW.__doc__)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Ftrl(_TableUpdates, tf.keras.optimizers.Ftrl):
    __doc__ = "tf.keras.optimizers.Ftrl; ttf tables keep accumulator and linear beside each row.\n\n" + (
        tf.keras.optimizers.Ftrl.__doc__)

    def _apply_table(self, table, keys, rows, lr, step, weight_decay):
        return ops().ttf_table_apply_ftrl(
            table.resource_handle, keys, rows, lr, self.learning_rate_power, self.l1_regularization_strength,
            self.l2_regularization_strength, self.l2_shrinkage_regularization_strength, self.beta, step,
            initial_accumulator_value=self.initial_accumulator_value, weight_decay=weight_decay)


from ttf.optimizers._from_keras import from_keras  # noqa: E402  (needs the classes above)

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Ftrl", "from_keras", "not_reaching_rows"]
