"""ttf.checkpoint.CheckpointManager: full + delta checkpoints restore bit-identically (rows,
slots, counts, candidates, evictions, dense weights, optimizer state, step), in any sharding,
for fp32 and compressed rows (int8: its stored words, docs/checkpoints.md)."""
import os

import numpy as np
import pytest
import tensorflow as tf

import ttf
from table_order import by_key
from ttf.checkpoint import _format


def build(num_shards, rows="fp32"):
    ids = tf.keras.Input([4], dtype=tf.int64, name="ids")
    emb = ttf.DynamicEmbedding(4, seed=3, admission_min_count=2, shard_devices=["/cpu:0"] * num_shards, name="emb",
                               rows=rows)
    x = tf.keras.layers.Flatten()(emb(ids))
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(1))(x)
    model = tf.keras.Model(ids, out)
    optimizer = ttf.optimizers.Adam(0.05)
    model(tf.zeros([1, 4], tf.int64))
    optimizer.build(model.trainable_variables)
    return model, emb, optimizer


def step(model, optimizer, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(ids, training=True)[:, 0] - tf.cast(ids[:, 0] % 2, tf.float32)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def assert_identical(a, b):
    (model_a, emb_a, opt_a), (model_b, emb_b, opt_b) = a, b
    ta, tb = by_key(emb_a.export_table()), by_key(emb_b.export_table())
    for name in ("keys", "values", "meta", "candidate_keys", "candidate_meta", "slot_init", "optimizer", "step"):
        np.testing.assert_array_equal(ta[name], tb[name], err_msg=name)
    for va, vb in zip(model_a.variables, model_b.variables):
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.name)
    assert len(opt_a.variables) == len(opt_b.variables) > 1
    for va, vb in zip(opt_a.variables, opt_b.variables):
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.name)
    assert ttf.embedding.table_summary(emb_a)[:2] == ttf.embedding.table_summary(emb_b)[:2]  # the stored bits


@pytest.mark.parametrize("rows", ["fp32", "int8"])
def test_full_plus_deltas_restore_bit_identically_into_any_sharding(tmp_path, rows, capfd, monkeypatch):
    monkeypatch.setattr(_format, "PIECE_BYTES", 1024)  # streamed: several pieces a shard
    live = build(2, rows)
    model, emb, optimizer = live
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), str(tmp_path),
                                               full_every=3)
    rng = np.random.default_rng(0)
    kinds = []
    for save in range(5):  # full, delta, delta, full, delta
        for _ in range(4):
            step(model, optimizer, tf.constant(rng.integers(-60, 60 + 40 * save, size=(16, 4))))
        if save in (1, 3):
            assert int(emb.evict(min_count=3)) > 0  # deletions the next delta must carry
        kinds.append(os.path.basename(manager.save(int(optimizer.iterations))).split("-")[0])
    assert kinds == ["ckpt", "delta", "delta", "ckpt", "delta"]
    assert int(emb.tables[0].stats()[0]) + int(emb.tables[1].stats()[0]) > 0  # candidates are part of it

    at_save = by_key(emb.export_table())
    reader = tf.train.load_checkpoint(manager.latest)
    tags = [n for n in reader.get_variable_to_shape_map() if n.endswith("/row_layout")]
    assert len(tags) == (0 if rows == "fp32" else 2), tags  # fp32: the checkpoint of before, no tag
    if rows == "int8":
        assert reader.get_tensor(tags[0]) == b"rows=int8 dim=4 optimizer=adam slots=bf16,fp32row words=7"
    for shards in (2, 3, 1):
        restored = build(shards, rows)
        manager_b = ttf.checkpoint.CheckpointManager(
            tf.train.Checkpoint(model=restored[0], optimizer=restored[2]), str(tmp_path), full_every=3)
        assert manager_b.restore_latest() == int(optimizer.iterations)
        assert_identical(live, restored)

    # Training on after the restore, and saving more deltas, stays identical.
    for _ in range(3):
        batch = tf.constant(rng.integers(-100, 300, size=(16, 4)))
        step(model, optimizer, batch)
        step(restored[0], restored[2], batch)
    assert_identical(live, restored)
    if rows == "int8":  # into bf16 rows: decoded, converted, in one line
        capfd.readouterr()
        other = build(3, "bf16")
        ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=other[0], optimizer=other[2]), str(tmp_path),
                                         full_every=3).restore_latest()
        assert "converting the checkpoint's int8 rows to bf16 rows" in capfd.readouterr().err
        want, got = at_save, by_key(other[1].export_table())
        np.testing.assert_array_equal(got["keys"], want["keys"])
        np.testing.assert_allclose(got["values"], want["values"], rtol=2 ** -8, atol=1e-30)


def test_a_delta_is_smaller_than_a_full_checkpoint_and_never_taken_for_one(tmp_path):
    model, emb, optimizer = build(1)
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), str(tmp_path),
                                               full_every=10)
    step(model, optimizer, tf.constant(np.arange(4000).reshape(1000, 4)))
    full = manager.save(1)
    step(model, optimizer, tf.constant([[1, 2, 3, 4]], tf.int64))
    delta = manager.save(2)

    def size(prefix):
        return sum(os.path.getsize(p) for p in tf.io.gfile.glob(prefix + ".*"))

    assert size(delta) * 20 < size(full)
    with pytest.raises((tf.errors.NotFoundError, AssertionError, ValueError)):
        plain, _, plain_opt = build(1)
        tf.train.Checkpoint(model=plain, optimizer=plain_opt).restore(delta).assert_existing_objects_matched()


class _OldShard(tf.__internal__.tracking.Trackable):
    """A table shard as ttf wrote it before checkpoints held the logical table."""

    def _serialize_to_tensors(self):
        return {"keys": tf.constant([1, 2], tf.int64), "values": tf.zeros([2, 4])}


class _OldLayer(tf.__internal__.tracking.AutoTrackable):
    def __init__(self):
        self.tables = [_OldShard()]


@pytest.mark.parametrize("written_by", ["old_ttf", "another_model"])
def test_a_checkpoint_without_the_table_raises_naming_the_layer(tmp_path, written_by):
    saved = tf.train.Checkpoint(emb=_OldLayer()) if written_by == "old_ttf" else tf.train.Checkpoint(step=tf.Variable(3))
    tf.train.CheckpointManager(saved, str(tmp_path), max_to_keep=1).save(checkpoint_number=5)
    _, emb, optimizer = build(2)
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(emb=emb, optimizer=optimizer), str(tmp_path))
    cause = "one entry per table shard" if written_by == "old_ttf" else "another model"
    with pytest.raises(ValueError, match=f"holds no table for the ttf layers \\['emb'\\]: .*{cause}"):
        manager.restore_latest()
