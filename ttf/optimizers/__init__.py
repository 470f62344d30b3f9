"""Keras optimizers that also train ttf tables.

Each is the tf.keras optimizer of the same name (same arguments, same defaults) for dense
variables; the gradient of a ttf embedding (an IndexedSlices of row gradients keyed by id)
goes to the table's fused sparse update instead: one op call per table shard per step,
updating only the touched rows and their slots, which live beside the rows. Works with
model.compile/fit and with tape.gradient + apply_gradients.

Differences from Keras for tables, by design: updates are lazy (untouched rows and slots
do not decay), and clipnorm/clipvalue/global_clipnorm, weight_decay and EMA apply to dense
variables only. Table updates need plain SGD (momentum=0) and Adam without amsgrad.
The learning rate (a float, a changed value, or a LearningRateSchedule) is read at the
current step, for tables as for dense variables.

`from_keras(opt)` converts a stock tf.keras Adam, Adagrad, Ftrl or SGD (an object or a
name) to its ttf twin with the same hyperparameters and schedule.
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
        updates = []
        for grad, var in table_pairs:
            if grad is None:
                warnings.warn(
                    f"ttf: table {embedding_of(var).name} got no gradient, so its rows do not train this step. "
                    "Likely cause: the model was called with training=False (or outside the GradientTape); "
                    "call it as model(x) or model(x, training=True) inside the tape.", stacklevel=2)
                continue
            if not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"the gradient of ttf table anchor {var.name} must be IndexedSlices, got {type(grad)}")
            updates += embedding_of(var).apply_gradient(
                grad, lambda table, keys, rows: self._apply_table(table, keys, rows, lr, step))
        with tf.control_dependencies(updates):
            if any(g is not None for g, _ in dense_pairs):
                return super().apply_gradients(dense_pairs, *args, **kwargs)
            return self.iterations.assign_add(1)

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
        pass

    def _apply_table(self, table, keys, rows, lr, step):
        raise NotImplementedError


@tf.keras.utils.register_keras_serializable(package="ttf")
class SGD(_TableUpdates, tf.keras.optimizers.SGD):
    __doc__ = "tf.keras.optimizers.SGD; ttf tables get row -= lr * grad.\n\n" + tf.keras.optimizers.SGD.__doc__

    def _check_table_support(self):
        if self.momentum != 0 or self.nesterov:
            raise ValueError("ttf.optimizers.SGD updates tables with plain SGD; momentum/nesterov are not supported "
                             "for ttf tables (use Adam or Adagrad)")

    def _apply_table(self, table, keys, rows, lr, step):
        return ops().ttf_table_apply_sgd(table.resource_handle, keys, rows, lr, step)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Adagrad(_TableUpdates, tf.keras.optimizers.Adagrad):
    __doc__ = "tf.keras.optimizers.Adagrad; ttf tables keep the accumulator beside each row.\n\n" + (
        tf.keras.optimizers.Adagrad.__doc__)

    def _apply_table(self, table, keys, rows, lr, step):
        return ops().ttf_table_apply_adagrad(table.resource_handle, keys, rows, lr, self.epsilon, step,
                                             initial_accumulator_value=self.initial_accumulator_value)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Adam(_TableUpdates, tf.keras.optimizers.Adam):
    __doc__ = "tf.keras.optimizers.Adam; ttf tables get lazy Adam with m and v beside each row.\n\n" + (
        tf.keras.optimizers.Adam.__doc__)

    def _check_table_support(self):
        if self.amsgrad:
            raise ValueError("ttf.optimizers.Adam does not support amsgrad for ttf tables")
        if getattr(self, "adaptive_epsilon", False):
            raise ValueError("ttf.optimizers.Adam does not support adaptive_epsilon for ttf tables")

    def _apply_table(self, table, keys, rows, lr, step):
        return ops().ttf_table_apply_adam(table.resource_handle, keys, rows, lr, self.beta_1, self.beta_2,
                                          self.epsilon, step)


@tf.keras.utils.register_keras_serializable(package="ttf")
class Ftrl(_TableUpdates, tf.keras.optimizers.Ftrl):
    __doc__ = "tf.keras.optimizers.Ftrl; ttf tables keep accumulator and linear beside each row.\n\n" + (
        tf.keras.optimizers.Ftrl.__doc__)

    def _apply_table(self, table, keys, rows, lr, step):
        return ops().ttf_table_apply_ftrl(
            table.resource_handle, keys, rows, lr, self.learning_rate_power, self.l1_regularization_strength,
            self.l2_regularization_strength, self.l2_shrinkage_regularization_strength, self.beta, step,
            initial_accumulator_value=self.initial_accumulator_value)


from ttf.optimizers._from_keras import from_keras  # noqa: E402  (needs the classes above)

__all__ = ["SGD", "Adagrad", "Adam", "Ftrl", "from_keras"]
