"""The table ops against plain references: lookups vs a dense tf.Variable, initialisation
as a pure function of (seed, key), admission, eviction, export/import, memory."""
import numpy as np
import pytest
import tensorflow as tf

import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
from ttf._ops import ops
from ttf.embedding import EmbeddingTable


def sorted_export(table):
    ex = {k: v.numpy() for k, v in table.export().items()}
    order = np.argsort(ex["keys"])
    for name in ("keys", "values", "meta"):
        ex[name] = ex[name][order]
    order = np.argsort(ex["candidate_keys"])
    for name in ("candidate_keys", "candidate_meta"):
        ex[name] = ex[name][order]
    return ex


def test_fused_lookup_matches_dense_variable_gather():
    rng = np.random.default_rng(0)
    table = EmbeddingTable(8, "normal", seed=3)
    ids = rng.integers(-(1 << 62), 1 << 62, size=50)[rng.integers(0, 50, size=(64, 26))]  # many repeats
    # A training lookup of unseen ids reads the rows an update would insert, and inserts nothing.
    fresh = ops().ttf_embedding_lookup(table.resource_handle, ids, dim=8)[0]
    assert int(table.size()) == 0
    ops().ttf_table_find_or_insert(table.resource_handle, np.unique(ids), dim=8)
    emb, unique_keys, inverse = ops().ttf_embedding_lookup(table.resource_handle, ids, dim=8)
    ex = sorted_export(table)
    assert set(ex["keys"]) == set(ids.ravel())
    # Reference: a dense variable holding the exported rows, gathered by position.
    dense = tf.Variable(ex["values"])
    position = {k: i for i, k in enumerate(ex["keys"])}
    expected = tf.gather(dense, np.vectorize(position.get)(ids)).numpy()
    np.testing.assert_array_equal(emb.numpy(), expected)  # exact: copies, no arithmetic
    np.testing.assert_array_equal(fresh.numpy(), expected)  # the would-be rows are the inserted rows
    np.testing.assert_array_equal(tf.gather(unique_keys, inverse).numpy(), ids.ravel())
    # A second lookup reads the same rows and inserts nothing.
    again = ops().ttf_embedding_lookup(table.resource_handle, ids, dim=8)[0]
    np.testing.assert_array_equal(again.numpy(), emb.numpy())
    assert int(table.size()) == len(set(ids.ravel()))


def test_training_lookup_changes_nothing_until_the_update():
    # A step skipped after its forward (non-finite loss) must leave rows, counts, last-seen
    # steps, admission candidates and the step exactly as they were.
    table = EmbeddingTable(4, "normal", seed=2, admission_min_count=2)
    h = table.resource_handle
    for step in (1, 2):
        ops().ttf_table_apply_adam(h, np.arange(0, 20 * step, 2, dtype=np.int64),
                                   np.ones((10 * step, 4), np.float32), 0.01, 0.9, 0.999, 1e-7, step)
    before = sorted_export(table)
    assert len(before["keys"]) and len(before["candidate_keys"])
    ids = np.arange(-5, 60, dtype=np.int64).reshape(5, 13)
    ops().ttf_embedding_lookup(h, ids, dim=4, training=True)
    ops().ttf_embedding_lookup_ragged(h, ids.ravel(), [0, 30, 65], dim=4, training=True)
    table.lookup(ids.ravel(), training=True)
    after = sorted_export(table)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_rows_are_a_pure_function_of_seed_and_key():
    keys = np.arange(-500, 500, dtype=np.int64) * 7919
    a = EmbeddingTable(16, "truncated_normal", seed=11, num_shards=1)
    b = EmbeddingTable(16, "truncated_normal", seed=11, num_shards=64)
    rows_a = a.lookup(keys, training=True).numpy()
    rows_b = b.lookup(keys[::-1], training=True).numpy()[::-1]  # other order, other sharding
    np.testing.assert_array_equal(rows_a, rows_b)
    other_seed = EmbeddingTable(16, "truncated_normal", seed=12).lookup(keys, training=True).numpy()
    assert not np.allclose(rows_a, other_seed)
    # Distribution: truncated normal(0, 0.05) within 2 stddev, std about 0.88 * 0.05.
    assert np.abs(rows_a).max() <= 0.1 + 1e-7
    assert abs(rows_a.std() - 0.88 * 0.05) < 0.003
    assert abs(rows_a.mean()) < 0.003


