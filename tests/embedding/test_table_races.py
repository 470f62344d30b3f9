"""Concurrent writers (lookups inserting keys, optimizer applies that change the slot
layout, eviction, import with fewer slots) against export and inference lookups: every export
is one consistent snapshot with one slot layout, every looked-up row whole, and nothing
crashes."""
import itertools
import threading
import time

import numpy as np
import tensorflow as tf

import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
from ttf._ops import ops

_names = itertools.count()
DIM = 4


def check_export(out):
    """Every row is [1.0] * DIM, then 0.25 per Adagrad slot: any misalignment shows."""
    keys, values, meta, ckeys, cmeta, optimizer, slot_init, step = (t.numpy() for t in out)
    slots = len(slot_init)
    assert values.shape == (len(keys), DIM * (1 + slots)), (values.shape, slots)
    assert optimizer in (b"", b"adagrad") and slots == (optimizer == b"adagrad")
    assert len(set(keys.tolist())) == len(keys)
    assert meta.shape == (len(keys), 2) and (meta >= 0).all()
    np.testing.assert_array_equal(values[:, :DIM], 1.0)
    np.testing.assert_array_equal(values[:, DIM:], 0.25)
    return len(keys)


def run_concurrently(fns, seconds, first_step=1):
    """Runs each fn(rng, step) on a thread of its own, step after step (first_step, then + 1),
    until `seconds` have passed; returns the exceptions they raised (each thread stops at its first)."""
    stop, errors = time.monotonic() + seconds, []

    def worker(fn, seed):
        rng = np.random.default_rng(seed)
        try:
            step = first_step
            while time.monotonic() < stop:
                fn(rng, step)
                step += 1
        except Exception as err:  # noqa: BLE001  (reported by the caller)
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(fn, seed)) for seed, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def run_race(seconds, num_shards):
    h = ops().ttf_embedding_table(dim=DIM, initializer="constant", init_a=1.0, default_value=-1.0,
                                  num_shards=num_shards, shared_name=f"race_{next(_names)}")
    # Snapshots to import: no slots (the first apply after it re-lays every row), and Adagrad's one.
    plain_keys = np.arange(0, 3000, dtype=np.int64)
    no_slots = (plain_keys, np.ones((3000, DIM), np.float32), np.ones((3000, 2), np.int64),
                tf.zeros([0], tf.int64), tf.zeros([0, 2], tf.int64), "", tf.zeros([0]), 1)
    with_slots = (plain_keys[:1000], np.concatenate([np.ones((1000, DIM)), np.full((1000, DIM), 0.25)], 1).astype(
        np.float32), np.ones((1000, 2), np.int64), tf.zeros([0], tf.int64), tf.zeros([0, 2], tf.int64),
        "adagrad", [0.25], 1)
    exports = []

    def lookup(rng, step):
        keys = rng.integers(0, 20000, 400)
        ops().ttf_table_find_or_insert(h, keys, dim=DIM)
        ops().ttf_embedding_lookup_ragged(h, keys, [0, 100, 100, 400], dim=DIM)

    def apply(rng, step):
        keys = rng.integers(0, 20000, 400)
        try:  # zero gradients: rows stay 1.0 and accumulators 0.25 exactly
            ops().ttf_table_apply_adagrad(h, keys, np.zeros((400, DIM), np.float32), 0.1, 1e-7, step,
                                          initial_accumulator_value=0.25)
        except tf.errors.AbortedError:
            pass  # an import changed the layout under this update: reported, never silent

    def infer(rng, step):  # FindEach: every shard lock shared, 4096 ids at a time
        rows = ops().ttf_table_find(h, rng.integers(0, 20000, 10000), dim=DIM, training=False).numpy()
        assert np.isin(rows, (-1.0, 1.0)).all() and (rows == rows[:, :1]).all(), "a torn or stale row"

    def evict(rng, step):
        ops().ttf_table_evict(h, 0, int(rng.integers(0, 3)))

    def import_(rng, step):
        ops().ttf_table_import(h, *(no_slots if rng.random() < 0.5 else with_slots))

    def export(rng, step):
        exports.append(check_export(ops().ttf_table_export(h)))

    errors = run_concurrently((lookup, apply, apply, evict, import_, export, export, infer), seconds)
    assert not errors, errors[:3]
    return exports


def test_export_is_one_consistent_snapshot_under_concurrent_writers():
    exports = run_race(seconds=8, num_shards=16)
    assert len(exports) > 10 and max(exports) > 0


