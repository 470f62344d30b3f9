"""ttf.embedding.EventTimeTTL against a reference: after every batch the job observes the
batch's event time; evict() must leave exactly the keys whose last training batch is newer
than (newest event time - ttl), on every shard, and record the removed keys as deletions."""
import numpy as np
import pytest
import tensorflow as tf

import ttf


def train(layer, optimizer, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(ids, tf.int64), training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def test_evicts_exactly_the_keys_last_trained_before_the_cutoff():
    layer = ttf.DynamicEmbedding(4, shard_devices=["/cpu:0"] * 3, name="ttl_table")
    optimizer = ttf.optimizers.Adagrad(0.1)
    ttl = ttf.embedding.EventTimeTTL([layer], ttl_seconds=100)
    rng = np.random.default_rng(0)
    last_time = {}  # the reference: key -> event time of the last batch that trained it
    for table in layer.tables:
        table.reset_deleted(record="publish")  # what a Publisher's base does: deletions recorded from here
    removed_keys = set()
    for batch in range(60):
        event_time = 1000.0 + 10 * batch + rng.integers(0, 5)  # roughly increasing, as a stream's are
        ids = rng.integers(0, 300, size=(16, 2))
        train(layer, optimizer, ids)
        for key in ids.ravel().tolist():
            last_time[key] = event_time
        ttl.observe(event_time)
        if batch % 7 == 6:
            before = {int(k) for t in layer.tables for k in t.export()["keys"].numpy()}
            removed = ttl.evict()
            cutoff = ttl.newest - 100
            kept = {int(k) for t in layer.tables for k in t.export()["keys"].numpy()}
            want = {k for k in before if last_time[k] > cutoff}
            assert kept == want, (batch, sorted(kept ^ want)[:10])
            assert removed == len(before) - len(kept)
            removed_keys |= before - kept
    assert ttl.evicted > 0
    deleted = {int(k) for t in layer.tables
               for k in t.export(since_step=0, record="publish")["deleted_keys"].numpy()}
    assert removed_keys <= deleted  # a published delta carries them as deletes


def test_bad_ttl_is_refused():
    with pytest.raises(ValueError, match="ttl_seconds must be a number > 0"):
        ttf.embedding.EventTimeTTL([], ttl_seconds=0)


def run_ttl_job(ckpt_dir, batches, restart_at=None, shard_devices=("/cpu:0",) * 3, evict_every=5):
    """Trains `batches` batches (seeded), noting event times and evicting every `evict_every`
    batches as the stream job does; with restart_at, checkpoints there (ttf CheckpointManager,
    delta checkpoints included), drops every object and goes on from a fresh job restored from
    that checkpoint. Returns the key sets left after each eviction and the final key set."""
    rng = np.random.default_rng(5)
    schedule = [(1000.0 + 10 * b + float(rng.integers(0, 5)), rng.integers(0, 400, size=(16, 2)))
                for b in range(batches)]

    def make_job():
        layer = ttf.DynamicEmbedding(4, shard_devices=list(shard_devices), name="ttl_ckpt_table")
        optimizer = ttf.optimizers.Adagrad(0.1)
        ttl = ttf.embedding.EventTimeTTL([layer], ttl_seconds=80)
        train(layer, optimizer, np.zeros([1, 2], np.int64))  # builds the slots before a restore
        checkpoint = tf.train.Checkpoint(layer=layer, optimizer=optimizer, event_ttl=ttl)
        return layer, optimizer, ttl, ttf.checkpoint.CheckpointManager(checkpoint, str(ckpt_dir), full_every=2)

    layer, optimizer, ttl, manager = make_job()
    decisions = []
    for batch, (event_time, ids) in enumerate(schedule):
        if batch == restart_at:
            manager.save(step=batch - 1)  # a full checkpoint ...
            manager.save(step=batch)      # ... and a delta after it: the notes ride in both
            del layer, optimizer, ttl, manager
            layer, optimizer, ttl, manager = make_job()
            assert manager.restore_latest() == batch
        train(layer, optimizer, ids)
        ttl.observe(event_time)
        if batch % evict_every == evict_every - 1:
            ttl.evict()
            decisions.append(sorted(int(k) for t in layer.tables for k in t.export()["keys"].numpy()))
    return decisions, ttl.evicted


def test_restart_from_checkpoint_makes_the_same_evictions_as_an_uninterrupted_run(tmp_path):
    """The notes are in the checkpoint: a job restored mid-stream evicts exactly the keys an
    uninterrupted job evicts, at every eviction after the restart (without the notes, rows
    older than the TTL would wait one more TTL and the key sets would differ)."""
    straight, evicted = run_ttl_job(tmp_path / "straight", 40)
    restarted, evicted_restarted = run_ttl_job(tmp_path / "restarted", 40, restart_at=17)
    assert evicted > 0 and len(straight) == 8
    assert restarted == straight
    assert evicted_restarted == evicted  # the count of evicted rows is checkpointed too


def test_notes_restored_into_another_shard_count_evict_late_never_early(tmp_path):
    """3 shards saved, 2 restored: each note keeps the smallest step of its shards (with a
    warning), so no key trained after a note is evicted by the cut-off at that note."""
    layer = ttf.DynamicEmbedding(4, shard_devices=["/cpu:0"] * 3, name="ttl_shards_a")
    optimizer = ttf.optimizers.Adagrad(0.1)
    ttl = ttf.embedding.EventTimeTTL([layer], ttl_seconds=80)
    train(layer, optimizer, np.arange(20, dtype=np.int64).reshape(10, 2))
    ttl.observe(1000.0)
    train(layer, optimizer, np.arange(20, 40, dtype=np.int64).reshape(10, 2))
    ttl.observe(1050.0)
    path = tf.train.Checkpoint(layer=layer, optimizer=optimizer, event_ttl=ttl).write(str(tmp_path / "three"))
    other = ttf.DynamicEmbedding(4, shard_devices=["/cpu:0"] * 2, name="ttl_shards_b")
    optimizer2 = ttf.optimizers.Adagrad(0.1)
    train(other, optimizer2, np.zeros([1, 2], np.int64))
    ttl2 = ttf.embedding.EventTimeTTL([other], ttl_seconds=80)
    with pytest.warns(UserWarning, match="notes are of 3 shards, this job has 2"):
        tf.train.Checkpoint(layer=other, optimizer=optimizer2, event_ttl=ttl2).read(path).expect_partial()
    assert ttl2.newest == 1050.0 and len(ttl2._steps[0]) == 2  # pylint: disable=protected-access
    ttl2.observe(1090.0)  # the cut-off 1010 passes the first note only
    ttl2.evict()
    kept = {int(k) for t in other.tables for k in t.export()["keys"].numpy()}
    assert set(range(20, 40)) <= kept  # trained after the first note: never early
