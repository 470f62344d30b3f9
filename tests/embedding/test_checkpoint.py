"""Checkpoints hold the logical table (keys, not shard positions) and restore into any
sharding; a SavedModel loaded in the training process never touches a live table."""
import gc

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.embedding import shard_of

KEYS = np.array([0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, -1, -2, -9, 1 << 40, (1 << 40) + 1, (1 << 62) + 5], np.int64)


def sharded(n, **kwargs):
    """A DynamicEmbedding over n tables (n parameter-server shards, here all in this process)."""
    kwargs.setdefault("admission_min_count", 2)
    return ttf.DynamicEmbedding(4, seed=7, shard_devices=["/cpu:0"] * n, **kwargs)


def train(layer, optimizer, batches):
    for keys in batches:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(tf.constant(keys), training=True) - 0.5))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def by_key(export):
    """The export as numpy, rows and candidates sorted by key (shard order is not part of it)."""
    out = {name: t.numpy() for name, t in export.items()}
    for keys, fields in (("keys", ("keys", "values", "meta")), ("candidate_keys", ("candidate_keys", "candidate_meta"))):
        order = np.argsort(out[keys], kind="stable")
        for name in fields:
            out[name] = out[name][order]
    return out


def check_routed(layer):
    """Every shard holds exactly the keys (and candidates) shard_of routes to it."""
    n = len(layer.tables)
    for i, table in enumerate(layer.tables):
        export = table.export()
        for name in ("keys", "candidate_keys"):
            assert (shard_of(export[name], n).numpy() == i).all(), (name, i, export[name].numpy())


def assert_same_table(a, b):
    ea, eb = by_key(a.export_table()), by_key(b.export_table())
    for name in ("keys", "values", "meta", "candidate_keys", "candidate_meta", "slot_init"):
        np.testing.assert_array_equal(ea[name], eb[name], err_msg=name)
    assert ea["optimizer"] == eb["optimizer"] and ea["step"] == eb["step"]
    assert int(a.size()) == int(b.size()) == len(ea["keys"])
    lookup = tf.constant(np.concatenate([KEYS, [99, -99]]))  # 99, -99: never seen, default row
    np.testing.assert_array_equal(a(lookup, training=False).numpy(), b(lookup, training=False).numpy())


def test_checkpoint_moves_between_shardings(tmp_path):
    rng = np.random.default_rng(0)
    batches = [rng.choice(KEYS, size=12) for _ in range(6)] + [np.array([1 << 50, 21, 22], np.int64)]
    layer, optimizer = sharded(1), ttf.optimizers.Adam(0.1)
    train(layer, optimizer, batches)
    assert int(layer.tables[0].stats()[0]) > 0  # some keys are still admission candidates
    path = tf.train.Checkpoint(layer=layer, optimizer=optimizer).save(str(tmp_path / "one"))

    for n, name in ((2, "two"), (3, "three"), (1, "back")):
        restored, restored_optimizer = sharded(n), ttf.optimizers.Adam(0.1)
        restored(tf.constant([1, 2, 3], tf.int64), training=True)  # some content to be replaced
        status = tf.train.Checkpoint(layer=restored, optimizer=restored_optimizer).restore(path)
        status.assert_existing_objects_matched()
        check_routed(restored)
        assert sum(int(t.size()) for t in restored.tables) == int(layer.size())
        assert_same_table(layer, restored)
        path = tf.train.Checkpoint(layer=restored, optimizer=restored_optimizer).save(str(tmp_path / name))
        previous, previous_optimizer = restored, restored_optimizer

    # Training on continues identically whatever the sharding was on the way.
    more = [rng.choice(KEYS, size=12) for _ in range(3)]
    train(layer, optimizer, more)
    train(previous, previous_optimizer, more)
    assert_same_table(layer, previous)


def test_shards_never_trained_get_initial_slots(tmp_path):
    layer = sharded(2, admission_min_count=0)
    optimizer = ttf.optimizers.Adagrad(0.1, initial_accumulator_value=0.25)
    train(layer, optimizer, [np.array([2, 4, 6], np.int64)])  # every key in shard 0
    ops().ttf_table_find_or_insert(layer.tables[1].resource_handle, [1, 3], dim=4)  # shard 1: rows, no optimizer yet
    path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
    single = sharded(1, admission_min_count=0)
    tf.train.Checkpoint(layer=single).restore(path)
    export = by_key(single.export_table())
    np.testing.assert_array_equal(export["keys"], [1, 2, 3, 4, 6])
    assert export["optimizer"] == b"adagrad" and export["values"].shape == (5, 8)
    np.testing.assert_array_equal(export["values"][[0, 2], 4:], np.full((2, 4), 0.25, np.float32))


def tiny_model(name="emb"):
    inputs = tf.keras.Input([3], dtype=tf.int64, name="ids")
    emb = ttf.FusedEmbedding(8, num_fields=3, tag_fields=True, seed=1, name=name)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Flatten()(emb(inputs)))
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer=ttf.optimizers.Adam(0.05), loss="binary_crossentropy")
    return model, emb


def fit(model, seed, n=256):
    ids = np.random.default_rng(seed).integers(0, 50, size=(n, 3))
    model.fit(ids, (ids[:, 0] % 2).astype(np.float32), batch_size=64, epochs=1, verbose=0)
    return ids


def serve(loaded, ids):
    return list(loaded.signatures["serving_default"](tf.constant(ids)).values())[0].numpy()


def test_loaded_saved_model_never_touches_the_live_table(tmp_path):
    model, emb = tiny_model()
    ids = fit(model, 0)
    saved = model.predict(ids, verbose=0)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    fit(model, 1)  # the live table moves on after the save
    live = by_key(emb.export_table())
    live_predictions = model.predict(ids, verbose=0)

    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(serve(loaded, ids), saved, rtol=1e-6)
    after_load = by_key(emb.export_table())
    for name in ("keys", "values", "meta"):
        np.testing.assert_array_equal(after_load[name], live[name], err_msg=name)
    del loaded
    gc.collect()
    after_gc = by_key(emb.export_table())
    np.testing.assert_array_equal(after_gc["values"], live["values"])
    np.testing.assert_array_equal(model.predict(ids, verbose=0), live_predictions)


def test_two_models_and_two_loads_with_the_same_names_stay_apart(tmp_path):
    first, _ = tiny_model("emb")
    second, _ = tiny_model("emb")
    ids = fit(first, 0)
    fit(second, 5)
    tf.saved_model.save(first, str(tmp_path / "first"))
    tf.saved_model.save(second, str(tmp_path / "second"))
    expected = {"first": first.predict(ids, verbose=0), "second": second.predict(ids, verbose=0)}
    assert not np.allclose(expected["first"], expected["second"])
    loads = {name: tf.saved_model.load(str(tmp_path / name)) for name in ("first", "second")}
    again = tf.saved_model.load(str(tmp_path / "first"))
    for name, loaded in loads.items():
        np.testing.assert_allclose(serve(loaded, ids), expected[name], rtol=1e-6, err_msg=name)
    del loads["first"]
    gc.collect()  # frees its tables only
    np.testing.assert_allclose(serve(again, ids), expected["first"], rtol=1e-6)
    np.testing.assert_allclose(serve(loads["second"], ids), expected["second"], rtol=1e-6)


@pytest.mark.parametrize("n", [1, 3])
def test_shard_of_is_floormod(n):
    keys = tf.constant([-5, -1, 0, 1, 7, (1 << 63) - 1, -(1 << 63)], tf.int64)
    np.testing.assert_array_equal(shard_of(keys, n).numpy(), np.array([k % n for k in keys.numpy().tolist()]))
