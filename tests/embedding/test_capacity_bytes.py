"""A capacity in bytes (issue 18): the row limit it gives (computed here from dim and the
optimizer's slots), which ids it keeps (those the equivalent row capacity keeps, and the
policy reference of test_table_eviction), the size and memory bound on a stream of new ids,
the errors on bad values, and the Keras config and .keras round trip."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.embedding.test_layers import toy_data, toy_model
from tests.embedding.test_table_eviction import ReferenceTable, exported_meta
from ttf._ops import ops
from ttf.embedding import EmbeddingTable

_names = itertools.count()


def row_bytes(dim, slots):
    """What a row counts against capacity_bytes, written out for the test: value and slots
    (float32), RowMeta (count, last_seen: 2 x int64) and an index entry (24 bytes)."""
    return 4 * dim * (1 + slots) + 16 + 24


def adam_step(table, keys, step):
    keys = np.asarray(keys, np.int64)
    ops().ttf_table_apply_adam(table.resource_handle, keys, np.zeros((len(keys), table.dim), np.float32), 0.01,
                               0.9, 0.999, 1e-7, step)


def sgd_step(table, keys, step):
    keys = np.asarray(keys, np.int64)
    ops().ttf_table_apply_sgd(table.resource_handle, keys, np.zeros((len(keys), table.dim), np.float32), 0.1, step)


def test_row_limit_is_the_share_over_the_row_bytes_and_follows_the_adam_width():
    """One new id per update: the size peaks exactly at the limit (one more evicts down to
    15/16 of it). Under SGD (no slots) a row of dim 4 is 56 bytes; Adam's first update makes it
    88, and the same bytes then hold fewer rows."""
    dim, capacity = 4, 8192
    table = EmbeddingTable(dim, num_shards=1, capacity="8K")
    assert (table.capacity, table.capacity_rows, table.capacity_bytes) == ("8K", 0, capacity)
    plain, wide = capacity // row_bytes(dim, 0), capacity // row_bytes(dim, 2)
    assert (plain, wide) == (146, 93)
    sizes = []
    for step in range(1, plain + 2):
        sgd_step(table, [step], step)
        sizes.append(int(table.size()))
    assert max(sizes) == plain and sizes[-1] == plain - plain // 16
    sizes = []
    for step, key in enumerate(range(1000, 1000 + wide + 1), start=plain + 2):
        adam_step(table, [key], step)
        sizes.append(int(table.size()))
    assert sizes[0] == wide - wide // 16  # the first Adam update widened the rows: over the new limit at once
    assert max(sizes) == wide
    assert int(table.stats().rows_evicted) == plain + 1 + wide + 1 - sizes[-1]


@pytest.mark.parametrize("num_shards", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_byte_capacity_keeps_the_ids_the_equivalent_row_capacity_keeps(policy, num_shards):
    """Same stream, Adam: a table of capacity rows R and one of capacity_bytes holding exactly
    R / num_shards rows per shard (plus less than a row of slack) keep the same ids with the
    same counts and steps; with one shard both equal the policy reference."""
    dim, rows_per_shard = 2, 9
    per_row = row_bytes(dim, 2)
    size = f"{num_shards * (rows_per_shard * per_row + per_row - 1)}B"
    by_bytes = EmbeddingTable(dim, "zeros", num_shards=num_shards, capacity=size, evict_policy=policy)
    assert by_bytes.capacity_bytes // num_shards // per_row == rows_per_shard
    by_rows = EmbeddingTable(dim, "zeros", num_shards=num_shards, capacity=rows_per_shard * num_shards,
                             evict_policy=policy)
    reference = ReferenceTable(rows_per_shard, policy, 0)
    rng = np.random.default_rng(num_shards + len(policy))
    for step in range(1, 41):
        keys = np.concatenate([rng.choice(np.arange(5), 2), rng.integers(100, 160, int(rng.integers(1, 8)))])
        adam_step(by_bytes, keys, step)
        adam_step(by_rows, keys, step)
        kept = exported_meta(by_bytes)
        assert kept == exported_meta(by_rows), f"step {step}"
        if num_shards == 1:
            reference.update(keys.tolist(), step)
            assert kept == reference.meta, f"step {step}"
    assert int(by_bytes.stats().rows_evicted) == int(by_rows.stats().rows_evicted) > 0


def test_size_and_memory_stay_bounded_on_a_stream_of_new_ids():
    """dim 8 with Adam (136 bytes a row), 4 MiB over 16 shards: 1927 rows a shard. After each
    update the size is within the rows that fit plus that update's new ids, and memory_bytes
    within the capacity plus what the rows' allocation adds: a partly used chunk of 1024 rows
    per shard and index slots up to 32 bytes a key where 24 are counted."""
    dim, shards, batch, capacity = 8, 16, 2000, 4 << 20
    per_row = row_bytes(dim, 2)
    fit = shards * (capacity // shards // per_row)
    table = EmbeddingTable(dim, num_shards=shards, capacity="4M")
    slack = shards * 1024 * (4 * 3 * dim + 16) + 8 * (fit + batch) + batch * per_row
    memory = []
    for step in range(1, 61):
        keys = np.arange(step * batch, (step + 1) * batch, dtype=np.int64) * 7919
        adam_step(table, keys, step)
        size = int(table.size())
        assert size <= fit + batch, f"step {step}: {size} rows, {fit} fit"
        memory.append(int(table.stats().memory_bytes))
        assert memory[-1] <= capacity + slack, f"step {step}: {memory[-1]} bytes"
    assert size >= fit * 3 // 4 and int(table.stats().rows_evicted) == 60 * batch - size
    later = memory[len(memory) // 2:]  # flat once full: evicted rows' ids are reused
    assert max(later) <= min(later) * 1.1, later


def test_table_op_refuses_bad_byte_capacities_with_clear_errors(tmp_path):
    def table(**attrs):
        return ops().ttf_embedding_table(dim=4, shared_name=f"bytes_{next(_names)}", **attrs)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"capacity \(10 rows\) and capacity_bytes \(4096\) "
                                                             r"both set: give the capacity in rows or in bytes"):
        table(capacity=10, capacity_bytes=4096)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"capacity_bytes \(800\) gives each of the 16 shards "
                                                             r"50 bytes, below one row of 56 bytes \(0 optimizer "
                                                             r"slot\(s\) at dim 4\): raise it to at least 896"):
        table(capacity_bytes=800)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"capacity_bytes \(1048576\) with dram_budget .*"
                                                             r"use capacity \(rows\) to bound both tiers"):
        table(capacity_bytes=1 << 20, dram_budget=1 << 20, ssd_dir=str(tmp_path))
    # Room for a plain row but not for one with Adam's slots: the first Adam update says so and
    # changes nothing.
    handle = table(capacity_bytes=16 * 60, num_shards=16)
    ops().ttf_table_find_or_insert(handle, np.arange(3, dtype=np.int64), dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"below one row of 88 bytes \(2 optimizer slot\(s\) "
                                                             r"at dim 4\): raise it to at least 1408"):
        ops().ttf_table_apply_adam(handle, np.arange(3, dtype=np.int64), np.zeros((3, 4), np.float32), 0.01, 0.9,
                                   0.999, 1e-7, 1)
    assert int(ops().ttf_table_size(handle)) == 3
    # Reopening a shared_name with another byte capacity is refused, naming both configs.
    name = f"bytes_{next(_names)}"
    ops().ttf_embedding_table(dim=4, capacity_bytes=1 << 20, shared_name=name)
    with pytest.raises(tf.errors.InvalidArgumentError, match="capacity_bytes=1048576.*capacity_bytes=2097152"):
        ops().ttf_embedding_table(dim=4, capacity_bytes=2 << 20, shared_name=name)


@pytest.mark.parametrize("kwargs,match", [
    (dict(capacity="512X"), r"capacity '512X': size must be a number with an optional unit"),
    (dict(capacity="1000"), r"capacity must be an int >= 0 \(rows; 0: unbounded\) or a size with a unit"),
    (dict(capacity="-1M"), r"capacity '-1M': size must be >= 0"),
    (dict(capacity="xM"), r"capacity 'xM': size must be a number"),
    (dict(capacity=2.5), r"capacity must be an int >= 0"),
    (dict(capacity="0.5K"), r"capacity '0.5K' gives each of the 16 lock shards 32 bytes, below one row \(56 bytes"),
    (dict(capacity="1M", dram_budget=1 << 20, ssd_dir="/tmp"),
     r"capacity '1M' \(bytes\) with dram_budget \(1048576\): .* give capacity in rows"),
])
def test_bad_capacities_raise_one_line_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match) as raised:
        ttf.DynamicEmbedding(4, **kwargs)
    assert "\n" not in str(raised.value)


def test_parse_capacity():
    parse = ttf.embedding.parse_capacity
    assert parse(0) == (0, 0) and parse(1000) == (1000, 0) and parse(np.int64(7)) == (7, 0)
    assert parse("512M") == (0, 512 << 20) and parse("2G") == (0, 2 << 30) and parse("1.5G") == (0, 3 << 29)
    assert parse(" 64k ") == (0, 64 << 10) and parse("1GiB") == (0, 1 << 30)


def test_layer_config_keras_file_and_saved_model_keep_the_byte_capacity(tmp_path):
    layer = ttf.DynamicEmbedding(4, capacity="4M", evict_policy="lfu", name="capped_bytes")
    clone = ttf.DynamicEmbedding.from_config(layer.get_config())
    table = clone.tables[0]
    assert (table.capacity, table.capacity_bytes, table.evict_policy) == ("4M", 4 << 20, "lfu")
    model, emb = toy_model(capacity="1.5M")
    model.compile(optimizer=ttf.optimizers.Adam(0.01), loss="binary_crossentropy")
    ids, labels = toy_data(256)
    model.fit(ids, labels, epochs=1, batch_size=128, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    emb2 = next(layer for layer in loaded.layers if isinstance(layer, ttf.DynamicEmbedding))
    assert (emb2.tables[0].capacity, emb2.tables[0].capacity_bytes) == ("1.5M", 3 << 19)
    assert int(emb2.tables[0].size()) == int(emb.tables[0].size()) > 0
    # A SavedModel (ttf imported) revives the table with its byte capacity.
    module = tf.Module()
    module.table = EmbeddingTable(4, capacity="4M", evict_policy="lfu")
    tf.saved_model.save(module, str(tmp_path / "sm"))
    revived = tf.saved_model.load(str(tmp_path / "sm")).table
    assert (revived.capacity, revived.capacity_bytes, revived.evict_policy) == ("4M", 4 << 20, "lfu")