@pytest.mark.parametrize("init,check", [
    (ttf.embedding.RowInitializer("uniform", -1.0, 3.0), lambda r: r.min() >= -1 and r.max() <= 3 and abs(r.mean() - 1) < 0.05),
    (ttf.embedding.RowInitializer("normal", 2.0, 0.5), lambda r: abs(r.mean() - 2) < 0.02 and abs(r.std() - 0.5) < 0.02),
    ("zeros", lambda r: not r.any()),
    (tf.keras.initializers.Constant(0.25), lambda r: (r == 0.25).all()),
    (tf.keras.initializers.RandomUniform(0.0, 1.0), lambda r: r.min() >= 0 and abs(r.mean() - 0.5) < 0.02),
])
def test_initializers(init, check):
    rows = EmbeddingTable(8, init).lookup(np.arange(2000, dtype=np.int64), training=True).numpy()
    assert check(rows)


def test_find_never_inserts_and_reads_default_row():
    table = EmbeddingTable(4, "uniform", default_value=-1.5)
    ops().ttf_table_find_or_insert(table.resource_handle, [1, 2], dim=4)
    rows = table.lookup(tf.constant([2, 99, 1], tf.int64), training=False).numpy()
    assert int(table.size()) == 2
    np.testing.assert_array_equal(rows[1], [-1.5] * 4)
    assert (rows[[0, 2]] != -1.5).all()
    emb = ops().ttf_embedding_lookup(table.resource_handle, [[7, 8]], dim=4, training=False)[0]
    np.testing.assert_array_equal(emb.numpy(), np.full((1, 2, 4), -1.5, np.float32))
    assert int(table.size()) == 2


def test_ragged_lookup_combiners_match_reference():
    table = EmbeddingTable(4, "normal", seed=1)
    values = np.array([5, 6, 5, 7, 8, 8], np.int64)
    splits = np.array([0, 3, 3, 4, 6], np.int64)  # bags: [5,6,5], [], [7], [8,8]
    rows = dict(zip([5, 6, 7, 8], table.lookup(np.array([5, 6, 7, 8], np.int64), training=True).numpy()))
    for combiner in ("sum", "mean"):
        out = ops().ttf_embedding_lookup_ragged(table.resource_handle, values, splits, dim=4, combiner=combiner)[0]
        expected = []
        for b in range(4):
            bag = [rows[k] for k in values[splits[b]:splits[b + 1]]]
            total = np.sum(bag, axis=0) if bag else np.zeros(4, np.float32)
            expected.append(total / max(len(bag), 1) if combiner == "mean" else total)
        np.testing.assert_allclose(out.numpy(), np.array(expected), rtol=1e-6, atol=1e-7)  # float sum order


def test_admission_gives_a_row_after_min_count_updates():
    table = EmbeddingTable(2, "uniform", default_value=0.0, admission_min_count=3)
    h = table.resource_handle

    def sgd(keys, step):
        return int(ops().ttf_table_apply_sgd(h, keys, np.ones((len(keys), 2), np.float32), 0.5, step))

    for step in (1, 2):
        rows = table.lookup(tf.constant([10, 10, 11], tf.int64), training=True).numpy()
        np.testing.assert_array_equal(rows, np.zeros((3, 2)))  # default row, not admitted
        assert sgd([10, 11], step) == 0  # counted toward admission, gradient dropped
        assert int(table.size()) == 0
    assert int(table.stats().candidates) == 2
    # Third sighting: the lookup reads the row the update will insert (and inserts nothing).
    rows = table.lookup(tf.constant([10, 11, 12], tf.int64), training=True).numpy()
    assert rows[:2].all() and not rows[2].any() and int(table.size()) == 0
    assert sgd([10, 12], 3) == 1  # 10 admitted and updated; 12 a new candidate; 11 not seen
    np.testing.assert_allclose(table.lookup(tf.constant([10], tf.int64), training=False).numpy(), rows[:1] - 0.5)
    ex = sorted_export(table)
    np.testing.assert_array_equal(ex["meta"], [[3, 3]])
    np.testing.assert_array_equal(ex["candidate_keys"], [11, 12])
    np.testing.assert_array_equal(ex["candidate_meta"], [[2, 2], [1, 3]])


