"""Capacity-capped tables: which ids LRU, LFU and TTL keep (against a Python reference of
the policy), the size bound under a stream of new ids, RSS falling after an eviction, and
the argument checks."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.embedding import EmbeddingTable

_names = itertools.count()


def sgd_step(table, keys, step):
    """One training update of `keys` (zero gradients: only the bookkeeping moves)."""
    keys = np.asarray(keys, np.int64)
    ops().ttf_table_apply_sgd(table.resource_handle, keys, np.zeros((len(keys), table.dim), np.float32), 0.1, step)


def exported_meta(table):
    ex = table.export()
    return {int(k): (int(c), int(s)) for k, (c, s) in zip(ex["keys"].numpy(), ex["meta"].numpy())}


class ReferenceTable:
    """The eviction rules of ops/embedding_ops.cc (TtfEmbeddingTable) for one lock shard."""

    def __init__(self, capacity, policy, ttl_steps):
        self.capacity, self.policy, self.ttl_steps = capacity, policy, ttl_steps
        self.meta = {}  # key -> [count, last_seen]
        self.next_sweep = 0

    def update(self, keys, step):
        for key in set(keys):
            count, _ = self.meta.get(key, (0, 0))
            self.meta[key] = (count + 1, step)
        if self.policy == "ttl" and step >= self.next_sweep:
            self.meta = {k: m for k, m in self.meta.items() if m[1] >= step - self.ttl_steps + 1}
            self.next_sweep = step + max(1, self.ttl_steps // 16)
        if self.capacity and len(self.meta) > self.capacity:
            target = self.capacity - self.capacity // 16
            order = (lambda k: (self.meta[k][0], self.meta[k][1], k)) if self.policy == "lfu" else (
                lambda k: (self.meta[k][1], self.meta[k][0], k))
            victims = sorted((k for k, m in self.meta.items() if m[1] < step), key=order)
            for key in victims[:len(self.meta) - target]:
                del self.meta[key]


@pytest.mark.parametrize("tiered", [False, True], ids=["dram", "dram+ssd"])
@pytest.mark.parametrize("policy,capacity,ttl_steps", [
    ("lru", 12, 0), ("lfu", 12, 0), ("ttl", 0, 3), ("ttl", 10, 4), ("lru", 40, 0)])
def test_policy_keeps_the_ids_the_reference_keeps(policy, capacity, ttl_steps, tiered, tmp_path):
    """Tiered: a DRAM budget of a few rows, so most rows live on disk; the capacity counts both
    tiers and an evicted row leaves whichever tier holds it (the export reads both)."""
    rng = np.random.default_rng(len(policy) + capacity + ttl_steps)
    tier = dict(dram_budget=4 * ttf.embedding.tier_row_bytes(2, 0) + 192, ssd_dir=str(tmp_path)) if tiered else {}
    table = EmbeddingTable(2, "zeros", num_shards=1, capacity=capacity, evict_policy=policy, ttl_steps=ttl_steps,
                           **tier)
    reference = ReferenceTable(capacity, policy, ttl_steps)
    hot = np.arange(5)  # a few ids seen often (LFU keeps them), many seen rarely
    disk_rows_seen = 0
    for step in range(1, 41):
        keys = np.concatenate([rng.choice(hot, 2), rng.integers(100, 160, int(rng.integers(1, 8)))])
        sgd_step(table, keys, step)
        reference.update(keys.tolist(), step)
        assert exported_meta(table) == reference.meta, f"step {step}"
        if tiered:
            disk_rows_seen = max(disk_rows_seen, table.tier_stats()["disk_rows"])
    assert len(reference.meta) < 2 * (capacity or 100)  # the policy did evict
    assert int(table.stats().rows_evicted) > 0
    if tiered:
        assert disk_rows_seen > 4, "the tier never held rows on disk"


def test_size_stays_within_capacity_plus_one_batch_on_a_stream_of_new_ids():
    capacity, batch = 2000, 500
    table = EmbeddingTable(4, num_shards=16, capacity=capacity, evict_policy="lru")
    inserted = 0
    for step in range(1, 41):
        keys = np.arange(step * batch, (step + 1) * batch, dtype=np.int64) * 7919  # all new ids
        sgd_step(table, keys, step)
        inserted += batch
        size = int(table.size())
        assert size <= capacity + batch, f"step {step}: {size} rows"
        assert int(table.stats().rows_evicted) == inserted - size
    assert size >= capacity * 3 // 4
    # The newest batch is always kept whole.
    assert set(keys.tolist()) <= set(table.export()["keys"].numpy().tolist())


def test_eviction_is_recorded_for_delta_checkpoints():
    table = EmbeddingTable(2, num_shards=1, capacity=3, evict_policy="lru")
    table.reset_deleted()
    for step, keys in enumerate([[1, 2, 3], [4], [5]], start=1):
        sgd_step(table, keys, step)
    assert sorted(table.export()["keys"].numpy().tolist()) == [3, 4, 5]
    assert ops().ttf_table_deleted_keys(table.resource_handle).numpy().tolist() == [1, 2]


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_rss_falls_after_an_eviction():
    table = EmbeddingTable(16, num_shards=4)
    keys = np.arange(600_000, dtype=np.int64)
    before = rss_bytes()
    for step, part in enumerate(np.array_split(keys, 6), start=1):  # Adam: 192 bytes of row per key
        ops().ttf_table_apply_adam(table.resource_handle, part, np.zeros((len(part), 16), np.float32), 0.01, 0.9,
                                   0.999, 1e-7, step)
    grown = rss_bytes() - before
    table_bytes = int(table.stats().memory_bytes)
    assert grown > table_bytes // 2  # the rows are resident
    assert int(table.evict(min_last_seen=6, min_count=0)) == 500_000  # keeps the last step's 100k ids
    assert int(table.stats().memory_bytes) < table_bytes // 3
    fallen = before + grown - rss_bytes()
    assert fallen > table_bytes // 2, f"RSS fell by {fallen} of a {table_bytes}-byte table"
    # The rows kept are intact and still train.
    assert int(table.size()) == 100_000
    got = table.lookup(keys[-3:], training=False).numpy()
    assert np.isfinite(got).all() and got.any()


@pytest.mark.parametrize("kwargs,match", [
    (dict(capacity=-1), "capacity must be an int >= 0"),
    (dict(evict_policy="fifo"), "evict_policy must be one of"),
    (dict(evict_policy="ttl"), r"ttl_steps \(0\) must be > 0 exactly when evict_policy is 'ttl'"),
    (dict(ttl_steps=5), r"ttl_steps \(5\) must be > 0 exactly when evict_policy is 'ttl'"),
])
def test_bad_eviction_arguments_raise_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ttf.DynamicEmbedding(4, **kwargs)


def test_table_op_refuses_ttl_steps_without_ttl_policy():
    with pytest.raises(tf.errors.InvalidArgumentError, match="ttl_steps .* must be > 0 exactly when"):
        ops().ttf_embedding_table(dim=2, ttl_steps=3, shared_name=f"evict_{next(_names)}")


def test_layer_config_round_trips_the_eviction_settings():
    layer = ttf.DynamicEmbedding(4, capacity=100, evict_policy="ttl", ttl_steps=7, name="capped")
    clone = ttf.DynamicEmbedding.from_config(layer.get_config())
    table = clone.tables[0]
    assert (table.capacity, table.evict_policy, table.ttl_steps) == (100, "ttl", 7)
