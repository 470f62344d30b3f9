"""Keras integration: model.fit learns, checkpoints restore bit-identically, SavedModel
serves without growing the table, concurrent use is safe, bad input is refused clearly."""
import threading

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.embedding import EmbeddingTable


def toy_data(n=4096, seed=0):
    """Label = parity of field 0's id: learnable only through the embedding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 200, size=(n, 3)).astype(np.int64)
    return ids, (ids[:, 0] % 2).astype(np.float32)


def toy_model(**embedding_kwargs):
    inputs = tf.keras.Input([3], dtype=tf.int64)
    emb = ttf.FusedEmbedding(8, num_fields=3, tag_fields=True, seed=1, **embedding_kwargs)
    x = tf.keras.layers.Flatten()(emb(inputs))
    x = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(2))(x)
    out = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(x)
    return tf.keras.Model(inputs, out), emb


def test_model_fit_learns_and_grows_the_table():
    model, emb = toy_model()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["AUC"])
    ids, labels = toy_data()
    history = model.fit(ids, labels, epochs=6, batch_size=128, verbose=0).history
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["auc"][-1] > 0.95
    assert int(emb.size()) == len(np.unique(ids[:, 0])) + len(np.unique(ids[:, 1])) + len(np.unique(ids[:, 2]))


def test_custom_loop_with_tape_and_apply_gradients():
    model, emb = toy_model()
    opt = ttf.optimizers.Adam(0.02)
    ids, labels = toy_data(1024)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)[:, 0])
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(train_step(ids[i:i + 128], labels[i:i + 128])) for _ in range(12) for i in range(0, 1024, 128)]
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])
    assert int(opt.iterations) == 96


def test_ragged_multi_hot_with_mean_combiner_trains():
    layer = ttf.DynamicEmbedding(4, combiner="mean", seed=3)
    ids = tf.ragged.constant([[1, 2, 3], [2], [], [4, 4]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        out = layer(ids, training=True)
        loss = tf.reduce_sum(out)
    assert out.shape == (4, 4)
    np.testing.assert_array_equal(out[2].numpy(), np.zeros(4))
    grad = tape.gradient(loss, layer.trainable_variables)[0]
    by_key = dict(zip(grad.indices.numpy(), grad.values.numpy()[:, 0]))
    # d(mean)/d(row): 1/3 per occurrence in bag 0, 1 in bag 1, 2 * 1/2 in bag 3.
    np.testing.assert_allclose([by_key[1], by_key[2], by_key[3], by_key[4]], [1 / 3, 1 / 3 + 1, 1 / 3, 1.0], rtol=1e-6)


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    model, emb = toy_model(admission_min_count=2)
    opt = ttf.optimizers.Adam(0.01)
    model.compile(optimizer=opt, loss="binary_crossentropy")
    ids, labels = toy_data(1024)
    model.fit(ids, labels, epochs=2, batch_size=256, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))

    model2, emb2 = toy_model(admission_min_count=2)
    opt2 = ttf.optimizers.Adam(0.01)
    model2.compile(optimizer=opt2, loss="binary_crossentropy")
    model2.fit(ids[:64], labels[:64], epochs=1, batch_size=64, verbose=0)  # different state before restore
    tf.train.Checkpoint(model=model2, optimizer=opt2).restore(path).assert_existing_objects_matched()

    a, b = emb.tables[0].export(), emb2.tables[0].export()
    order_a, order_b = np.argsort(a["keys"]), np.argsort(b["keys"])
    for name in ("keys", "values", "meta"):
        np.testing.assert_array_equal(a[name].numpy()[order_a], b[name].numpy()[order_b], err_msg=name)
    np.testing.assert_array_equal(np.sort(a["candidate_keys"]), np.sort(b["candidate_keys"]))
    assert int(a["step"]) == int(b["step"]) and int(opt.iterations) == int(opt2.iterations)
    for w1, w2 in zip(model.get_weights(), model2.get_weights()):
        np.testing.assert_array_equal(w1, w2)
    # Training on continues identically.
    model.fit(ids, labels, epochs=1, batch_size=256, shuffle=False, verbose=0)
    model2.fit(ids, labels, epochs=1, batch_size=256, shuffle=False, verbose=0)
    np.testing.assert_array_equal(model.predict(ids, verbose=0), model2.predict(ids, verbose=0))


def test_saved_model_serves_with_find_and_never_grows(tmp_path):
    model, emb = toy_model()
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    ids, labels = toy_data(1024)
    model.fit(ids, labels, epochs=2, batch_size=256, verbose=0)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    serve = loaded.signatures["serving_default"]
    expected = model.predict(ids, verbose=0)
    got = list(serve(tf.constant(ids)).values())[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)  # same graph, same rows
    size_before = int(emb.size())
    unseen = np.full((4, 3), 10_000, np.int64)
    served = list(serve(tf.constant(unseen)).values())[0].numpy()
    assert np.isfinite(served).all()
    # The loaded model's table carries the original's shared name, so this is its size too.
    assert int(emb.size()) == size_before


def test_eight_threads_lookup_and_apply_concurrently():
    table = EmbeddingTable(8, "zeros", num_shards=4)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 5000, size=2000).astype(np.int64) for _ in range(8 * 20)]
    errors = []

    def worker(tid):
        try:
            for i in range(20):
                keys = batches[tid * 20 + i]
                table.lookup(keys, training=True)
                ops().ttf_table_apply_sgd(table.resource_handle, keys, np.ones((len(keys), 8), np.float32), 1.0, 1)
                table.lookup(keys[:100], training=False)
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    all_keys = np.concatenate(batches)
    unique, counts = np.unique(all_keys, return_counts=True)
    assert int(table.size()) == len(unique)
    # Zeros init, lr 1, grad 1 per occurrence: every row is exactly -(occurrences). Integers
    # are exact in float32, so any lost or torn update would show.
    rows = table.lookup(unique, training=False).numpy()
    np.testing.assert_array_equal(rows, -np.repeat(counts[:, None], 8, axis=1).astype(np.float32))


# ---------------------------------------------------------------- bad input

def test_bad_input_gives_clear_errors():
    table = EmbeddingTable(4)
    h = table.resource_handle
    with pytest.raises(ValueError, match="dim must be a positive int"):
        EmbeddingTable(0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="dim"):
        ops().ttf_embedding_table(dim=-1, shared_name="bad")
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match="int64|int32"):
        ops().ttf_embedding_lookup(h, tf.constant([1.0, 2.0]), dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be rank 1"):
        ops().ttf_table_find_or_insert(h, [[1, 2]], dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must have rank >= 1"):
        ops().ttf_embedding_lookup(h, tf.constant(3, tf.int64), dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim attr is 8 but the table's rows have dim 4"):
        ops().ttf_embedding_lookup(h, [1], dim=8)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads must have shape \[2, 4\]"):
        ops().ttf_table_apply_sgd(h, [1, 2], np.ones((3, 4), np.float32), 0.1, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite"):
        ops().ttf_table_apply_adam(h, [1], [[0.0, np.nan, 0.0, 0.0]], 0.1, 0.9, 0.999, 1e-7, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step must be >= 1"):
        ops().ttf_table_apply_sgd(h, [1], np.ones((1, 4), np.float32), 0.1, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits must end at"):
        ops().ttf_embedding_lookup_ragged(h, [1, 2], [0, 1], dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-decreasing"):
        ops().ttf_embedding_lookup_ragged(h, [1, 2], [0, 2, 1, 2], dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"values must have shape \[1, 4\]"):
        ops().ttf_table_import(h, [1], np.ones((1, 5), np.float32), [[1, 1]], tf.zeros([0], tf.int64),
                               tf.zeros([0, 2], tf.int64), "", tf.zeros([0]), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than once"):
        ops().ttf_table_import(h, [1, 1], np.ones((2, 4), np.float32), [[1, 1], [1, 1]], tf.zeros([0], tf.int64),
                               tf.zeros([0, 2], tf.int64), "", tf.zeros([0]), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="uniform initializer needs minval"):
        ops().ttf_embedding_table(dim=2, initializer="uniform", init_a=1.0, init_b=0.0, shared_name="bad2")
    assert int(table.size()) == 0  # nothing half-done


def test_layer_input_errors():
    with pytest.raises(TypeError, match="ids must be int64 or int32"):
        ttf.DynamicEmbedding(4)(tf.constant([1.5]))
    with pytest.raises(ValueError, match="ragged ids need combiner"):
        ttf.DynamicEmbedding(4)(tf.ragged.constant([[1], [2, 3]], dtype=tf.int64))
    with pytest.raises(ValueError, match=r"ids must have shape \[B, 3\]"):
        ttf.FusedEmbedding(4, num_fields=3)(tf.zeros([2, 4], tf.int64))
    with pytest.raises(ValueError, match="combiner must be"):
        ttf.DynamicEmbedding(4, combiner="max")
    out = ttf.DynamicEmbedding(4)(tf.constant([[1, 2]], tf.int32), training=True)  # int32 is widened
    assert out.shape == (1, 2, 4)
