"""int8 serving rows: row-wise affine quantization (a float32 scale and bias per row),
dequantized by stock TF ops in the export's graph, in the base and in published deltas.

The reference is NumPy: min/max per row, scale = (max - min) / 255, and every element served
within scale / 2 of the trainer's row (the rounding bound), plus float32 rounding of the
multiply-add (4 ulp of the row's largest magnitude)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.serving.test_publish import DIM, Clock, layer_keys, make_model, train, trainer_rows
from ttf.serving._export import _ttf_ops_in
from ttf.serving._frozen import dequantize_rows, pack_rows, quantize_rows


def int8_bound(rows):
    """Per element: half a quantization step of its row, plus float32 rounding of q * scale + bias."""
    rows = np.asarray(rows, np.float32)
    scale = (rows.max(axis=1, keepdims=True) - rows.min(axis=1, keepdims=True)) / 255.0
    return scale / 2 + 4 * np.finfo(np.float32).eps * np.abs(rows).max(axis=1, keepdims=True)


def test_quantize_rows_matches_a_numpy_reference():
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(size=(200, 16)), 1e-3 * rng.normal(size=(20, 16)),
                           50 + rng.uniform(-1, 1, size=(20, 16)), np.full((2, 16), -0.75)]).astype(np.float32)
    quantized, scale_bias = (t.numpy() for t in quantize_rows(tf.constant(rows)))
    assert quantized.dtype == np.int8 and scale_bias.shape == (len(rows), 2)
    low, high = rows.min(axis=1), rows.max(axis=1)
    scale = (high - low) / 255.0
    np.testing.assert_allclose(scale_bias[:, 0], scale, rtol=1e-6)  # float32 vs float64 order: 1e-6
    np.testing.assert_allclose(scale_bias[:, 1], low + 128 * scale, rtol=1e-6, atol=1e-7)
    # the codes: round((x - min) / scale) - 128, all of -128..127 used; ties may round either way
    steps = np.divide(rows - low[:, None], scale[:, None], out=np.zeros_like(rows), where=scale[:, None] > 0)
    want = np.round(steps) - 128
    tie = np.abs(steps - np.floor(steps) - 0.5) < 1e-3
    np.testing.assert_array_equal(quantized[~tie], want[~tie])
    assert quantized.min() == -128 and quantized.max() == 127
    served = dequantize_rows(tf.constant(quantized), tf.constant(scale_bias)).numpy()
    assert np.all(np.abs(served - rows) <= int8_bound(rows))
    np.testing.assert_array_equal(served[-2:], rows[-2:])  # a constant row (scale 0) is exact


def test_int8_export_serves_within_001_of_fp32_with_stock_ops_only(tmp_path):
    user_ids = tf.keras.Input([], dtype=tf.int64, name="user_id")
    item_ids = tf.keras.Input([3], dtype=tf.int64, name="item_ids")
    users = ttf.DynamicEmbedding(16, initializer="normal", shard_devices=["/cpu:0"] * 2, name="users")
    items = ttf.FusedEmbedding(16, num_fields=3, tag_fields=True, seed=4, name="items")
    x = tf.keras.layers.Concatenate()([users(user_ids), tf.keras.layers.Flatten()(items(item_ids))])
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Dense(16, activation="relu")(x))
    model = tf.keras.Model([user_ids, item_ids], out)
    model.compile(optimizer=ttf.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 500, size=2048), rng.integers(0, 40, size=(2048, 3))
    model.fit([u, i], ((u + i[:, 0]) % 3 == 0).astype(np.float32), batch_size=128, epochs=2, verbose=0)
    test = [np.concatenate([u[:300], [9999]]), np.concatenate([i[:300], [[97, 98, 99]]])]
    expected = model.predict(test, verbose=0)  # what the fp32 export serves (test_serving_export)

    path = ttf.export_for_serving(model, tmp_path / "int8", row_dtype=tf.int8)
    assert _ttf_ops_in(path) == set()  # stock TF ops only (a stock-TF process: benchmarks/scale_serving.py)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    served = serve(user_id=tf.constant(test[0]), item_ids=tf.constant(test[1]))["probability"].numpy()
    difference = np.abs(served - expected)
    assert difference.max() <= 0.01 and difference.max() > 0  # quantized, and close
    assert json.load(open(os.path.join(path, "assets.extra", "ttf_serving.json")))["tables"][0]["row_dtype"] == "int8"


def test_int8_deltas_are_applied_by_the_follower_deletes_included(tmp_path):
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, tmp_path / "ctr", publish_every=1, row_dtype=tf.int8, clock=clock)
    rng = np.random.default_rng(1)
    seen = []
    train(model, optimizer, rng.integers(0, 100, size=[32, 2]))
    assert publisher.publish() == (1, 0)
    follower = ttf.serving.DeltaFollower(tmp_path / "ctr")
    for delta in (1, 2):
        ids = rng.integers(0, 300, size=[32, 2])
        seen += layer_keys(layer, ids)
        train(model, optimizer, ids)
        layer.evict(before_step=int(layer.tables[0].stats()[2]))  # keys not in this step: deletions the delta carries
        clock.now += 1
        assert publisher.publish() == (1, delta) and follower.sync() == 1
    expected = trainer_rows(layer)
    keys = np.array(sorted(set(seen) | set(expected)), np.int64)
    served = follower.lookup("sparse", keys).numpy()
    held = np.array([k in expected for k in keys])
    want = np.stack([expected[k] for k in keys[held]])
    assert 0 < held.sum() < len(keys)
    assert np.all(np.abs(served[held] - want) <= int8_bound(want))
    np.testing.assert_array_equal(served[~held], 0)  # deleted or never held: the default row
    manifest = json.load(open(os.path.join(ttf.serving.delta_folder(str(tmp_path / "ctr"), 1, 2), "manifest.json")))
    assert manifest["format"] == 2 and manifest["row_dtype"] == "int8"
    for part in manifest["parts"]:  # keys 8 + rows dim + scale and bias 8 bytes, about 70 bytes of headers
        assert part["bytes"] <= part["rows"] * (8 + DIM + 8) + 8 * part["deleted"] + 200, part


def test_follower_refuses_int8_deltas_for_a_float_base(tmp_path, capfd):
    model, optimizer = make_model(shards=1)
    clock = Clock()
    float_base, int8_base = str(tmp_path / "fp32"), str(tmp_path / "int8")
    fp32 = ttf.serving.Publisher(model, float_base, publish_every=1, clock=clock)
    int8 = ttf.serving.Publisher(model, int8_base, publish_every=1, row_dtype=tf.int8, clock=clock)
    train(model, optimizer, [[1, 2]])
    fp32.publish(), int8.publish()
    train(model, optimizer, [[3, 4]])
    int8.publish()
    follower = ttf.serving.DeltaFollower(float_base)
    assert not follower.apply(ttf.serving.delta_folder(int8_base, 1, 1))
    assert "int8 rows (format 2) for table 'sparse' of float32 rows" in follower.refused
    assert capfd.readouterr().err.count("DeltaFollower refuses") == 1


@pytest.mark.parametrize("bad", [tf.int32, "bfloat16", None])
def test_a_bad_row_dtype_is_refused_in_one_line(tmp_path, bad):
    model, _ = make_model(shards=1)
    for make in (lambda: ttf.export_for_serving(model, tmp_path, row_dtype=bad),
                 lambda: ttf.serving.Publisher(model, tmp_path, row_dtype=bad)):
        with pytest.raises(ValueError, match=r"row_dtype must be tf.float32, tf.float16 or tf.int8, got") as error:
            make()
        assert "\n" not in str(error.value)
    assert not os.listdir(tmp_path)  # nothing written


def stored_rows(layer):
    """{key: bytes of the row as the int8 table stores it}: codes [dim], then its float32 scale and bias."""
    rows = {}
    for table in layer.tables:
        exported = table.export(stored_values=True)
        packed = table.stored_rows(exported["values"]).numpy().view(np.uint8)
        rows.update(zip(exported["keys"].numpy().tolist(), packed))
    return rows


def delta_rows(folder):
    """{key: bytes of its int8 row} of a published int8 delta: codes [dim], then scale and bias."""
    rows = {}
    for part in json.load(open(os.path.join(folder, "manifest.json")))["parts"]:
        fields = tf.io.parse_tensor(tf.io.read_file(os.path.join(folder, part["file"])), tf.string)
        keys, codes = tf.io.parse_tensor(fields[0], tf.int64).numpy(), tf.io.parse_tensor(fields[1], tf.int8).numpy()
        scale_bias = tf.io.parse_tensor(fields[3], tf.float32).numpy()
        rows.update(zip(keys.tolist(), np.concatenate([codes.view(np.uint8), scale_bias.view(np.uint8)], 1)))
    return rows


def test_int8_training_rows_are_published_and_exported_as_their_own_codes(tmp_path):
    """int8 training rows (TableConfig(rows="int8")) into int8 serving rows: the base, each delta's
    parts and a later export hold the table's own codes, scale and bias byte for byte (no round
    trip through float32), and a stock-TF load predicts as the trained model does: the same
    rows, so within float32 rounding of the dense part (1e-6), not int8's tolerance."""
    ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
    embedded = ttf.FusedEmbedding(DIM, num_fields=2, name="sparse", rows="int8", shard_devices=["/cpu:0"] * 2)(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Flatten()(embedded)))
    model(tf.constant([[1, 2]], tf.int64))
    optimizer, layer, clock = ttf.optimizers.Adagrad(0.1), model.get_layer("sparse"), Clock()
    rng = np.random.default_rng(2)
    train(model, optimizer, rng.integers(0, 100, size=[32, 2]))
    publisher = ttf.serving.Publisher(model, tmp_path / "ctr", publish_every=1, row_dtype=tf.int8, clock=clock)
    assert publisher.publish() == (1, 0)
    base = tf.saved_model.load(str(tmp_path / "ctr" / "1"))
    want = stored_rows(layer)
    for shard in base.frozen_tables[0].shards:
        for key, packed in zip(shard.keys.numpy()[:-1].tolist(), shard.rows.numpy()[:-1].view(np.uint8)):
            np.testing.assert_array_equal(packed, want[key])
    # What a float32 round trip (decode, quantize_rows again) would have served differs (some rows'
    # scale or bias moves by float32 ulps): the checks above can fail.
    decoded = trainer_rows(layer)
    keys = sorted(decoded)
    again = pack_rows(*quantize_rows(np.stack([decoded[k] for k in keys]))).numpy().view(np.uint8)
    assert (again != np.stack([want[k] for k in keys])).any()
    train(model, optimizer, rng.integers(50, 200, size=[32, 2]))
    clock.now += 1
    assert publisher.publish() == (1, 1)
    want, published = stored_rows(layer), delta_rows(ttf.serving.delta_folder(str(tmp_path / "ctr"), 1, 1))
    assert len(published) > 20
    for key, row in published.items():
        np.testing.assert_array_equal(row, want[key])
    follower = ttf.serving.DeltaFollower(tmp_path / "ctr")
    keys = np.array(sorted(want), np.int64)
    expected = trainer_rows(layer)
    np.testing.assert_allclose(follower.lookup("sparse", keys).numpy(), np.stack([expected[k] for k in keys]),
                               rtol=0, atol=1e-6)
    path = ttf.export_for_serving(model, tmp_path / "ctr", row_dtype=tf.int8)
    assert _ttf_ops_in(path) == set()
    probe = tf.constant(rng.integers(0, 250, size=[64, 2]), tf.int64)
    served = tf.saved_model.load(path).signatures["serving_default"](ids=probe)["logits"].numpy()
    np.testing.assert_allclose(served, model(probe, training=False).numpy(), rtol=0, atol=1e-6)