def test_eviction_by_last_seen_step_and_count():
    table = EmbeddingTable(2, "zeros")
    grads = lambda n: np.zeros((n, 2), np.float32)  # noqa: E731
    for step, keys in enumerate([[1, 2, 3], [2, 3], [3]], start=1):
        table.lookup(np.array(keys, np.int64), training=True)
        ops().ttf_table_apply_sgd(table.resource_handle, keys, grads(len(keys)), 0.1, step)
    ex = sorted_export(table)
    np.testing.assert_array_equal(ex["meta"], [[1, 1], [2, 2], [3, 3]])  # (count, last_seen)
    assert int(table.evict(min_last_seen=2, min_count=0)) == 1  # key 1, last seen at step 1
    assert sorted(sorted_export(table)["keys"]) == [2, 3]
    assert int(table.evict(min_last_seen=0, min_count=3)) == 1  # key 2 seen twice
    assert list(sorted_export(table)["keys"]) == [3]
    # An evicted key comes back with its initial row (pure function of seed and key).
    assert int(table.size()) == 1


def test_export_import_round_trip_is_bit_identical():
    src = EmbeddingTable(4, "normal", seed=5, admission_min_count=2)
    keys = np.arange(300, dtype=np.int64)
    for step in range(1, 4):
        batch = keys[: 100 * step]
        src.lookup(batch, training=True)
        ops().ttf_table_apply_adam(src.resource_handle, batch, np.full((len(batch), 4), 0.3, np.float32),
                                   0.01, 0.9, 0.999, 1e-7, step)
    dst = EmbeddingTable(4, "normal", seed=5, admission_min_count=2, num_shards=3)
    exported = src.export()
    dst.restore(exported)
    a, b = sorted_export(src), sorted_export(dst)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert a["optimizer"] == b"adam" and len(a["candidate_keys"]) == 100  # keys 200..299 seen once


def test_memory_per_key_within_one_and_a_half_raw_bytes():
    table = EmbeddingTable(16, "zeros")
    keys = np.arange(400_000, dtype=np.int64) * 31
    table.lookup(keys, training=True)
    ops().ttf_table_apply_adam(table.resource_handle, keys, np.zeros((len(keys), 16), np.float32),
                               0.001, 0.9, 0.999, 1e-7, 1)
    raw = 8 + 3 * 16 * 4
    per_key = int(table.stats().memory_bytes) / len(keys)
    assert per_key <= 1.5 * raw, per_key


@pytest.mark.slow
def test_table_grows_to_ten_million_keys():
    table = EmbeddingTable(16, "uniform", seed=1)
    batch = 1_000_000
    for start in range(0, 10_000_000, batch):
        keys = np.arange(start, start + batch, dtype=np.int64) * 2654435761
        table.lookup(keys, training=True)
        ops().ttf_table_apply_adam(table.resource_handle, keys, np.ones((batch, 16), np.float32),
                                   0.001, 0.9, 0.999, 1e-7, 1)  # step 1: every row moves by lr
    assert int(table.size()) == 10_000_000
    per_key = int(table.stats().memory_bytes) / 10_000_000
    assert per_key <= 1.5 * (8 + 3 * 16 * 4), per_key
    # Spot check: rows are the deterministic initial rows moved by one Adam step.
    probe = np.array([0, 4_999_999, 9_999_999], np.int64) * 2654435761
    fresh = EmbeddingTable(16, "uniform", seed=1).lookup(probe, training=True).numpy()
    moved = table.lookup(probe, training=False).numpy()
    np.testing.assert_allclose(fresh - moved, np.full_like(fresh, 0.001), rtol=1e-3)
