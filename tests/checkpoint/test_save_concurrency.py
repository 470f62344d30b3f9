"""A save beside training (TtfTableSave copies one lock shard at a time): an update does not
wait for the whole save, and a chain of full and delta checkpoints saved while another thread
trains and deletes keys restores exactly the table of its last save: no key lost, none
resurrected, rows bit for bit."""
import glob
import threading

import numpy as np
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.embedding import EmbeddingTable
from tests.embedding.test_table_hot_path import mix64

DIM = 8


def test_an_update_finishes_while_a_save_is_still_writing_other_shards(tmp_path):
    """Once the save has moved past lock shard 0, an update of keys of that shard only finishes
    while the save is still writing later shards; with the whole table locked for the save
    (before shard-at-a-time saves) it could only finish after the last piece. (An update of
    keys in every shard would trail the save shard by shard, as both go in shard order.)"""
    rows = 1 << 20
    table = EmbeddingTable(DIM, "zeros", num_shards=16)
    keys = np.arange(rows, dtype=np.int64) * 7 + 3
    values = np.concatenate([np.ones((rows, DIM)), np.full((rows, DIM), 0.1)], 1).astype(np.float32)
    ops().ttf_table_import(table.resource_handle, keys, values, np.ones((rows, 2), np.int64), tf.zeros([0], tf.int64),
                           tf.zeros([0, 2], tf.int64), "adagrad", [0.1], 1)
    prefix = str(tmp_path / "save")
    result = {}

    def save():  # pieces of 256 KiB: ~350 of them, ~22 a shard, written one after another
        result["pieces"] = ops().ttf_table_save(table.resource_handle, prefix, "t/ttf/src-0", -1,
                                                piece_bytes=256 << 10)[0].numpy()

    shard_0 = keys[(mix64(keys) >> np.uint64(40)) % np.uint64(16) == 0][:4096]
    saver = threading.Thread(target=save)
    saver.start()
    while len(glob.glob(prefix + "-p*.index")) < 30 and saver.is_alive():  # past shard 0's ~22 pieces
        pass
    ops().ttf_table_apply_adagrad(table.resource_handle, shard_0, np.ones((len(shard_0), DIM), np.float32),
                                  0.1, 1e-7, 2)
    pieces_when_updated = len(glob.glob(prefix + "-p*.index"))
    saver.join()
    assert len(result["pieces"]) > 100
    assert 30 <= pieces_when_updated < len(result["pieces"]) - 100, (pieces_when_updated, len(result["pieces"]))


def test_a_delta_chain_saved_during_training_and_deletions_loses_no_key(tmp_path):
    layer = ttf.DynamicEmbedding(DIM, seed=1, name="emb", num_shards=8)
    layer(tf.constant([[0]], tf.int64))
    table = layer.tables[0]
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer), str(tmp_path), full_every=4)
    stop = threading.Event()
    trained = []

    def train():  # updates (new keys and old), and deletions, as fast as it can
        rng = np.random.default_rng(0)
        step = 1
        while not stop.is_set():
            batch = np.unique(rng.integers(0, 20000, 512)).astype(np.int64)
            ops().ttf_table_apply_adagrad(table.resource_handle, batch, np.ones((len(batch), DIM), np.float32),
                                          0.01, 1e-7, step)
            ops().ttf_table_remove(table.resource_handle, rng.integers(0, 20000, 64).astype(np.int64))
            step += 1
        trained.append(step)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        kinds = []
        for save in range(7):
            while int(table.stats()[2]) < 20 * (save + 1):  # table steps between the saves
                pass
            kinds.append(manager.save(save + 1).rsplit("/", 1)[1].split("-")[0])
    finally:
        stop.set()
        trainer.join()
    assert kinds == ["ckpt", "delta", "delta", "delta", "ckpt", "delta", "delta"], kinds
    last = manager.save(8)  # training has stopped: this delta ends the chain at the table's state
    assert "delta" in last

    restored = ttf.DynamicEmbedding(DIM, seed=1, name="emb", num_shards=3)
    restored(tf.constant([[0]], tf.int64))
    again = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=restored), str(tmp_path), full_every=4)
    assert again.restore_latest() == 8
    want, got = layer.export_table(), restored.export_table()
    order_want, order_got = np.argsort(want["keys"].numpy()), np.argsort(got["keys"].numpy())
    np.testing.assert_array_equal(got["keys"].numpy()[order_got], want["keys"].numpy()[order_want])
    np.testing.assert_array_equal(got["values"].numpy()[order_got].view(np.uint32),
                                  want["values"].numpy()[order_want].view(np.uint32))
    np.testing.assert_array_equal(got["meta"].numpy()[order_got], want["meta"].numpy()[order_want])
    assert trained and len(want["keys"]) > 1000
