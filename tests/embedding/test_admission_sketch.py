"""Admission counted in a count-min sketch (admission_sketch_bytes): fixed candidate memory
on a stream of distinct ids, a measured false-admission rate within the stated bound, the
same admissions as exact counting (a Python reference) while the sketch is far from full,
candidates of a checkpoint folded into the sketch, and bad arguments refused."""
import numpy as np
import pytest
import tensorflow as tf

from ttf._ops import ops
from ttf.embedding import EmbeddingTable

DIM = 4
MIX = np.uint64(0x9E3779B97F4A7C15)


def sgd_step(table, keys, step):
    keys = np.asarray(keys, np.int64)
    ops().ttf_table_apply_sgd(table.resource_handle, keys, np.zeros((len(keys), DIM), np.float32), 0.1, step)


def distinct_batches(steps, batch):
    """Distinct ids spread over the id space (never repeated)."""
    for step in range(steps):
        ids = np.arange(step * batch, (step + 1) * batch, dtype=np.uint64)
        yield (ids * MIX).astype(np.int64)


def test_candidate_memory_stays_flat_on_a_stream_of_distinct_ids():
    sketch = EmbeddingTable(DIM, admission_min_count=50, admission_sketch_bytes=1 << 20)
    exact = EmbeddingTable(DIM, admission_min_count=50)
    memory = {"sketch": [], "exact": []}
    for step, keys in enumerate(distinct_batches(40, 2000), start=1):
        for name, table in (("sketch", sketch), ("exact", exact)):
            sgd_step(table, keys, step)
            memory[name].append(int(table.stats().memory_bytes))
    assert len(set(memory["sketch"])) == 1, memory["sketch"]  # not a byte more after 80,000 ids
    assert memory["sketch"][0] >= 1 << 20  # the sketch is its stated size
    assert int(sketch.stats().candidates) == 0 and int(sketch.size()) == 0
    assert memory["exact"][-1] > 2 * memory["exact"][0]  # the exact candidates grow with the stream
    assert int(exact.stats().candidates) == 80000


@pytest.mark.parametrize("min_count", [2, 3])
def test_false_admission_rate_is_within_the_stated_bound(min_count):
    """Every id is seen once, so every admission is false. Stated bound (docs/tiers.md):
    (1 / (4 * (min_count - 1)))^4 per id; the sketch here is small (64 KiB over 16 shards)
    so that the stream wraps its aging many times (200,000 ids, 4 KiB a shard)."""
    table = EmbeddingTable(DIM, admission_min_count=min_count, admission_sketch_bytes=64 << 10)
    distinct = 0
    for step, keys in enumerate(distinct_batches(100, 2000), start=1):
        sgd_step(table, keys, step)
        distinct += len(keys)
    rate = int(table.size()) / distinct
    bound = (1 / (4 * (min_count - 1))) ** 4
    print(f"min_count {min_count}: {int(table.size())} of {distinct} admitted, rate {rate:.2e}, bound {bound:.2e}")
    assert rate <= bound, (rate, bound)


def test_admits_as_exact_counting_while_the_sketch_is_far_from_full():
    """300 ids seen 3 times each in a shuffled order (900 sightings, under the 1024 that age a
    64 KiB one-shard sketch): admitted exactly at the 3rd sighting, as the Python reference
    counts, and every row read equals that of the exact-candidate table, bit for bit."""
    rng = np.random.default_rng(0)
    keys = np.repeat(np.arange(300, dtype=np.int64) * 7919 + 5, 3)
    rng.shuffle(keys)
    sketch = EmbeddingTable(DIM, "normal", seed=2, num_shards=1, admission_min_count=3,
                            admission_sketch_bytes=64 << 10)
    exact = EmbeddingTable(DIM, "normal", seed=2, num_shards=1, admission_min_count=3)
    seen, admitted = {}, set()
    for step, batch in enumerate(np.array_split(keys, 90), start=1):
        batch = np.unique(batch)
        reads = [ops().ttf_table_find(t.resource_handle, batch, dim=DIM, training=True).numpy()
                 for t in (sketch, exact)]
        np.testing.assert_array_equal(reads[0].view(np.uint32), reads[1].view(np.uint32))
        for t in (sketch, exact):
            sgd_step(t, batch, step)
        for key in batch.tolist():
            seen[key] = seen.get(key, 0) + 1
            if seen[key] >= 3:
                admitted.add(key)
        assert set(sketch.export()["keys"].numpy().tolist()) == admitted, f"step {step}"
    assert len(admitted) > 250  # (sightings in one batch count once)


def test_restored_candidates_count_in_the_sketch():
    exact = EmbeddingTable(DIM, admission_min_count=2)
    keys = np.arange(50, dtype=np.int64) * 3
    sgd_step(exact, keys, 1)  # every key a candidate seen once
    restored = EmbeddingTable(DIM, admission_min_count=2, admission_sketch_bytes=1 << 16)
    restored.restore(exact.export())
    assert int(restored.stats().candidates) == 0  # folded into the sketch
    sgd_step(restored, keys, 2)  # the second sighting admits them
    assert int(restored.size()) == 50


def test_bad_sketch_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="admission_sketch_bytes .* set admission_min_count"):
        EmbeddingTable(DIM, admission_sketch_bytes=1 << 16)
    with pytest.raises(ValueError, match="admission_sketch_bytes must be an int >= 0"):
        EmbeddingTable(DIM, admission_min_count=2, admission_sketch_bytes=-1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="admission_sketch_bytes .* set admission_min_count"):
        ops().ttf_embedding_table(dim=DIM, admission_sketch_bytes=1 << 16, shared_name="ttf_sketch_bad_1")
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least 512 bytes"):
        ops().ttf_embedding_table(dim=DIM, admission_min_count=2, admission_sketch_bytes=1000, num_shards=16,
                                  shared_name="ttf_sketch_bad_2")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"admission_sketch_bytes must be in \[0, 2\^40\]"):
        ops().ttf_embedding_table(dim=DIM, admission_min_count=2, admission_sketch_bytes=1 << 50,
                                  shared_name="ttf_sketch_bad_3")
