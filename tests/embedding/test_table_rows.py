"""Tables storing bf16 or int8 rows (TableConfig(rows=...), issue 49) against NumPy references.

- A lookup reads exactly the dequantized row: rows converted from float32 (an import, which
  rounds to nearest) read back as NumPy's nearest int8 / bf16 encoding of them, bit for bit.
- One update step matches a NumPy float32 update within one quantization step of the row
  (int8: the row's span / 255; bf16: one bf16 unit in the last place). int8 Adam and
  Adagrad are their row-wise forms (ops/kernels/row_layout.h), and the reference is too.
- Rows are a pure function of (seed, key, update history): two runs give the same bytes.
- Save and restore: an export restores to the same rows (bf16 bit for bit, int8 to the same
  codes); a checkpoint's stored words with their layout tag restore to the bit (the table
  checksum), and into another row format convert as the export does; a tag that cannot be
  read or does not fit is refused in one line.
- An unknown row format is refused in one line.
"""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf._ops import ops
from tests.embedding.test_row_codec import encode_int8, mean_square

_names = itertools.count()
FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")
ADAM = (0.01, 0.9, 0.999, 1e-7)


def new_table(rows, dim=8, **attrs):
    return ops().ttf_embedding_table(dim=dim, rows=rows, seed=3, initializer="normal", init_b=0.5,
                                     shared_name=f"rows_{next(_names)}", **attrs)


def export(h):
    ex = {name: t.numpy() for name, t in zip(FIELDS, ops().ttf_table_export(h))}
    order = np.argsort(ex["keys"], kind="stable")
    for name in ("keys", "values", "meta"):
        ex[name] = ex[name][order]
    return ex


def import_(h, ex):
    ops().ttf_table_import(h, *(ex[f] for f in FIELDS))


def lookup(h, keys, dim):
    return ops().ttf_table_find(h, keys, dim=dim, training=True).numpy()


def int8_nearest(x):
    """NumPy's nearest int8 row encoding of x (float32 [n, dim]), dequantized."""
    codes, scale, bias = encode_int8(x, np.float32(0.5))
    return (codes.astype(np.float32) * scale[:, None] + bias[:, None]).astype(np.float32)


def bf16_nearest(x):
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x8000) >> 16) << 16).astype(np.uint32).view(np.float32)


def trained(rows, keys, steps=4, dim=8, optimizer="adam", seed=0):
    """A table trained for a few steps on overlapping batches of keys (gradients seeded)."""
    h = new_table(rows, dim)
    rng = np.random.default_rng(seed)
    for step in range(1, steps + 1):
        batch = keys[rng.random(len(keys)) < 0.7]
        grads = rng.normal(size=(len(batch), dim)).astype(np.float32)
        lookup(h, batch, dim)
        if optimizer == "adam":
            ops().ttf_table_apply_adam(h, batch, grads, *ADAM, step)
        elif optimizer == "adagrad":
            ops().ttf_table_apply_adagrad(h, batch, grads, 0.1, 1e-7, step)
        elif optimizer == "ftrl":
            ops().ttf_table_apply_ftrl(h, batch, grads, 0.1, -0.5, 0.0, 0.0, 0.0, 0.0, step)
        else:
            ops().ttf_table_apply_sgd(h, batch, grads, 0.1, step)
    return h


