"""Horovod checkpoints written by the ranks themselves (tdh.save_checkpoint: each rank writes
its own shard, rank 0 merges and records the chain), full and delta, restore bit for bit into
2 ranks, one process and 3 shards, and a 3-shard checkpoint restores into 2 ranks; a save
failing on one rank raises on every rank and leaves the last checkpoint the latest (real
Horovod: horovodrun --gloo, 2 ranks; the ranks run tests/distribute/hvd_save.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.checkpoint.table_order import by_key
from tests.distribute.test_ranks_rows import check_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distribute", "hvd_save.py")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
ROWS = ("keys", "values", "meta", "candidate_keys", "candidate_meta")
pytestmark = pytest.mark.slow


def run(mode, directory, tmp_path):
    pytest.importorskip("horovod.tensorflow", reason="run ./scripts/setup_horovod.sh (./test.sh --all does)")
    prefix = str(tmp_path / mode)
    proc = subprocess.run([sys.executable, HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
                           SCRIPT, mode, str(directory), prefix],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(open(f"{prefix}-{rank}.json").read()) for rank in (0, 1)], prefix


def rank_rows(prefix, name, rank):
    with np.load(f"{prefix}-{name}-{rank}.npz") as saved:
        return {field: saved[field] for field in ROWS}


def logical_rows(prefix, name):
    """The logical table: both ranks' rows, sorted by key."""
    parts = [rank_rows(prefix, name, rank) for rank in (0, 1)]
    return by_key({field: np.concatenate([p[field] for p in parts]) for field in ROWS})


def one_process(directory, shard_devices=None):
    """The script's model in one process (or sharded over devices), and its manager."""
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    layer = ttf.FusedEmbedding(4, num_fields=3, seed=1, shard_devices=shard_devices)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
    optimizer = ttf.optimizers.Adagrad(0.1)
    model(tf.zeros([1, 3], tf.int64))
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), str(directory),
                                               full_every=3)
    return model, layer, optimizer, manager


def assert_same_rows(got, want):
    for field in ROWS:  # bit for bit: ids, rows with their slots, counts, candidates
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)


def test_each_rank_writes_its_part_and_any_topology_restores_the_chain(tmp_path):
    directory = tmp_path / "ckpt"
    (rank0, rank1), prefix = run("save", directory, tmp_path)
    assert rank0["paths"] == rank1["paths"] == [str(directory / n) for n in ("ckpt-1", "delta-2", "delta-3")]
    assert json.loads((directory / "ttf_chain.json").read_text()) == {"full": "ckpt-1",
                                                                      "deltas": ["delta-2", "delta-3"]}
    assert not list(directory.glob("ttf-parts-*")), "the ranks' pieces are merged into the checkpoint"
    assert rank0["evicted"] > 0 and rank1["evicted"] > 0  # delta-3 carries deletions
    # Every file holds one source per rank, and source r only the ids rank r owns: each rank
    # wrote its own rows (no table was gathered onto rank 0).
    for name in ("ckpt-1", "delta-2", "delta-3"):
        reader = tf.train.load_checkpoint(str(directory / name))
        names = reader.get_variable_to_shape_map()
        assert [int(reader.get_tensor(n)) for n in names if n.endswith("/ttf/num_sources")] == [2]
        for rank in (0, 1):
            keys = [reader.get_tensor(n) for n in names if f"/ttf/src-{rank}/part-" in n and n.endswith("/keys")]
            assert keys, (name, rank)
            owners = ttf.embedding.shard_of(tf.constant(np.concatenate(keys)), 2).numpy()
            assert (owners == rank).all(), (name, rank)
    # 2 ranks: each restored exactly the rows it had.
    for rank, result in enumerate((rank0, rank1)):
        assert result["restored_step"] == 3
        assert_same_rows(rank_rows(prefix, "restored", rank), rank_rows(prefix, "step3", rank))
    # One process and 3 shards: the logical table, bit for bit.
    want = logical_rows(prefix, "step3")
    for shard_devices in (None, ["/CPU:0"] * 3):
        _, layer, _, manager = one_process(directory, shard_devices)
        assert manager.restore_latest() == 3
        assert_same_rows(by_key(layer.export_table()), want)


def test_three_shard_checkpoint_with_deltas_restores_into_two_ranks(tmp_path):
    directory = tmp_path / "ckpt"
    model, layer, optimizer, manager = one_process(directory, ["/CPU:0"] * 3)  # written as 3 PS write it
    for step in range(1, 4):  # a full checkpoint, then two deltas
        ids = tf.constant(np.arange(60).reshape(20, 3) + 1000 * step, tf.int64)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        manager.save(step)
    assert json.loads((directory / "ttf_chain.json").read_text())["deltas"] == ["delta-2", "delta-3"]
    table = by_key(layer.export_table())
    (rank0, rank1), prefix = run("restore", directory, tmp_path)
    owners = ttf.embedding.shard_of(tf.constant(table["keys"]), 2).numpy()
    for rank, result in enumerate((rank0, rank1)):
        assert result["restored_step"] == 3
        mine = owners == rank
        want = {field: table[field][mine] if field in ("keys", "values", "meta") else table[field] for field in ROWS}
        got = rank_rows(prefix, "restored", rank)
        for field in ("keys", "values", "meta"):
            np.testing.assert_array_equal(got[field], want[field], err_msg=field)


def test_a_save_failing_on_one_rank_raises_on_every_rank_and_keeps_the_last_checkpoint(tmp_path):
    directory = tmp_path / "ckpt"
    (rank0, rank1), prefix = run("fail", directory, tmp_path)
    for result in (rank0, rank1):
        assert result["error"] == "RuntimeError", result
        assert "rank 1: OSError: no space left on device (injected)" in result["message"]
        assert "the last complete checkpoint is intact" in result["message"]
        assert result["first"] == str(directory / "ckpt-1")
    assert rank0["latest"] == str(directory / "ckpt-1")
    # The next save holds everything since ckpt-1 (a delta from it), and the chain restores.
    assert rank0["next"] == rank1["next"] == str(directory / "delta-3")
    assert json.loads((directory / "ttf_chain.json").read_text()) == {"full": "ckpt-1", "deltas": ["delta-3"]}
    assert not list(directory.glob("ttf-parts-*")) and not list(directory.glob("delta-2*"))
    _, layer, _, manager = one_process(directory)
    assert manager.restore_latest() == 3
    assert_same_rows(by_key(layer.export_table()), logical_rows(prefix, "step3"))


def test_int8_rows_on_two_ranks_checkpoint_restore_and_serve_their_codes(tmp_path):
    """Compressed rows on Horovod: tests/distribute/ranks_rows.py (the script test_ranks_rows.py runs on
    TensorFlow's collectives) on 2 ranks, int8 rows, checked as there (the same bits and checksum after a
    restore into the ranks and into one process, the int8 serving export holding them byte for byte)."""
    pytest.importorskip("horovod.tensorflow", reason="run ./scripts/setup_horovod.sh (./test.sh --all does)")
    proc = subprocess.run([sys.executable, HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
                           os.path.join(ROOT, "tests", "distribute", "ranks_rows.py"), "horovod", "-", "-", "int8",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_ranks(str(tmp_path), "int8", [json.loads((tmp_path / f"hvd.{rank}.json").read_text()) for rank in (0, 1)])
