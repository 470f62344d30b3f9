"""get_config keeps everything a layer was built with; tag_fields refuses ids it cannot tag."""
import numpy as np
import pytest
import tensorflow as tf

import ttf


@pytest.mark.parametrize("initializer, kind, a, b", [
    (tf.keras.initializers.Constant(1.0), "constant", 1.0, 0.0),
    (tf.keras.initializers.RandomNormal(stddev=0.01), "normal", 0.0, 0.01),
    (tf.keras.initializers.TruncatedNormal(mean=0.5, stddev=0.2), "truncated_normal", 0.5, 0.2),
    (tf.keras.initializers.RandomUniform(-0.3, 0.1), "uniform", -0.3, 0.1),
    (ttf.embedding.RowInitializer("constant", 2.5, 0.0), "constant", 2.5, 0.0),
])
def test_get_config_keeps_the_initializer_parameters(initializer, kind, a, b):
    layer = ttf.FusedEmbedding(4, num_fields=2, initializer=initializer, seed=3, name="emb")
    clone = ttf.FusedEmbedding.from_config(layer.get_config())
    got = clone.tables[0].initializer
    assert got.kind == kind and got.a == pytest.approx(a) and got.b == pytest.approx(b)
    keys = tf.constant([[5, 9], [1 << 33, 0]], tf.int64)  # same (seed, key) -> same row
    np.testing.assert_array_equal(clone(keys, training=True).numpy(), layer(keys, training=True).numpy())


@pytest.mark.parametrize("bad", [1 << 56, (1 << 62) + 3, -1, -(1 << 60)])
def test_tag_fields_refuses_ids_outside_56_bits(bad):
    layer = ttf.FusedEmbedding(4, num_fields=2, tag_fields=True, name="tagged")
    ids = tf.constant([[1, 2], [3, bad]], tf.int64)
    for training in (True, False):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"tagged: with tag_fields=True ids must be in "
                                                                   r"\[0, 2\*\*56\)"):
            layer(ids, training=training)
    traced = tf.function(lambda x: layer(x, training=False))
    with pytest.raises(tf.errors.InvalidArgumentError, match="tag_fields"):
        traced(ids)
    assert int(layer.size()) == 0  # nothing was inserted
    edges = tf.constant([[0, (1 << 56) - 1]], tf.int64)  # the edges are fine
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(edges, training=True))
    grads = tape.gradient(loss, layer.trainable_variables)
    ttf.optimizers.SGD(0.1).apply_gradients(zip(grads, layer.trainable_variables))  # rows are inserted at apply
    assert int(layer.size()) == 2