def fp32_export(n=300, dim=8, seed=1):
    """An Adam export of float32 rows with nonzero slots (v > 0), to import."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    values = np.concatenate([rng.normal(size=(n, dim)), rng.normal(size=(n, dim)) * 0.1,
                             rng.random((n, dim)) * 0.01], axis=1).astype(np.float32)
    return dict(keys=keys, values=values, meta=np.tile(np.array([[1, 5]], np.int64), (n, 1)),
                candidate_keys=np.zeros([0], np.int64), candidate_meta=np.zeros([0, 2], np.int64),
                optimizer=b"adam", slot_init=np.zeros([2], np.float32), step=np.int64(5))


def test_lookup_of_converted_rows_is_numpys_encoding_bit_for_bit():
    src = fp32_export()
    dim = 8
    for rows, reference in (("int8", int8_nearest), ("bf16", bf16_nearest)):
        h = new_table(rows, dim)
        import_(h, src)
        got = lookup(h, src["keys"], dim)
        np.testing.assert_array_equal(got.view(np.uint32), reference(src["values"][:, :dim]).view(np.uint32))
        # the export holds the same value; int8 Adam's v is the mean of the leading dim - 1
        # elements' v (one a row, repeated), then the last element's own
        ex = export(h)
        np.testing.assert_array_equal(ex["values"][:, :dim], got[np.argsort(src["keys"])])
        if rows == "int8":
            v = src["values"][:, 2 * dim:][np.argsort(src["keys"])]
            mean = np.mean(v[:, :-1].astype(np.float64), axis=1).astype(np.float32)
            np.testing.assert_array_equal(ex["values"][:, 2 * dim:3 * dim - 1], np.repeat(mean[:, None], dim - 1, 1))
            np.testing.assert_array_equal(ex["values"][:, 3 * dim - 1], v[:, -1])
            np.testing.assert_array_equal(ex["values"][:, dim:2 * dim],
                                          bf16_nearest(src["values"][:, dim:2 * dim][np.argsort(src["keys"])]))


def test_stored_values_export_the_rows_as_stored_against_numpy():
    """export(stored_values=True) (TtfTableExport and ExportDelta): each row's value as the table
    stores it, no slots: int8 NumPy's nearest codes, then the float32 scale and bias, padded to
    whole words; bf16 the nearest bfloat16 pairs; fp32 the floats themselves."""
    src = fp32_export()
    dim, order = 8, np.argsort(src["keys"])
    x = src["values"][order, :dim]
    for rows in ("int8", "bf16", "fp32"):
        table = ttf.embedding.EmbeddingTable(dim, rows=rows, name=f"stored_{rows}")
        import_(table.resource_handle, src)
        for exported in (table.export(stored_values=True), table.export(since_step=-1, stored_values=True)):
            got = exported["values"].numpy()[np.argsort(exported["keys"].numpy())]
            if rows == "int8":
                assert got.shape == (len(x), 4)  # 8 codes + scale + bias: 16 bytes, 4 words
                codes, scale, bias = encode_int8(x, np.float32(0.5))
                want = np.concatenate([codes.view(np.uint8), scale[:, None].view(np.uint8),
                                       bias[:, None].view(np.uint8)], 1)
                np.testing.assert_array_equal(got.view(np.uint8), want)
                packed = table.stored_rows(tf.constant(got)).numpy()  # ttf.serving's packed int8 rows
                assert packed.dtype == np.int8 and packed.shape == (len(x), dim + 8)
                np.testing.assert_array_equal(packed.view(np.uint8), want)
            elif rows == "bf16":
                want = (bf16_nearest(x).view(np.uint32) >> 16).astype(np.uint16)
                np.testing.assert_array_equal(got.view(np.uint16), want)
            else:
                np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))
    with pytest.raises(ValueError, match="stores fp32 rows, not int8 codes"):
        table.stored_rows(got)


def rowwise_adam(x, m, v, g, step, lr, b1, b2, eps):
    """Partial row-wise Adam (compressed_updates.h) in float32: m per element, v [n, 2]: one for
    the leading dim - 1 elements (their mean g^2), one for the last element (its g^2)."""
    f = np.float32
    t = f(step)
    alpha = f(lr) * np.sqrt(f(1) - f(b2) ** t) / (f(1) - f(b1) ** t)
    g2 = np.stack([mean_square(g[:, :-1]), (g[:, -1] * g[:, -1]).astype(f)], 1)
    v = (v + (g2 - v) * (f(1) - f(b2))).astype(f)
    m = (m + (g - m) * (f(1) - f(b1))).astype(f)
    steps = (alpha / (np.sqrt(v) + f(eps))).astype(f)
    return (x - m * np.concatenate([np.repeat(steps[:, :1], g.shape[1] - 1, 1), steps[:, 1:]], 1)).astype(f)


def adam(x, m, v, g, step, lr, b1, b2, eps):
    f = np.float32
    t = f(step)
    alpha = f(lr) * np.sqrt(f(1) - f(b2) ** t) / (f(1) - f(b1) ** t)
    m = (m + (g - m) * (f(1) - f(b1))).astype(f)
    v = (v + (g * g - v) * (f(1) - f(b2))).astype(f)
    return (x - (m * alpha) / (np.sqrt(v) + f(eps))).astype(f)


@pytest.mark.parametrize("rows", ["int8", "bf16"])
def test_an_adam_step_matches_numpy_within_one_quantization_step(rows):
    dim, n = 16, 400
    rng = np.random.default_rng(2)
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    h = new_table(rows, dim)
    before = lookup(h, keys, dim)  # new rows: the initializer's, rounded to nearest
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    ops().ttf_table_apply_adam(h, keys, grads, *ADAM, 1)
    after = lookup(h, keys, dim)
    zeros = np.zeros_like(grads)
    if rows == "int8":
        ref = rowwise_adam(before, zeros, np.zeros((n, 2), np.float32), grads, 1, *ADAM)
        step = (ref.max(axis=1) - ref.min(axis=1)) / 255  # one code of the written row
        tolerance = step[:, None] * 1.0001
    else:
        ref = adam(before, zeros, zeros, grads, 1, *ADAM)
        tolerance = np.abs(ref) * 2.0 ** -7  # one bf16 unit in the last place
    assert np.all(np.abs(after - ref) <= tolerance)
    assert not np.array_equal(after, before)


@pytest.mark.parametrize("rows", ["int8", "bf16"])
def test_an_sgd_step_matches_numpy_within_one_quantization_step(rows):
    dim, n = 8, 300
    rng = np.random.default_rng(5)
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    h = new_table(rows, dim)
    before = lookup(h, keys, dim)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    ops().ttf_table_apply_sgd(h, keys, grads, 0.1, 1)
    ref = (before - np.float32(0.1) * grads).astype(np.float32)
    if rows == "int8":
        tolerance = ((ref.max(axis=1) - ref.min(axis=1)) / 255)[:, None] * 1.0001
    else:
        tolerance = np.abs(ref) * 2.0 ** -7
    assert np.all(np.abs(lookup(h, keys, dim) - ref) <= tolerance)


def test_an_int8_adagrad_step_is_numpys_rowwise_adagrad_within_one_code():
    """Row-wise Adagrad: one accumulator for the leading dim - 1 elements (their mean g^2), the
    last element's own (its g^2: a first-order weight's step is element-wise Adagrad's)."""
    dim, n = 8, 300
    rng = np.random.default_rng(4)
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    h = new_table("int8", dim)
    before = lookup(h, keys, dim)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    grads[:, -1] *= 7  # a first-order weight's gradient, ~7x the embedding elements' (DeepFM)
    ops().ttf_table_apply_adagrad(h, keys, grads, 0.1, 1e-7, 1)
    f = np.float32
    accum = (f(0.1) + mean_square(grads[:, :-1])).astype(f)  # initial_accumulator_value 0.1
    own = (f(0.1) + grads[:, -1] * grads[:, -1]).astype(f)
    step = (f(0.1) / np.sqrt(np.stack([accum] * (dim - 1) + [own], 1) + f(1e-7))).astype(f)
    ref = (before - step * grads).astype(f)
    code = (ref.max(axis=1) - ref.min(axis=1)) / 255
    assert np.all(np.abs(lookup(h, keys, dim) - ref) <= code[:, None] * 1.0001)
    order = np.argsort(keys)
    exported = export(h)["values"][:, dim:]  # the full layout: the leading accumulator dim - 1 times, then the last's
    np.testing.assert_array_equal(exported[:, :-1], np.repeat(accum[order][:, None], dim - 1, 1))
    np.testing.assert_array_equal(exported[:, -1], own[order])


