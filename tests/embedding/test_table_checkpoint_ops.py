"""The checkpoint ops against NumPy references: partitioned import (mixing-hash routing),
merge import, delta export (rows last seen after a step + deleted keys), remove, and the
admission-candidate bound."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
from ttf._ops import ops

_names = itertools.count()
FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")


def new_table(dim=4, **attrs):
    return ops().ttf_embedding_table(dim=dim, shared_name=f"ckpt_ops_{next(_names)}", **attrs)


def export(h, op=None, *args, **attrs):
    out = (op or ops().ttf_table_export)(h, *args, **attrs)
    names = FIELDS + (("deleted_keys",) if len(out) > 8 else ())
    ex = {name: t.numpy() for name, t in zip(names, out)}
    order = np.argsort(ex["keys"], kind="stable")
    for name in ("keys", "values", "meta"):
        ex[name] = ex[name][order]
    order = np.argsort(ex["candidate_keys"], kind="stable")
    for name in ("candidate_keys", "candidate_meta"):
        ex[name] = ex[name][order]
    return ex


def trained_table(keys, steps=3, dim=4, admission=0, **attrs):
    """A table trained with Adam for a few steps on overlapping batches of `keys`."""
    h = new_table(dim, initializer="normal", init_b=0.5, seed=7, admission_min_count=admission, **attrs)
    rng = np.random.default_rng(1)
    for step in range(1, steps + 1):
        batch = keys[rng.random(len(keys)) < 0.7]
        ops().ttf_table_find(h, batch, dim=dim, training=True)
        ops().ttf_table_apply_adam(h, batch, rng.normal(size=(len(batch), dim)).astype(np.float32),
                                   0.01, 0.9, 0.999, 1e-7, step)
    return h


def partition_of(key, n):
    """Reference of the routing rule: low 32 bits of SplitMix64(key) mod n, in plain Python ints."""
    mask = (1 << 64) - 1
    x = (key + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return ((x ^ (x >> 31)) & 0xFFFFFFFF) % n


def import_(h, ex, **attrs):
    return ops().ttf_table_import(h, *(ex[f] for f in FIELDS), **attrs)


@pytest.mark.parametrize("num_partitions", [1, 2, 3, 5])
def test_partitioned_import_takes_exactly_the_keys_shard_of_routes(num_partitions):
    keys = np.concatenate([np.arange(-40, 40), [-(1 << 62), (1 << 62) + 3, -7919 * 7919]]).astype(np.int64)
    src = export(trained_table(keys, admission=2))
    assert len(src["keys"]) and len(src["candidate_keys"])
    restored_keys = []
    for p in range(num_partitions):
        dst = new_table(4, initializer="normal", init_b=0.5, seed=7, admission_min_count=2, num_shards=3)
        import_(dst, src, num_partitions=num_partitions, partition=p)
        got = export(dst)
        want = np.array([partition_of(k, num_partitions) == p for k in src["keys"].tolist()])
        np.testing.assert_array_equal(got["keys"], src["keys"][want])
        np.testing.assert_array_equal(got["values"], src["values"][want])  # bit-identical rows and slots
        np.testing.assert_array_equal(got["meta"], src["meta"][want])
        want_c = np.array([partition_of(k, num_partitions) == p for k in src["candidate_keys"].tolist()], bool)
        np.testing.assert_array_equal(got["candidate_keys"], src["candidate_keys"][want_c])
        np.testing.assert_array_equal(got["candidate_meta"], src["candidate_meta"][want_c])
        assert got["optimizer"] == b"adam" and got["step"] == src["step"]
        np.testing.assert_array_equal(
            got["keys"], tf.boolean_mask(src["keys"], ttf.embedding.shard_of(src["keys"], num_partitions) == p).numpy())
        restored_keys += list(got["keys"])
    assert sorted(restored_keys) == sorted(src["keys"])  # every key in exactly one partition


def test_merge_import_upserts_and_keeps_other_rows():
    h = trained_table(np.arange(0, 60, dtype=np.int64), admission=2)
    live = export(h)
    other = export(trained_table(np.arange(40, 100, dtype=np.int64), steps=5, admission=2))
    import_(h, other, merge=True)
    got = export(h)
    # Reference: a dict update of key -> (row, meta); candidates that got a row are dropped.
    ref = {k: (v, m) for k, v, m in zip(live["keys"], live["values"], live["meta"])}
    ref.update({k: (v, m) for k, v, m in zip(other["keys"], other["values"], other["meta"])})
    assert list(got["keys"]) == sorted(ref)
    np.testing.assert_array_equal(got["values"], np.array([ref[k][0] for k in sorted(ref)]))
    np.testing.assert_array_equal(got["meta"], np.array([ref[k][1] for k in sorted(ref)]))
    cand = {k: m for k, m in zip(live["candidate_keys"], live["candidate_meta"]) if k not in ref}
    cand.update({k: m for k, m in zip(other["candidate_keys"], other["candidate_meta"]) if k not in ref})
    assert list(got["candidate_keys"]) == sorted(cand)
    assert got["step"] == max(live["step"], other["step"])
    # Merging another optimizer's slots is refused.
    sgd = new_table(4)
    ops().ttf_table_apply_sgd(sgd, [1], np.ones((1, 4), np.float32), 0.1, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot merge rows with 2 slot"):
        import_(sgd, other, merge=True)


def test_merge_into_a_table_without_slots_takes_the_slot_layout():
    src = export(trained_table(np.arange(10, dtype=np.int64)))
    h = new_table(4, initializer="zeros")
    ops().ttf_table_find_or_insert(h, [100], dim=4)
    import_(h, src, merge=True)
    got = export(h)
    assert got["optimizer"] == b"adam" and got["values"].shape[1] == 12
    np.testing.assert_array_equal(got["values"][-1], np.zeros(12))  # key 100: zeros, slots from slot_init
    np.testing.assert_array_equal(got["values"][:-1], src["values"])


def test_delta_export_restores_bit_identical_table():
    """Full export, then rounds of training/eviction with delta exports; the full export
    plus the deltas (remove deleted, merge rows) equals the live table."""
    keys = np.arange(0, 400, dtype=np.int64) * 7
    h = new_table(4, initializer="normal", init_b=0.5, seed=3, admission_min_count=2)
    rng = np.random.default_rng(5)
    step = 0

    def train(n_steps):
        nonlocal step
        for _ in range(n_steps):
            step += 1
            batch = rng.choice(keys, 60, replace=False)
            ops().ttf_table_find_or_insert(h, batch, dim=4)
            ops().ttf_table_apply_adagrad(h, batch, rng.normal(size=(60, 4)).astype(np.float32), 0.1, 1e-7, step)

    train(5)
    full = export(h, None, reset_deleted=True)
    saved_step = int(full["step"])
    deltas = []
    for round_ in range(4):
        train(3)
        # Lookups after the save (same step), then eviction: both must reach the delta.
        ops().ttf_table_find_or_insert(h, rng.choice(keys, 20), dim=4)
        ops().ttf_table_evict(h, step - 4, 0)
        delta = export(h, ops().ttf_table_export_delta, saved_step - 1)
        assert delta["deleted_keys"].tolist() == sorted(set(delta["deleted_keys"].tolist()))
        assert len(delta["keys"]) < len(export(h)["keys"]) or round_ == 0
        deltas.append(delta)
        saved_step = int(delta["step"])
    assert sum(len(d["deleted_keys"]) for d in deltas) > 0
    restored = new_table(4, initializer="normal", init_b=0.5, seed=3, admission_min_count=2, num_shards=5)
    import_(restored, full)
    for delta in deltas:
        ops().ttf_table_remove(restored, delta["deleted_keys"])
        import_(restored, delta, merge=True)
    live, got = export(h), export(restored)
    for name in FIELDS:
        np.testing.assert_array_equal(got[name], live[name], err_msg=name)


def test_delta_export_selects_rows_seen_after_the_step():
    h = new_table(2, initializer="zeros")
    for step, batch in enumerate([[1, 2, 3], [2, 3], [3, 4]], start=1):
        ops().ttf_table_find_or_insert(h, batch, dim=2)
        ops().ttf_table_apply_sgd(h, batch, np.ones((len(batch), 2), np.float32), 0.5, step)
    for since, want in [(-1, [1, 2, 3, 4]), (0, [1, 2, 3, 4]), (1, [2, 3, 4]), (2, [3, 4]), (3, [])]:
        got = export(h, ops().ttf_table_export_delta, since)
        assert got["keys"].tolist() == want, since
        assert got["values"].shape == (len(want), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="since_step must be >= -1"):
        ops().ttf_table_export_delta(h, -5)


def test_deleted_keys_record_starts_at_reset_and_counts_every_removal():
    h = new_table(2, admission_min_count=2, max_candidates=4, num_shards=1)
    ops().ttf_table_find_or_insert(h, [1, 2, 3], dim=2)  # candidates only
    ops().ttf_table_evict(h, 10, 0)
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == []  # off until the first reset
    ops().ttf_table_deleted_keys(h, reset=True)
    ops().ttf_table_find_or_insert(h, [5, 6], dim=2)  # candidates
    ops().ttf_table_find_or_insert(h, [5, 6, 7], dim=2)  # 5, 6 admitted (seen twice), 7 a candidate
    assert int(ops().ttf_table_remove(h, [5, 7, 99])) == 1  # row 5, candidate 7, absent 99
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == [5, 7]
    ops().ttf_table_find_or_insert(h, [10, 11, 12, 13, 14], dim=2)  # 5 candidates > max 4
    deleted = ops().ttf_table_deleted_keys(h, reset=True).numpy().tolist()
    assert deleted[:2] == [5, 7] and len(deleted) == 3 and deleted[2] in (10, 11, 12, 13)
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == []


def test_admission_candidates_are_bounded_oldest_dropped_first():
    h = new_table(2, admission_min_count=3, max_candidates=64, num_shards=1)
    for step in range(1, 21):  # 20 batches of 50 new keys seen once: 1000 candidates offered
        ops().ttf_table_find_or_insert(h, np.arange(step * 1000, step * 1000 + 50, dtype=np.int64), dim=2)
        ops().ttf_table_apply_sgd(h, [7], np.zeros((1, 2), np.float32), 0.1, step)  # key 7 updated at every step
    stats = ops().ttf_table_stats(h)
    assert int(stats.candidates) <= 64
    assert int(stats.candidates) + int(stats.candidates_dropped) == 1000  # every batch key kept or counted
    ex = export(h)
    assert ex["keys"].tolist() == [7]  # seen at every step: never dropped, admitted at its third sighting
    # The survivors are the most recently seen: the last batch's keys.
    newest = set(range(20000, 20050))
    assert newest <= set(ex["candidate_keys"].tolist())


@pytest.mark.parametrize("merge", [False, True])
def test_import_refuses_non_finite_rows_naming_how_many_and_where(merge):
    src = export(trained_table(np.arange(20, dtype=np.int64)))
    h = trained_table(np.arange(100, 110, dtype=np.int64))
    before = export(h)
    bad = dict(src, values=src["values"].copy())
    bad["values"][3, 1] = np.nan  # a value
    bad["values"][7, -1] = np.inf  # an optimizer slot (Adam's v)
    key = src["keys"][3]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"values hold NaN or Inf in 2 of {len(src['keys'])} row\(s\) .*the first at position 3 "
                             rf"\(key {key}\): imported rows must be finite"):
        import_(h, bad, merge=merge)
    after = export(h)  # refused whole: the table is as it was
    for name in ("keys", "values", "meta", "candidate_keys"):
        np.testing.assert_array_equal(after[name], before[name])


def test_publish_and_checkpoint_records_of_deleted_keys_are_independent():
    """Each reader of the change log (record=0, ttf's checkpoints; record=1, its publisher) has
    its own record of deleted keys,
    started and reset only by itself: a publish never clears what the next delta checkpoint
    must carry, and the reverse."""
    h = new_table(2, num_shards=2)
    ops().ttf_table_find_or_insert(h, [1, 2, 3, 4], dim=2)
    ops().ttf_table_deleted_keys(h, reset=True)  # the checkpoint's record starts
    ops().ttf_table_remove(h, [1])
    assert ops().ttf_table_deleted_keys(h, record=1).numpy().tolist() == []  # off until its own reset
    ops().ttf_table_export(h, reset_deleted=True, record=1)  # a base starts the publish record
    ops().ttf_table_remove(h, [2])
    published = ops().ttf_table_export_delta(h, -1, reset_deleted=True, record=1)[8]
    assert published.numpy().tolist() == [2]
    ops().ttf_table_remove(h, [3])
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == [1, 2, 3]  # the checkpoint's: untouched
    assert ops().ttf_table_deleted_keys(h, reset=True).numpy().tolist() == [1, 2, 3]
    assert ops().ttf_table_deleted_keys(h, record=1).numpy().tolist() == [3]  # the publisher's: untouched
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"record must be in \[0, 2\)"):
        ops().ttf_table_deleted_keys(h, record=2)
    with pytest.raises(ValueError, match="record must be one of"):
        ttf.embedding.EmbeddingTable(2).export(record="serving")


def test_a_save_takes_each_shards_deleted_keys_and_only_its_commit_forgets_them(tmp_path):
    """TtfTableSave takes the checkpoint record with each shard's rows; TtfTableCommitSave
    forgets what it took, never a key deleted after it; a failed save forgets nothing."""
    h = trained_table(np.arange(0, 200, dtype=np.int64), num_shards=4)
    ops().ttf_table_find_or_insert(h, [1, 2, 3, 4], dim=4)  # rows for the keys removed below
    ops().ttf_table_deleted_keys(h, reset=True)

    def save(prefix, since=0):
        return ops().ttf_table_save(h, prefix, "t/ttf/src-0", since, delta=True)[5].numpy().tolist()

    ops().ttf_table_remove(h, [1, 2])
    with pytest.raises(tf.errors.OpError):  # the piece cannot be written: the save fails
        save(str(tmp_path / "no" / "such" / "dir" / "x"))
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == [1, 2]  # nothing lost by the failure
    ops().ttf_table_remove(h, [3])
    assert save(str(tmp_path / "a")) == [1, 2, 3]  # the failed save's keys again, and the later one
    ops().ttf_table_remove(h, [4])  # after the save copied its shard: the next delta's
    ops().ttf_table_commit_save(h)
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == [4]
    assert save(str(tmp_path / "b")) == [4]
    ops().ttf_table_commit_save(h)
    assert ops().ttf_table_deleted_keys(h).numpy().tolist() == []
