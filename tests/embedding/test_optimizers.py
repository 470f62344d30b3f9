"""Fused sparse optimizer updates against a NumPy reference of the lazy update, over many
steps with repeated, new and evicted keys; and the Keras optimizer integration."""
import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.embedding import EmbeddingTable

DIM = 4


class LazyReference:
    """NumPy float32 model of a table trained by one optimizer: rows, slots, last-seen."""

    def __init__(self, name, hyper, slot_init):
        self.name, self.h, self.slot_init = name, hyper, slot_init
        self.rows, self.slots, self.last_seen = {}, {}, {}

    def see(self, keys, looked_up_rows):
        for k, r in zip(keys, looked_up_rows):
            if k not in self.rows:  # new (or evicted and back): its initial row
                self.rows[k] = r.copy()
                self.slots[k] = [np.full(DIM, v, np.float32) for v in self.slot_init]

    def apply(self, keys, grads, step):
        summed = {}
        for k, g in zip(keys, grads):  # duplicates summed first, in input order
            summed[k] = summed[k] + g if k in summed else g.copy()
        f32 = np.float32
        for k, g in summed.items():
            w, s = self.rows[k], self.slots[k]
            h = self.h
            if self.name == "sgd":
                w -= f32(h["lr"]) * g
            elif self.name == "adagrad":
                s[0] += g * g
                w -= f32(h["lr"]) * g / np.sqrt(s[0] + f32(h["epsilon"]))
            elif self.name == "adam":
                t = f32(step)
                alpha = (
                    f32(h["lr"]) * np.sqrt(f32(1) - f32(h["beta_2"]) ** t) / (f32(1) - f32(h["beta_1"]) ** t))
                s[0] += (g - s[0]) * (f32(1) - f32(h["beta_1"]))
                s[1] += (g * g - s[1]) * (f32(1) - f32(h["beta_2"]))
                w -= (s[0] * alpha) / (np.sqrt(s[1]) + f32(h["epsilon"]))
            elif self.name == "ftrl":
                lr, power = f32(h["lr"]), f32(-h["lr_power"])
                l2 = f32(h["l2"]) + f32(h["beta"]) / (f32(2) * lr)
                grad_to_use = g + f32(2) * f32(h["l2_shrinkage"]) * w
                new_accum = s[0] + g * g
                s[1] += grad_to_use - (new_accum ** power - s[0] ** power) / lr * w
                quadratic = new_accum ** power / lr + f32(2) * l2
                clipped = np.clip(s[1], -f32(h["l1"]), f32(h["l1"]))
                w[:] = (clipped - s[1]) / quadratic
                s[0] = new_accum
            self.last_seen[k] = step

    def evict_before(self, step):
        for k in [k for k, s in self.last_seen.items() if s < step]:
            del self.rows[k], self.slots[k], self.last_seen[k]