def test_a_one_element_int8_row_keeps_one_accumulator_through_save_and_restore():
    """dim 1 (a first-order weight alone): the row-wise accumulator is the element's own, one fp32,
    and an export restores to the same accumulator."""
    keys = np.arange(1, 200, 3, dtype=np.int64)
    rng = np.random.default_rng(8)
    h = new_table("int8", 1)
    grads = rng.normal(size=(len(keys), 1)).astype(np.float32)
    ops().ttf_table_apply_adagrad(h, keys, grads, 0.1, 1e-7, 1)
    saved = export(h)
    np.testing.assert_array_equal(saved["values"][:, 1], (np.float32(0.1) + grads[:, 0] ** 2).astype(np.float32))
    restored = new_table("int8", 1)
    import_(restored, saved)
    np.testing.assert_array_equal(export(restored)["values"][:, 1], saved["values"][:, 1])


def test_a_checkpoint_with_one_rowwise_accumulator_restores_into_both():
    """An int8 Adagrad export from before the last element kept its own accumulator (one
    accumulator a row, written dim times) restores as it is: both accumulators take it, and
    training goes on."""
    dim, n = 8, 50
    rng = np.random.default_rng(6)
    keys = np.sort(rng.choice(1 << 40, n, replace=False)).astype(np.int64)
    accum = (rng.random(n) + 0.1).astype(np.float32)
    old = dict(keys=keys, values=np.concatenate([rng.normal(size=(n, dim)), np.repeat(accum[:, None], dim, 1)],
                                                1).astype(np.float32),
               meta=np.tile(np.array([[1, 5]], np.int64), (n, 1)), candidate_keys=np.zeros([0], np.int64),
               candidate_meta=np.zeros([0, 2], np.int64), optimizer=b"adagrad",
               slot_init=np.array([0.1], np.float32), step=np.int64(5))
    h = new_table("int8", dim)
    import_(h, old)
    np.testing.assert_array_equal(export(h)["values"][:, dim:], old["values"][:, dim:])
    before = lookup(h, keys, dim)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    ops().ttf_table_apply_adagrad(h, keys, grads, 0.1, 1e-7, 6)
    f = np.float32
    want = np.stack([(accum + mean_square(grads[:, :-1])).astype(f), (accum + grads[:, -1] ** 2).astype(f)], 1)
    np.testing.assert_array_equal(export(h)["values"][:, [dim, 2 * dim - 1]], want)
    assert not np.array_equal(lookup(h, keys, dim), before)