def test_a_chain_of_deltas_taken_during_training_rebuilds_the_table():
    """Export copies shard by shard while updates and removals go on: a full export, then
    deltas (each resetting the deleted-key record), replayed as a restore does (remove the
    deleted keys, then upsert the rows), give exactly the table's keys at the end."""
    h = ops().ttf_embedding_table(dim=DIM, initializer="constant", init_a=1.0, num_shards=16,
                                  shared_name=f"race_{next(_names)}")
    stop, errors = threading.Event(), []

    def writer():
        rng = np.random.default_rng(1)
        try:
            for step in itertools.count(1):
                if stop.is_set():
                    return
                keys = np.unique(np.concatenate([np.arange(step * 300, step * 300 + 300),
                                                 rng.integers(0, step * 300, 300)])).astype(np.int64)
                ops().ttf_table_apply_adagrad(h, keys, np.zeros((len(keys), DIM), np.float32), 0.1, 1e-7, step,
                                              initial_accumulator_value=0.25)
                ops().ttf_table_remove(h, rng.integers(0, step * 300, 100))
        except Exception as err:  # noqa: BLE001  (reported by the test)
            errors.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.2)
        base = ops().ttf_table_export(h, reset_deleted=True)
        check_export(base)
        mirror, since = set(base[0].numpy().tolist()), int(base[7]) - 1  # the step before: rows may repeat
        for _ in range(12):
            time.sleep(0.05)
            delta = ops().ttf_table_export_delta(h, since, reset_deleted=True)
            check_export(delta[:8])
            mirror -= set(delta[8].numpy().tolist())
            mirror |= set(delta[0].numpy().tolist())
            since = int(delta[7]) - 1
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:3]
    last = ops().ttf_table_export_delta(h, since, reset_deleted=True)
    mirror -= set(last[8].numpy().tolist())
    mirror |= set(last[0].numpy().tolist())
    final = set(ops().ttf_table_export(h)[0].numpy().tolist())
    assert len(final) > 1000
    assert mirror == final, (len(mirror - final), len(final - mirror))


def test_tiered_training_lookups_read_disk_rows_at_the_layout_of_their_lock(tmp_path):
    """A training lookup of a tiered table reads (and stages) whole disk records, of the row
    stride its shard holds under the lock. Read before the lock (the fuzzer's rare InternalError
    in a race), an import that changed the slot layout meanwhile (Adam's 3 * DIM floats a row ->
    DIM) made it read its last disk record past the end of the file ("the SSD tier ... failed
    (reading rows: Input/output error)") and stage records too short for the update's promotion."""
    h = ops().ttf_embedding_table(dim=DIM, initializer="constant", init_a=1.0, num_shards=1, dram_budget=1,
                                  ssd_dir=str(tmp_path), shared_name=f"race_{next(_names)}")
    n = 8  # one DRAM row (the budget's floor), the others on disk: the last record is always read
    keys = np.arange(n, dtype=np.int64)
    empty = (tf.zeros([0], tf.int64), tf.zeros([0, 2], tf.int64))
    adam = (keys, np.concatenate([np.ones((n, DIM)), np.zeros((n, 2 * DIM))], 1).astype(np.float32),
            np.ones((n, 2), np.int64), *empty, "adam", [0.0, 0.0], 1)
    plain = (keys, np.ones((n, DIM), np.float32), np.ones((n, 2), np.int64), *empty, "", tf.zeros([0]), 1)

    def lookup(rng, step):
        rows = ops().ttf_embedding_lookup(h, keys, dim=DIM)[0].numpy()  # training: whole records read and staged
        np.testing.assert_array_equal(rows, 1.0)

    def apply(rng, step):  # promotes the staged records (zero gradients: every row stays 1.0)
        try:
            ops().ttf_table_apply_sgd(h, keys, np.zeros((n, DIM), np.float32), 0.1, step)
        except tf.errors.InvalidArgumentError:
            pass  # Adam's slots in the table: sgd cannot update it (refused before any row changes)
        except tf.errors.AbortedError:
            pass  # an import changed the layout under this update: reported, never silent

    def import_(rng, step):
        ops().ttf_table_import(h, *(adam if step % 2 else plain))

    errors = run_concurrently((lookup, lookup, lookup, apply, import_), seconds=3)
    assert not errors, [str(err) for err in errors[:3]]
