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
