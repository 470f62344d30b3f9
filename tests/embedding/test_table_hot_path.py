"""The lookup and apply hot paths (issue 18 item 5) against plain NumPy references: the
de-dup (its prefetching loop at batch sizes around the prefetch distance, duplicates, empty
batches), present and absent keys, the index under insert/remove churn, and the vectorized
Adam update at a dim that is and one that is not a multiple of the vector width, and the
inference lookup that probes each id with no de-dup (EmbeddingTable::FindEach)."""
import numpy as np
import pytest
import tensorflow as tf

import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
from ttf._ops import ops
from ttf.embedding import EmbeddingTable, tier_row_bytes

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(keys):
    """SplitMix64's finaliser in NumPy (uint64 arithmetic wraps), as the kernels hash keys."""
    x = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) & M64


def reference_grouping(ids, num_shards):
    """Distinct keys in first-seen order, then stably by lock shard ((hash >> 40) % shards);
    inverse maps each id to its key's place."""
    flat = ids.ravel()
    _, first = np.unique(flat, return_index=True)
    distinct = flat[np.sort(first)]
    shard = (mix64(distinct) >> np.uint64(40)) % np.uint64(num_shards)
    unique_keys = distinct[np.argsort(shard, kind="stable")]
    place = {k: i for i, k in enumerate(unique_keys)}
    return unique_keys, np.array([place[k] for k in flat], np.int32)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 33, 5000])
def test_dedup_order_and_inverse_match_reference(n):
    # Sizes below, at and above the de-dup's 16-key prefetch distance; a pool of 40 keys,
    # so larger batches are mostly duplicates.
    rng = np.random.default_rng(n)
    pool = rng.integers(-(1 << 62), 1 << 62, size=40)
    ids = pool[rng.integers(0, 40, size=n)].astype(np.int64)
    table = EmbeddingTable(8, "normal", seed=4, default_value=0.25, num_shards=4)
    ops().ttf_table_find_or_insert(table.resource_handle, pool[::2].astype(np.int64), dim=8)  # half present
    emb, unique_keys, inverse = ops().ttf_embedding_lookup(table.resource_handle, ids, dim=8, training=False)
    expected_keys, expected_inverse = reference_grouping(ids, 4)
    np.testing.assert_array_equal(unique_keys.numpy(), expected_keys)
    np.testing.assert_array_equal(inverse.numpy(), expected_inverse)
    # Rows: present keys their own row (a pure function of seed and key), absent the default.
    ex = {k: v.numpy() for k, v in table.export().items()}
    rows = dict(zip(ex["keys"], ex["values"]))
    expected = np.array([rows.get(k, np.full(8, 0.25, np.float32)) for k in ids]).reshape(n, 8)
    np.testing.assert_array_equal(emb.numpy(), expected)  # exact: copies only
    np.testing.assert_array_equal(table.lookup(ids, training=False).numpy(), expected)


@pytest.mark.parametrize("dim", [5, 16])
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 255, 256, 257, 3000])
def test_inference_lookup_without_dedup_matches_reference(n, dim):
    # An inference lookup in a graph that reads only the embeddings (a layer at inference) and
    # TtfTableFind at inference probe each id straight into its output (FindEach: blocks of 256
    # ids, index slots prefetched 32 ids ahead): sizes around both, 2-D ids, duplicates, absent
    # keys (the default row), 3 lock shards (not a power of two), a dim with and one without
    # a fixed-size row copy. Reading the unique keys too takes the de-dup path: same rows.
    rng = np.random.default_rng(n + dim)
    pool = rng.integers(-(1 << 62), 1 << 62, size=600)
    ids = pool[rng.integers(0, 600, size=(n, 2))].astype(np.int64)
    table = EmbeddingTable(dim, "normal", seed=6, default_value=-0.5, num_shards=3)
    h = table.resource_handle
    ops().ttf_table_find_or_insert(h, pool[::3].astype(np.int64), dim=dim)
    ex = {k: v.numpy() for k, v in table.export().items()}
    rows = dict(zip(ex["keys"], ex["values"]))
    expected = np.array([rows.get(k, np.full(dim, -0.5, np.float32)) for k in ids.ravel()]).reshape(n, 2, dim)
    each = tf.function(lambda x: ops().ttf_embedding_lookup(h, x, dim=dim, training=False)[0])
    with_keys = tf.function(lambda x: ops().ttf_embedding_lookup(h, x, dim=dim, training=False)[:2])
    np.testing.assert_array_equal(each(ids).numpy(), expected)  # exact: copies only
    emb, unique_keys = with_keys(ids)
    np.testing.assert_array_equal(emb.numpy(), expected)
    assert sorted(unique_keys.numpy().tolist()) == sorted(set(ids.ravel().tolist()))
    np.testing.assert_array_equal(table.lookup(ids.ravel(), training=False).numpy(), expected.reshape(-1, dim))