@pytest.mark.parametrize("rows,optimizer", [("int8", "adam"), ("bf16", "adam"), ("int8", "adagrad"),
                                            ("int8", "ftrl"), ("bf16", "sgd")])
def test_rows_are_the_same_bytes_in_two_runs(rows, optimizer):
    keys = np.arange(0, 3000, 3, dtype=np.int64)
    a, b = (export(trained(rows, keys, optimizer=optimizer)) for _ in range(2))
    np.testing.assert_array_equal(a["keys"], b["keys"])
    np.testing.assert_array_equal(a["values"].view(np.uint32), b["values"].view(np.uint32))
    # another seed of the update history (the gradients) gives other rows
    c = export(trained(rows, keys, optimizer=optimizer, seed=9))
    assert not np.array_equal(a["values"], c["values"])


@pytest.mark.parametrize("rows", ["int8", "bf16"])
def test_save_and_restore_gives_back_the_rows(rows):
    dim = 8
    keys = np.arange(1, 2000, 7, dtype=np.int64)
    saved = export(trained(rows, keys, dim=dim))
    h = new_table(rows, dim)
    import_(h, saved)
    restored = export(h)
    np.testing.assert_array_equal(restored["keys"], saved["keys"])
    np.testing.assert_array_equal(restored["meta"], saved["meta"])
    if rows == "bf16":
        np.testing.assert_array_equal(restored["values"].view(np.uint32), saved["values"].view(np.uint32))
    else:  # the same codes: scale and bias recomputed from the row, within a few float32 ulps of the span
        span = saved["values"][:, :dim].max(axis=1) - saved["values"][:, :dim].min(axis=1)
        assert np.all(np.abs(restored["values"][:, :dim] - saved["values"][:, :dim]) <= 1e-5 * span[:, None] + 1e-7)
        np.testing.assert_array_equal(restored["values"][:, dim:], saved["values"][:, dim:])
    # training goes on from the restored rows as from the saved ones
    grads = np.ones((len(saved["keys"]), dim), np.float32)
    ops().ttf_table_apply_adam(h, saved["keys"], grads, *ADAM, 5)
    assert int(ops().ttf_table_size(h)) == len(saved["keys"])


