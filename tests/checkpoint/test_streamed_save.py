"""TtfTableSave: a save written piece by piece while the snapshot is read (a tiered table's
disk rows streamed from its files). The reference is the table's own export (one snapshot in
one tensor): the pieces read back with stock RestoreV2 must hold exactly its rows,
candidates and meta (tolerance 0: floats compared by their bits), each piece within its
byte bound; a tiered table saved through tf.train.Checkpoint restores into an untiered one
bit for bit; bad inputs give InvalidArgument naming the input."""
import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from ttf.embedding import EmbeddingTable, tier_row_bytes

DIM = 4
FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta")
DTYPES = (tf.int64, tf.float32, tf.int64, tf.int64, tf.int64)


def trained_tiered_table(ssd_dir, admission=2):
    """A tiered table (budget ~20 rows a shard) with most rows on disk and some candidates."""
    table = EmbeddingTable(DIM, "normal", seed=5, num_shards=2, admission_min_count=admission,
                           dram_budget=2 * 20 * tier_row_bytes(DIM, 2), ssd_dir=str(ssd_dir))
    rng = np.random.default_rng(0)
    for step in range(1, 31):
        keys = np.unique(np.minimum(rng.zipf(1.2, 64), 2000).astype(np.int64) * 7 + 1)
        grads = np.full((len(keys), DIM), 0.01 * step, np.float32)
        ops().ttf_table_apply_adam(table.resource_handle, keys, grads, 0.01, 0.9, 0.999, 1e-7, step)
    stats = table.tier_stats()
    assert stats["disk_rows"] > stats["dram_rows"] > 0, stats
    return table


def read_pieces(prefixes, base, stride):
    """Every piece's fields (stock RestoreV2), concatenated; and the pieces' row counts."""
    got = {f: [] for f in FIELDS}
    rows = []
    for k, prefix in enumerate(prefixes):
        names = [f"{base}/part-{k}/{f}" for f in FIELDS]
        piece = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * 5, dtypes=DTYPES)
        for f, t in zip(FIELDS, piece):
            got[f].append(t.numpy())
        rows.append(len(piece[0]))
    empty = {"values": np.zeros((0, stride), np.float32), "meta": np.zeros((0, 2), np.int64),
             "candidate_meta": np.zeros((0, 2), np.int64)}
    return {f: np.concatenate(v) if v else empty.get(f, np.zeros(0, np.int64)) for f, v in got.items()}, rows


def by_key(fields):
    rows = np.argsort(fields["keys"])
    cands = np.argsort(fields["candidate_keys"])
    return {"keys": fields["keys"][rows], "values": fields["values"][rows].view(np.uint32),
            "meta": fields["meta"][rows], "candidate_keys": fields["candidate_keys"][cands],
            "candidate_meta": fields["candidate_meta"][cands]}


@pytest.mark.parametrize("since_step", [None, 20])
def test_pieces_hold_exactly_the_export(tmp_path, since_step):
    table = trained_tiered_table(tmp_path)
    piece_bytes = 2048  # 2048 // (24 + 4 * 12) = 28 rows a piece: many pieces
    delta = since_step is not None
    prefixes, optimizer, slot_init, step, stride, deleted, row_layout = ops().ttf_table_save(
        table.resource_handle, str(tmp_path / "save"), "t/ttf/src-0", -1 if not delta else since_step,
        delta=delta, piece_bytes=piece_bytes)
    want = table.export(since_step=since_step)
    got, rows = read_pieces([p.decode() for p in prefixes.numpy()], "t/ttf/src-0", int(stride))
    assert len(rows) > 3 and max(rows) * (24 + 4 * int(stride)) <= piece_bytes, rows
    assert sum(rows) == len(want["keys"]) > 0
    assert len(got["candidate_keys"]) == len(want["candidate_keys"]) > 0  # admission candidates saved too
    expected = by_key({f: want[f].numpy() for f in FIELDS})
    for name, value in by_key(got).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    assert optimizer.numpy() == want["optimizer"].numpy() and int(step) == int(want["step"])
    np.testing.assert_array_equal(slot_init.numpy(), want["slot_init"].numpy())
    assert int(stride) == DIM * 3 and row_layout.numpy() == b""  # fp32 rows: the full layout, no tag
    if delta:
        np.testing.assert_array_equal(deleted.numpy(), want["deleted_keys"].numpy())


def test_a_tiered_layer_saved_through_tf_checkpoint_restores_untiered_bit_for_bit(tmp_path, monkeypatch):
    from ttf.checkpoint import _format  # noqa: PLC0415
    monkeypatch.setattr(_format, "PIECE_BYTES", 4096)  # several pieces per shard at this size
    tier = dict(dram_budget=30 * tier_row_bytes(DIM, 2) * 16, ssd_dir=str(tmp_path))
    layer = ttf.DynamicEmbedding(DIM, seed=1, name="emb", **tier)
    optimizer = ttf.optimizers.Adam(0.05)
    rng = np.random.default_rng(1)
    for _ in range(20):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(tf.constant(rng.integers(0, 3000, (64, 3)), tf.int64),
                                                 training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
    assert layer.tables[0].tier_stats()["disk_rows"] > 0
    path = tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ckpt"))
    plain = ttf.DynamicEmbedding(DIM, seed=1, name="emb")
    plain(tf.constant([[0]], tf.int64))
    tf.train.Checkpoint(layer=plain).read(path).assert_consumed()
    want, got = by_key({f: layer.tables[0].export()[f].numpy() for f in FIELDS}), by_key(
        {f: plain.tables[0].export()[f].numpy() for f in FIELDS})
    for name in FIELDS:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    summary = [ops().ttf_table_summary(t.tables[0].resource_handle) for t in (layer, plain)]
    assert [int(s[0]) for s in summary] == [len(want["keys"])] * 2  # the summary counts disk rows too
    assert int(summary[0][1]) == int(summary[1][1])  # same checksum: same rows bit for bit


def test_bad_inputs_are_refused_naming_them(tmp_path):
    table = trained_tiered_table(tmp_path, admission=0)
    handle, prefix = table.resource_handle, str(tmp_path / "bad")
    with pytest.raises(tf.errors.InvalidArgumentError, match="prefix must be a scalar"):
        ops().ttf_table_save(handle, [prefix, prefix], "t", -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="prefix must not be empty"):
        ops().ttf_table_save(handle, "", "t", -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="since_step must be >= -1"):
        ops().ttf_table_save(handle, prefix, "t", -5, delta=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="piece_bytes must be > 0"):
        ops().ttf_table_save(handle, prefix, "t", -1, piece_bytes=0)
    with pytest.raises((tf.errors.NotFoundError, tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError,
                        tf.errors.PermissionDeniedError, tf.errors.UnknownError)):
        ops().ttf_table_save(handle, str(tmp_path / "no" / "such" / "dir" / "x"), "t", -1)