def test_tiered_inference_lookup_in_a_graph_reads_disk_rows(tmp_path):
    # A tiered table's inference lookup probes each id in DRAM (FindEach), then looks the ids
    # without a DRAM row up per shard (Find: disk reads): its rows on disk must come back, not
    # the default row a DRAM-only probe would give. Ids in several 4,096-id lock spans,
    # duplicates (on disk and in DRAM) and absent keys. The tier counters: DRAM hits count ids,
    # disk hits the distinct keys read (a repeated cold id is read once).
    table = EmbeddingTable(4, num_shards=3, default_value=-1.0, dram_budget=40 * tier_row_bytes(4, 2),
                           ssd_dir=str(tmp_path))
    h = table.resource_handle
    keys = np.arange(1, 2001, dtype=np.int64) * 7
    grads = np.tile(np.arange(1, 2001, dtype=np.float32)[:, None], (1, 4))
    for step, at in enumerate(range(0, 2000, 100), start=1):  # rows not in an update go to disk
        ops().ttf_table_apply_adam(h, keys[at:at + 100], grads[at:at + 100], 0.1, 0.9, 0.999, 1e-7, step)
    stats = table.tier_stats()
    assert stats["disk_rows"] > 1500 and stats["dram_rows"] > 0, stats
    eager = ops().ttf_embedding_lookup(h, keys, dim=4, training=False)[0].numpy()  # the de-dup path
    assert (eager != -1.0).all()
    rows = dict(zip(keys.tolist(), eager))
    rng = np.random.default_rng(0)
    ids = np.concatenate([keys, keys + 3])[rng.integers(0, 4000, size=9000)]  # keys + 3: absent
    expected = np.array([rows.get(k, np.full(4, -1.0, np.float32)) for k in ids.tolist()])
    each = tf.function(lambda x: ops().ttf_embedding_lookup(h, x, dim=4, training=False)[0])
    before = table.tier_stats()
    np.testing.assert_array_equal(each(ids).numpy(), expected)
    after = table.tier_stats()
    found = ids[np.isin(ids, keys)]
    hits = (after["dram_hits"] - before["dram_hits"]) + (after["disk_hits"] - before["disk_hits"])
    assert len(np.unique(found)) <= hits < len(found)
    assert after["dram_hits"] > before["dram_hits"] and after["disk_hits"] > before["disk_hits"]
    before = table.tier_stats()
    each(np.unique(ids))  # distinct ids: every one counted once, in one tier
    after = table.tier_stats()
    hits = (after["dram_hits"] - before["dram_hits"]) + (after["disk_hits"] - before["disk_hits"])
    assert hits == len(np.unique(found))
    np.testing.assert_array_equal(table.lookup(ids, training=False).numpy(), expected)