def test_restore_into_another_row_format_converts():
    dim = 8
    src = fp32_export(dim=dim)
    order = np.argsort(src["keys"])
    to_int8 = new_table("int8", dim)
    import_(to_int8, src)
    int8_rows = export(to_int8)
    np.testing.assert_array_equal(int8_rows["values"][:, :dim], int8_nearest(src["values"][order, :dim]))
    back = new_table("fp32", dim)  # int8 -> fp32: the int8 table's rows as they read
    import_(back, int8_rows)
    np.testing.assert_array_equal(export(back)["values"], int8_rows["values"])
    to_bf16 = new_table("bf16", dim)
    import_(to_bf16, int8_rows)
    np.testing.assert_array_equal(export(to_bf16)["values"], bf16_nearest(int8_rows["values"]))


def checksum(h):
    return int(ops().ttf_table_summary(h)[1])


def save_stored(h, path):
    """A TtfTableSave of the table (one piece) read back: its fields and its row layout tag."""
    prefixes, optimizer, slot_init, step, _, _, tag = ops().ttf_table_save(h, str(path), "t", -1)
    parts = [f"t/part-0/{f}" for f in FIELDS[:5]]
    fields = tf.raw_ops.RestoreV2(prefix=prefixes[0], tensor_names=parts, shape_and_slices=[""] * 5,
                                  dtypes=[tf.int64, tf.float32, tf.int64, tf.int64, tf.int64])
    return dict(zip(FIELDS, fields), optimizer=optimizer, slot_init=slot_init, step=step), tag.numpy().decode()


def import_stored(h, saved, tag, **attrs):
    ops().ttf_table_import_stored(h, *(saved[f] for f in FIELDS), tag, **attrs)


@pytest.mark.parametrize("rows,optimizer,want_tag", [
    ("int8", "adagrad", "rows=int8 dim=8 optimizer=adagrad slots=fp32row words=6"),
    ("int8", "adam", "rows=int8 dim=8 optimizer=adam slots=bf16,fp32row words=10"),
    ("bf16", "ftrl", "rows=bf16 dim=8 optimizer=ftrl slots=bf16,bf16 words=12"),
    ("fp32", "adam", "")])
def test_a_save_holds_the_stored_words_and_restores_them_to_the_bit(tmp_path, rows, optimizer, want_tag):
    """A checkpoint's rows (TtfTableSave) are the row store's words, with the layout tag (fp32:
    the full layout, no tag, as before): into the same layout they come back to the bit (the
    table checksum); into another format they convert as the full layout would."""
    keys = np.arange(1, 1500, 5, dtype=np.int64)
    src = trained(rows, keys, optimizer=optimizer)
    saved, tag = save_stored(src, tmp_path / "s")
    assert tag == want_tag
    assert saved["values"].shape == (len(export(src)["keys"]), 24 if rows == "fp32" else int(tag.split("words=")[1]))
    if rows == "fp32":  # the full layout, as an export holds it
        np.testing.assert_array_equal(by_key_values(saved), export(src)["values"])
    same = new_table(rows)
    import_stored(same, saved, tag)
    assert checksum(same) == checksum(src)
    for other in {"fp32", "bf16", "int8"} - {rows}:
        converted, through_full = new_table(other), new_table(other)
        import_stored(converted, saved, tag)
        import_(through_full, export(src))
        assert checksum(converted) == checksum(through_full), other


def by_key_values(saved):
    return saved["values"].numpy()[np.argsort(saved["keys"].numpy(), kind="stable")]


def test_rows_saved_without_slots_restore_with_the_optimizers_slots(tmp_path):
    """A shard saved before any update has no slots: into the job's optimizer its slots start at
    slot_init (as the full layout's padding gives them)."""
    plain = fp32_export()
    plain.update(values=plain["values"][:, :8], optimizer=b"", slot_init=np.zeros([0], np.float32))
    src = new_table("int8")
    import_(src, plain)
    saved, tag = save_stored(src, tmp_path / "s")
    assert tag == "rows=int8 dim=8 optimizer= slots= words=4"
    saved.update(optimizer=b"adagrad", slot_init=np.array([0.1], np.float32))
    restored = new_table("int8")
    import_stored(restored, saved, tag)
    got = export(restored)
    np.testing.assert_array_equal(got["values"][:, :8], export(src)["values"][:, :8])
    np.testing.assert_array_equal(got["values"][:, 8:], np.full((len(plain["keys"]), 8), 0.1, np.float32))