OPTIMIZERS = {
    "sgd": (lambda: ttf.optimizers.SGD(0.05), dict(lr=0.05), []),
    "adagrad": (lambda: ttf.optimizers.Adagrad(0.05), dict(lr=0.05, epsilon=1e-7), [0.1]),
    "adam": (lambda: ttf.optimizers.Adam(0.01), dict(lr=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7), [0.0, 0.0]),
    "ftrl": (lambda: ttf.optimizers.Ftrl(0.05, l1_regularization_strength=0.001, l2_regularization_strength=0.01,
                                         l2_shrinkage_regularization_strength=0.001, beta=0.1),
             dict(lr=0.05, lr_power=-0.5, l1=0.001, l2=0.01, l2_shrinkage=0.001, beta=0.1), [0.1, 0.0]),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_update_matches_numpy_lazy_reference(name):
    make_opt, hyper, slot_init = OPTIMIZERS[name]
    opt = make_opt()
    layer = ttf.DynamicEmbedding(DIM, initializer="normal", seed=7)
    ref = LazyReference(name, hyper, slot_init)
    rng = np.random.default_rng(1)
    for step in range(1, 41):
        # Keys from a small pool (repeats within and across steps) plus a few brand-new ones.
        keys = np.concatenate([rng.integers(0, 30, size=24), rng.integers(1000 * step, 1000 * step + 5, size=3)])
        keys = keys.astype(np.int64)
        with tf.GradientTape() as tape:
            emb = layer(keys, training=True)
            loss = tf.reduce_sum(emb * tf.constant(rng.normal(size=(len(keys), DIM)).astype(np.float32)))
        ref.see(keys, emb.numpy())
        grads = tape.gradient(loss, layer.trainable_variables)  # [IndexedSlices(rows, unique keys)]
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        ref.apply(list(grads[0].indices.numpy()), list(grads[0].values.numpy()), step)
        if step % 10 == 0:  # evict keys not trained in the last 5 steps
            layer.evict(before_step=step - 5)
            ref.evict_before(step - 5)
        table = layer.tables[0]
        assert int(table.size()) == len(ref.rows)
    ex = {k: v.numpy() for k, v in layer.tables[0].export().items()}
    assert ex["optimizer"].decode() == name and int(opt.iterations) == 40
    for key, values in zip(ex["keys"], ex["values"]):
        expected = np.concatenate([ref.rows[key]] + ref.slots[key])
        # float32 in both; sqrt/pow may differ by an ulp, compounded over 40 steps.
        np.testing.assert_allclose(values, expected, rtol=2e-5, atol=1e-6, err_msg=f"{name} key {key}")
    np.testing.assert_array_equal(ex["meta"][:, 1], [ref.last_seen[k] for k in ex["keys"]])


def test_duplicate_keys_in_one_apply_are_summed():
    table = EmbeddingTable(2, "zeros")
    table.lookup(np.array([4, 5], np.int64), training=True)
    ttf._ops.ops().ttf_table_apply_sgd(table.resource_handle, [4, 5, 4], [[1, 1], [2, 2], [3, 3]], 1.0, 1)
    np.testing.assert_array_equal(table.lookup(np.array([4, 5], np.int64), training=False).numpy(), [[-4, -4], [-2, -2]])


@pytest.mark.parametrize("opt,keras_opt", [
    (ttf.optimizers.Adam(0.01), tf.keras.optimizers.Adam(0.01)),
    (ttf.optimizers.Adagrad(0.05), tf.keras.optimizers.Adagrad(0.05)),
])
def test_dense_variables_train_exactly_as_keras(opt, keras_opt):
    """The dense part of a model gets Keras' own update (same class underneath)."""
    w_ttf, w_keras = tf.Variable([1.0, -2.0, 3.0]), tf.Variable([1.0, -2.0, 3.0])
    for step in range(5):
        g = tf.constant([0.1 * step, -0.3, 0.2])
        opt.apply_gradients([(g, w_ttf)])
        keras_opt.apply_gradients([(g, w_keras)])
    np.testing.assert_array_equal(w_ttf.numpy(), w_keras.numpy())


def test_keras_defaults_are_kept():
    for ours, keras in [(ttf.optimizers.Adam(), tf.keras.optimizers.Adam()),
                        (ttf.optimizers.Adagrad(), tf.keras.optimizers.Adagrad()),
                        (ttf.optimizers.Ftrl(), tf.keras.optimizers.Ftrl()),
                        (ttf.optimizers.SGD(), tf.keras.optimizers.SGD())]:
        a, b = ours.get_config(), keras.get_config()
        b["name"] = a["name"]
        assert a == b


def test_sgd_momentum_is_refused_for_tables():
    layer = ttf.DynamicEmbedding(2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(np.array([1], np.int64), training=True))
    grads = tape.gradient(loss, layer.trainable_variables)
    with pytest.raises(ValueError, match="momentum"):
        ttf.optimizers.SGD(0.1, momentum=0.9).apply_gradients(zip(grads, layer.trainable_variables))


def test_table_refuses_a_second_optimizer():
    layer = ttf.DynamicEmbedding(2)

    def step(opt):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(np.array([1], np.int64), training=True))
        opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))

    step(ttf.optimizers.Adam())
    with pytest.raises(tf.errors.InvalidArgumentError, match="optimizer slot"):
        step(ttf.optimizers.Ftrl())