@pytest.mark.parametrize("dim", [5, 16])
def test_embedding_grad_sums_per_key_like_a_zero_filled_sum(dim):
    # TtfEmbeddingGrad (and the apply's duplicate-key sum, the same helper) start each key's sum
    # at 0.0f + its first row, not from a zero-filled buffer: the bits must be those of a sum
    # from zeros in input order (-0.0 gradients included), and a key no id names gets zeros.
    rng = np.random.default_rng(dim)
    u, n = 300, 4000
    inverse = rng.integers(0, u - 20, size=n).astype(np.int32)  # the last 20 keys named by no id
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    grads[rng.integers(0, n, size=200), rng.integers(0, dim, size=200)] = -0.0
    expected = np.zeros((u, dim), np.float32)
    for p in range(n):  # in input order, float32 as the kernel adds
        expected[inverse[p]] += grads[p]
    got = ops().ttf_embedding_grad(grads.reshape(n // 4, 4, dim), inverse, np.arange(u, dtype=np.int64)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))  # bit for bit
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"inverse_index\[7\] = 300 is outside \[0, 300\)"):
        bad = inverse.copy()
        bad[7] = u
        ops().ttf_embedding_grad(grads, bad, np.arange(u, dtype=np.int64))


def test_index_churn_keeps_every_key_reachable():
    # One lock shard, so every key shares one index: removals (backward-shift deletion of the
    # 12-byte slots), re-insertions and growth, then every key checked against a reference.
    rng = np.random.default_rng(5)
    keys = rng.choice(np.arange(-(1 << 40), 1 << 40, 7919, dtype=np.int64), size=6000, replace=False)
    table = EmbeddingTable(4, "uniform", seed=9, default_value=-1.0, num_shards=1)
    fresh = EmbeddingTable(4, "uniform", seed=9, num_shards=1)  # the reference rows: (seed, key) only
    h = table.resource_handle
    ops().ttf_table_find_or_insert(h, keys[:3000], dim=4)
    removed = rng.choice(keys[:3000], size=1500, replace=False)
    assert int(ops().ttf_table_remove(h, removed)) == 1500
    ops().ttf_table_find_or_insert(h, keys[3000:], dim=4)  # grows the index past its old size
    ops().ttf_table_find_or_insert(h, removed[:500], dim=4)  # back in, new row ids
    present = np.setdiff1d(keys, removed[500:])
    assert int(table.size()) == len(present)
    got = table.lookup(keys, training=False).numpy()
    want = ops().ttf_table_find_or_insert(fresh.resource_handle, keys, dim=4).numpy()
    gone = np.isin(keys, removed[500:])
    np.testing.assert_array_equal(got[~gone], want[~gone])
    np.testing.assert_array_equal(got[gone], np.full((gone.sum(), 4), -1.0, np.float32))


@pytest.mark.parametrize("dim", [5, 16])
def test_adam_apply_matches_float32_reference(dim):
    # The update loop vectorizes (4 floats at a time, plus a remainder at dim 5): the same
    # float32 operations in the same order as a NumPy reference, so equal to 1e-6 (exact on
    # x86-64; a target that fuses multiply-adds may differ in the last bit).
    rng = np.random.default_rng(dim)
    lr, b1, b2, eps = np.float32(0.01), np.float32(0.9), np.float32(0.999), np.float32(1e-7)
    table = EmbeddingTable(dim, "normal", seed=1)
    h = table.resource_handle
    pool = np.arange(50, dtype=np.int64) * 1_000_003
    ref = {}
    for step in range(1, 4):
        keys = pool[rng.integers(0, 50, size=70)]  # duplicates: summed before the update
        grads = rng.normal(size=(70, dim)).astype(np.float32)
        rows = table.lookup(keys, training=True).numpy()  # new keys read their initial rows
        ops().ttf_table_apply_adam(h, keys, grads, lr, b1, b2, eps, step)
        t = np.float32(step)
        alpha = lr * np.sqrt(np.float32(1) - b2 ** t) / (np.float32(1) - b1 ** t)
        summed = {}
        for key, row, g in zip(keys, rows, grads):
            ref.setdefault(key, [row.copy(), np.zeros(dim, np.float32), np.zeros(dim, np.float32)])
            summed[key] = summed.get(key, np.zeros(dim, np.float32)) + g
        for key, g in summed.items():
            value, m, v = ref[key]
            m += (g - m) * (np.float32(1) - b1)
            v += (g * g - v) * (np.float32(1) - b2)
            value -= (m * alpha) / (np.sqrt(v) + eps)
    ex = {k: v.numpy() for k, v in table.export().items()}
    assert len(ex["keys"]) == len(ref)
    for key, values in zip(ex["keys"], ex["values"]):
        np.testing.assert_allclose(values, np.concatenate(ref[key]), rtol=1e-6, atol=0, err_msg=f"key {key}")


@pytest.mark.parametrize("case", ["its own unique keys", "reversed", "another lookup in between", "each key twice"])
def test_apply_after_a_training_lookup_updates_as_an_apply_alone(case):
    # The apply handed a training lookup's unique keys unchanged reuses that lookup's grouping
    # (LastGrouping: no second de-dup); any other keys group their own. Every case must leave
    # the rows bit for bit as applies with no lookup before them.
    dim, lr, b1, b2, eps = 16, np.float32(0.01), np.float32(0.9), np.float32(0.999), np.float32(1e-7)
    rng = np.random.default_rng(7)
    pool = np.arange(300, dtype=np.int64) * 7_919
    ids = pool[rng.integers(0, 300, size=1000)]
    grads_per_id = rng.normal(size=(1000, dim)).astype(np.float32)

    def applies(table, keys, grads):  # the same update twice (the second at step 2, nothing kept)
        for step in (1, 2):
            ops().ttf_table_apply_adam(table.resource_handle, keys, grads, lr, b1, b2, eps, step)

    table = EmbeddingTable(dim, "normal", seed=1, num_shards=4)
    _, unique, inverse = ops().ttf_embedding_lookup(table.resource_handle, ids, dim=dim, training=True)
    unique_grads = ops().ttf_embedding_grad(grads_per_id, inverse, unique)
    keys, grads = unique.numpy(), unique_grads.numpy()
    if case == "reversed":
        keys, grads = keys[::-1].copy(), grads[::-1].copy()
    elif case == "another lookup in between":
        ops().ttf_embedding_lookup(table.resource_handle, pool[:50], dim=dim, training=True)
    elif case == "each key twice":  # halves of each row: summed back exactly
        keys, grads = np.concatenate([keys, keys]), np.concatenate([grads / 2, grads / 2])
    applies(table, keys, grads)

    alone = EmbeddingTable(dim, "normal", seed=1, num_shards=4)
    applies(alone, unique.numpy(), unique_grads.numpy())
    got, want = ({k: v.numpy() for k, v in t.export().items()} for t in (table, alone))
    order_got, order_want = np.argsort(got["keys"]), np.argsort(want["keys"])
    np.testing.assert_array_equal(got["keys"][order_got], want["keys"][order_want])
    np.testing.assert_array_equal(got["values"][order_got], want["values"][order_want])


def test_empty_batches():
    table = EmbeddingTable(16, seed=2)
    h = table.resource_handle
    empty = np.zeros([0], np.int64)
    emb, unique_keys, inverse = ops().ttf_embedding_lookup(h, np.zeros([0, 26], np.int64), dim=16, training=True)
    assert emb.shape == (0, 26, 16) and unique_keys.shape == (0,) and inverse.shape == (0,)
    assert table.lookup(empty, training=False).shape == (0, 16)
    assert int(ops().ttf_table_apply_adam(h, empty, np.zeros([0, 16], np.float32), 0.1, 0.9, 0.999, 1e-7, 1)) == 0
    assert int(table.size()) == 0


def test_batches_split_over_the_pool_match_reference():
    # Enough keys that the kernels split their work into blocks on TensorFlow's pool (with two
    # or more pool threads: ForEachShard from 2 x 8192 distinct keys, the copy back from
    # 2 x 65536 ids): every shard handled exactly once, every position written.
    rng = np.random.default_rng(7)
    dim = 4
    table = EmbeddingTable(dim, "normal", seed=3, default_value=-1.0, num_shards=16)
    h = table.resource_handle
    pool = rng.permutation(np.unique(rng.integers(-(1 << 62), 1 << 62, size=41_000)))[:40_000]
    present = pool[:30_000]
    inserted = ops().ttf_table_find_or_insert(h, present, dim=dim).numpy()  # 30k distinct keys at once
    ids = pool[rng.integers(0, 40_000, size=150_000)]
    emb, unique_keys, inverse = ops().ttf_embedding_lookup(h, ids, dim=dim, training=False)
    ex = {k: v.numpy() for k, v in table.export().items()}
    rows = dict(zip(ex["keys"], ex["values"]))
    assert len(rows) == 30_000
    np.testing.assert_array_equal(np.array([rows[k] for k in present]), inserted)
    expected = np.array([rows.get(k, np.full(dim, -1.0, np.float32)) for k in ids])
    np.testing.assert_array_equal(emb.numpy(), expected)
    np.testing.assert_array_equal(unique_keys.numpy()[inverse.numpy()], ids)
    # An update of 20k distinct keys (SGD: exact in float32), a quarter of them new.
    keys = np.concatenate([present[:15_000], pool[30_000:35_000]])
    grads = rng.normal(size=(len(keys), dim)).astype(np.float32)
    before = table.lookup(keys, training=True).numpy()
    assert int(ops().ttf_table_apply_sgd(h, keys, grads, np.float32(0.5), 1)) == len(keys)
    np.testing.assert_array_equal(table.lookup(keys, training=False).numpy(), before - np.float32(0.5) * grads)
    assert int(table.size()) == 35_000