@pytest.mark.parametrize("tag,match", [
    ("rows=int4 dim=8 optimizer=adam slots=bf16,fp32row words=10", "cannot be read"),
    ("int8", "cannot be read"),
    ("rows=int8 dim=8 optimizer=adam slots=bf16,bf16 words=12", "does not fit this ttf's rows"),
    ("rows=int8 dim=4 optimizer=adam slots=bf16,fp32row words=7", "restore it into a table of dim 4"),
    ("rows=int8 dim=8 optimizer=ftrl slots=bf16,bf16 words=12", "hold the slots of 'ftrl'")])
def test_a_row_layout_tag_that_cannot_be_read_or_does_not_fit_is_refused(tmp_path, tag, match):
    keys = np.arange(1, 300, 5, dtype=np.int64)
    saved, _ = save_stored(trained("int8", keys), tmp_path / "s")
    h = trained("int8", keys[:20])
    before = checksum(h)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        import_stored(h, saved, tag)
    assert checksum(h) == before  # untouched


def test_compressed_rows_take_less_memory():
    n, dim = 20_000, 32
    keys = np.arange(n, dtype=np.int64)
    per_key = {}
    for rows in ("fp32", "bf16", "int8"):
        h = new_table(rows, dim)
        ops().ttf_table_apply_adam(h, keys, np.zeros((n, dim), np.float32), *ADAM, 1)
        per_key[rows] = int(ops().ttf_table_stats(h)[1]) / n
    # row store + meta + index: fp32 Adam 384 bytes of row, bf16 192, int8 40 + 64 + 4 (+ meta, index)
    assert per_key["bf16"] < 0.6 * per_key["fp32"], per_key
    assert per_key["int8"] < 0.4 * per_key["fp32"], per_key


def test_layers_and_table_config_take_rows():
    layer = ttf.DynamicEmbedding(4, **ttf.embedding.TableConfig(rows="int8").layer_options())
    ids = tf.constant([[1, 2], [3, 1]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True) ** 2)
    grads = tape.gradient(loss, layer.trainable_variables)
    ttf.optimizers.Adam(0.01).apply_gradients(zip(grads, layer.trainable_variables))
    assert int(layer.size()) == 3
    assert layer.get_config()["rows"] == "int8"
    assert type(layer).from_config(layer.get_config()).tables[0].rows == "int8"


def test_an_unknown_row_format_is_refused_in_one_line():
    cases = [lambda: ttf.embedding.EmbeddingTable(4, rows="int4"), lambda: ttf.embedding.TableConfig(rows="fp16")]
    for make in cases:
        with pytest.raises(ValueError, match="rows must be one of") as err:
            make()
        assert "\n" not in str(err.value)
    # the op itself refuses it too (a graph written by hand)
    with pytest.raises(tf.errors.InvalidArgumentError, match="int4"):
        ops().ttf_embedding_table(dim=4, rows="int4", shared_name=f"rows_{next(_names)}")


def test_accelerate_passes_table_rows_to_every_table():
    ids = tf.keras.Input([2], dtype=tf.int32)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(50, 4)(ids)))
    model = tf.keras.Model(ids, out)
    fast = ttf.accelerate(model, table_rows="bf16")
    tables = [table for layer in ttf.embedding.tables_in(fast) for table in layer.tables]
    assert tables and all(table.rows == "bf16" for table in tables)
    # the carried-over rows read back as their bf16 rounding
    rows = fast.layers[1](tf.constant([[3, 7]], tf.int64)).numpy()[0]
    np.testing.assert_array_equal(rows, bf16_nearest(model.layers[1].get_weights()[0][[3, 7]]))
    with pytest.raises(ValueError, match="rows must be one of"):
        ttf.accelerate(model, table_rows="fp8")
