"""Compressed table rows (rows="int8" / "bf16", docs/table_rows.md) on 2 real workers of a
synchronous job on TensorFlow's collectives (ranks_rows.py; test_horovod_save.py runs the same
script on 2 Horovod ranks and checks it here): each worker's part of a checkpoint (full +
delta) restores into the workers and into one process with the same rows bit for bit (the
table checksum: a checkpoint holds the stored words), and the int8 serving export and published deltas hold the training
codes, scale and bias byte for byte, so the export predicts as the trained model does."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.checkpoint.table_order import by_key
from tests.distribute.test_sync_collectives import finish, run_workers
from tests.serving.test_int8_rows import delta_rows

DIM = 4
pytestmark = pytest.mark.slow


def rank_rows(directory, name, rank):
    """A rank's saved rows by key: the full export and the stored values' bytes (int8: codes, scale, bias)."""
    with np.load(os.path.join(directory, f"{name}-{rank}.npz")) as saved:
        order, stored_order = np.argsort(saved["keys"]), np.argsort(saved["stored_keys"])
        full = {f: saved[f][order] for f in ("keys", "values", "meta")}
        np.testing.assert_array_equal(saved["stored_keys"][stored_order], full["keys"])
        return full, saved["stored"][stored_order].view(np.uint8)


def saved_checksum(directory, name, rank):
    with np.load(os.path.join(directory, f"{name}-{rank}.npz")) as saved:
        return int(saved["checksum"])


def wrapping_sum(checksums):
    """The checksum of tables whose shards have these checksums (TtfTableSummary: a wrapping int64 sum)."""
    total = sum(checksums) % (1 << 64)
    return total - (1 << 64) if total >= 1 << 63 else total


def assert_same_rows(got, want):
    """Every bit of the rows and slots (bf16 and int8 alike: a checkpoint holds the stored words)."""
    (full, stored), (want_full, want_stored) = got, want
    np.testing.assert_array_equal(full["keys"], want_full["keys"])
    np.testing.assert_array_equal(full["meta"], want_full["meta"])
    np.testing.assert_array_equal(full["values"].view(np.uint32), want_full["values"].view(np.uint32))
    np.testing.assert_array_equal(stored, want_stored)


def one_process(directory, rows):
    """The workers' checkpoint restored into one process with the same rows."""
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    layer = ttf.FusedEmbedding(DIM, num_fields=3, seed=1, rows=rows, name="emb")
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
    optimizer = ttf.optimizers.Adam(0.05)
    model(tf.zeros([1, 3], tf.int64))
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                               os.path.join(directory, "ckpt"), full_every=3)
    assert manager.restore_latest() == 2
    table = layer.tables[0]
    full, stored = by_key(table.export()), table.export(stored_values=True)
    order = np.argsort(stored["keys"].numpy())
    np.testing.assert_array_equal(stored["keys"].numpy()[order], full["keys"])
    rows = {f: full[f] for f in ("keys", "values", "meta")}, stored["values"].numpy()[order].view(np.uint8)
    return rows, ttf.embedding.table_summary(layer)[1]


def check_ranks(directory, rows, results):
    """What ranks_rows.py left in `directory` (its 2 ranks' JSON results)."""
    assert [r["restored_step"] for r in results] == [2, 2] and results[0]["paths"] == ["ckpt-1", "delta-2"]
    trained = [rank_rows(directory, "trained", rank) for rank in (0, 1)]
    for rank in (0, 1):
        assert len(trained[rank][0]["keys"]) > 20
        assert_same_rows(rank_rows(directory, "restored", rank), trained[rank])
        assert saved_checksum(directory, "restored", rank) == saved_checksum(directory, "trained", rank)
    logical = ({f: np.concatenate([t[0][f] for t in trained]) for f in ("keys", "values", "meta")},
               np.concatenate([t[1] for t in trained]))
    order = np.argsort(logical[0]["keys"])
    logical = ({f: v[order] for f, v in logical[0].items()}, logical[1][order])
    restored, checksum = one_process(directory, rows)
    assert_same_rows(restored, logical)
    assert checksum == wrapping_sum([saved_checksum(directory, "trained", rank) for rank in (0, 1)])
    # The int8 serving export: each rank's shard holds that rank's rows; an int8 table's rows are
    # its training codes, scale and bias byte for byte (no round trip through float32).
    assert results[0]["served"].endswith("serving/1") and results[1]["served"] is None
    loaded = tf.saved_model.load(results[0]["served"])
    for rank, shard in enumerate(loaded.frozen_tables[0].shards):
        keys, packed = shard.keys.numpy()[:-1], shard.rows.numpy()[:-1]  # the last: the default row
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], trained[rank][0]["keys"])
        if rows == "int8":
            np.testing.assert_array_equal(packed[order].view(np.uint8), trained[rank][1][:, :DIM + 8])
    # Published: a base, then a delta whose int8 rows are the ranks' own rows, byte for byte.
    assert [r["published"] for r in results] == [[[1, 0], [1, 1]]] * 2
    published = [rank_rows(directory, "published", rank) for rank in (0, 1)]
    want = {k: row[:DIM + 8] for full, stored in published for k, row in zip(full["keys"].tolist(), stored)}
    delta = delta_rows(ttf.serving.delta_folder(os.path.join(directory, "published"), 1, 1))
    assert len(delta) >= 10 * 3
    for key, row in delta.items():
        np.testing.assert_array_equal(row, want[key])
    # Predictions of the export against the trained model's: int8 training rows are served as
    # they are (float32 arithmetic only: 1e-6); bf16 rows requantized to int8 (half a step of each row).
    serve = loaded.signatures["serving_default"]
    for result in results:
        served = serve(ids=tf.constant(result["probe"], tf.int64))
        served = next(iter(served.values())).numpy().ravel()
        np.testing.assert_allclose(served, result["predicted"], rtol=0, atol=1e-6 if rows == "int8" else 0.05)


def test_int8_rows_on_two_sync_workers_checkpoint_restore_and_serve(tmp_path):
    """int8 only: bf16 rows take the same paths (checked on parameter servers, test_ps_rows.py; the
    script takes bf16 too, checked here by hand: passed in 57 s)."""
    procs = run_workers("ranks_rows.py", tmp_path / "out", "int8", str(tmp_path))
    outputs = finish(procs)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-4000:]
    check_ranks(str(tmp_path), "int8", [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in (0, 1)])
