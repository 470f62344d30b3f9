"""ttf.serving.Publisher and DeltaFollower: a base version plus deltas, applied in place.

The reference is the trainer's own table: every key's row as TtfTableExport gives it (float32
bit for bit; float16 rows equal the trainer's rows cast to float16), and the default row for
every key the trainer deleted or never held.
"""
import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.serving import _publish
from ttf.serving._frozen import overlay_key

DIM = 4


class Clock:
    """A clock the test moves by hand (publish intervals without sleeping)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_model(shards=2):
    ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
    embedded = ttf.FusedEmbedding(DIM, num_fields=2, name="sparse", shard_devices=["/cpu:0"] * shards)(ids)
    out = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Flatten()(embedded))
    model = tf.keras.Model(ids, out)
    model(tf.constant([[1, 2]], tf.int64))
    return model, ttf.optimizers.Adagrad(0.1)


def train(model, optimizer, ids):
    """One step on ids int64 [B, 2] (label 1)."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.ones([len(ids), 1]), logits=model(tf.constant(ids, tf.int64), training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def trainer_rows(layer):
    """{key: row float32 [dim]} of every key the trainer's table holds."""
    rows = {}
    for table in layer.tables:
        exported = table.export()
        for key, row in zip(exported["keys"].numpy(), exported["values"].numpy()[:, :DIM]):
            rows[int(key)] = row
    return rows


def assert_follower_equals_trainer(follower, layer, keys_ever, dtype=np.float32):
    expected = trainer_rows(layer)
    keys = np.array(sorted(set(keys_ever) | set(expected)), np.int64)
    served = follower.lookup(layer.name, keys).numpy()
    default = np.zeros([DIM], np.float32)
    want = np.stack([expected[k].astype(dtype).astype(np.float32) if k in expected else default for k in keys])
    np.testing.assert_array_equal(served, want)  # bit for bit: rows are copied, never recomputed
    return len(expected), len(keys) - len(expected)


def layer_keys(layer, ids):
    return [int(k) for k in layer.keys_of(tf.constant(ids, tf.int64))[0].numpy().ravel()]


@pytest.mark.parametrize("row_dtype", [tf.float32, pytest.param(tf.float16, marks=pytest.mark.slow)])
def test_base_and_deltas_equal_the_trainers_table_deletes_included(tmp_path, row_dtype):
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, tmp_path / "ctr", publish_every=5, dense_publish_every=10,
                                      row_dtype=row_dtype, clock=clock)
    rng = np.random.default_rng(0)
    seen = []
    for step in range(3):
        ids = rng.integers(0, 200, size=[16, 2])
        seen += layer_keys(layer, ids)
        train(model, optimizer, ids)
    layer.reset_deleted()  # a checkpoint's record of deleted keys starts here
    assert publisher.maybe_publish() == (1, 0)  # the first publish is a base version
    follower = ttf.serving.DeltaFollower(tmp_path / "ctr")
    assert (follower.version, follower.sequence) == (1, 0)
    evicted_total, evicted_keys = 0, set()
    for delta in range(1, 5):
        for _ in range(3):
            ids = rng.integers(0, 400, size=[16, 2])
            seen += layer_keys(layer, ids)
            train(model, optimizer, ids)
        # evict the ids not trained in the last 2 table steps: deletions the deltas carry
        step = int(layer.tables[0].stats()[2])
        before = set(trainer_rows(layer))
        evicted_total += int(layer.evict(before_step=step - 1))
        evicted_keys |= before - set(trainer_rows(layer))
        assert publisher.maybe_publish() is None  # not due yet
        clock.now += 5
        assert publisher.maybe_publish() == (1, delta)
        assert follower.sync() == 1 and follower.sequence == delta
        held, absent = assert_follower_equals_trainer(follower, layer, seen, row_dtype.as_numpy_dtype)
    assert evicted_total > 0 and absent > 0 and held > 0
    # dense weights went out with the deltas at clock 10 and 20: predictions match the live model
    ids = tf.constant(rng.integers(0, 400, size=[8, 2]), tf.int64)
    if row_dtype == tf.float32:
        np.testing.assert_allclose(follower.predict({"ids": ids})["logits"].numpy(),
                                   model(ids, training=False).numpy(), rtol=0, atol=1e-6)
    # the checkpoint's own record of deleted keys was never reset by publishing
    deleted = np.concatenate([t.export(since_step=0)["deleted_keys"].numpy() for t in layer.tables])
    assert set(deleted.tolist()) == evicted_keys
    manifest = json.load(open(os.path.join(ttf.serving.delta_folder(str(tmp_path / "ctr"), 1, 4), "manifest.json")))
    assert manifest["base_version"] == 1 and manifest["sequence"] == 4 and len(manifest["parts"]) == 2


def publish_chain(base, deltas=3):
    """A model, its publisher and a base + `deltas` deltas with new rows each."""
    model, optimizer = make_model(shards=1)
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=1, clock=clock)
    train(model, optimizer, [[1, 2]])
    publisher.publish()
    for d in range(deltas):
        train(model, optimizer, [[10 + d, 20 + d]])
        clock.now += 1
        publisher.publish()
    return model, optimizer, publisher, clock


def test_follower_refuses_a_gap_a_duplicate_and_a_wrong_base_then_resyncs(tmp_path, capfd):
    base = str(tmp_path / "ctr")
    model, optimizer, publisher, clock = publish_chain(base)
    layer = model.get_layer("sparse")

    follower = ttf.serving.DeltaFollower(base)  # loads the base and applies what follows
    assert (follower.version, follower.sequence) == (1, 3) and follower.sync() == 0
    assert not follower.apply(ttf.serving.delta_folder(base, 1, 2))  # duplicate
    assert "duplicate" in follower.refused and follower.sequence == 3
    assert capfd.readouterr().err.count("DeltaFollower refuses") == 1

    # a gap: delta 2 is missing while 3 is there
    gap = str(tmp_path / "gap")
    shutil.copytree(base, gap)
    shutil.rmtree(ttf.serving.delta_folder(gap, 1, 2))
    behind = ttf.serving.DeltaFollower(gap)
    assert behind.sequence == 1 and "gap" in behind.refused  # delta 1 applied, then refused
    one = behind.lookup("sparse", layer_keys(layer, [[10, 20]])).numpy()
    assert np.any(one != 0)  # delta 1's rows are served
    assert np.all(behind.lookup("sparse", layer_keys(layer, [[11, 21]])).numpy() == 0)  # delta 2's are not

    # a wrong base: a delta of version 1 under version 2
    publisher.publish_base()  # version 2
    wrong = ttf.serving.delta_folder(base, 2, 1)
    shutil.copytree(ttf.serving.delta_folder(base, 1, 1), wrong)
    fresh = ttf.serving.DeltaFollower(base)
    assert fresh.version == 2 and "wrong base" in fresh.refused and fresh.sequence == 0
    assert "wrong base" in capfd.readouterr().err

    # re-sync from the next base: follower (refused a duplicate) moves to version 3 and its deltas
    shutil.rmtree(wrong)
    publisher.publish_base()
    train(model, optimizer, [[7, 8]])
    clock.now += 1
    assert publisher.publish() == (3, 1)
    assert follower.sync() == 1 and (follower.version, follower.sequence, follower.refused) == (3, 1, None)
    assert_follower_equals_trainer(follower, layer, layer_keys(layer, [[7, 8], [1, 2]]))


def test_a_half_written_delta_is_never_applied(tmp_path):
    base = str(tmp_path / "ctr")
    model, optimizer, publisher, clock = publish_chain(base, deltas=2)
    layer = model.get_layer("sparse")
    keep = str(tmp_path / "whole")
    shutil.copytree(ttf.serving.delta_folder(base, 1, 2), keep)

    # a publisher's temporary folder (no manifest, not renamed) and a delta without its manifest
    shutil.copytree(keep, os.path.join(base, "deltas", "1", ".tmp-2-999"))
    os.remove(os.path.join(ttf.serving.delta_folder(base, 1, 2), "manifest.json"))
    follower = ttf.serving.DeltaFollower(base)
    assert follower.sequence == 1 and follower.refused is None  # waits for delta 2 to be whole
    shutil.copy(os.path.join(keep, "manifest.json"), ttf.serving.delta_folder(base, 1, 2))
    assert follower.sync() == 1 and follower.sequence == 2
    assert_follower_equals_trainer(follower, layer, [])

    # a damaged part: refused by its checksum, nothing of it applied
    train(model, optimizer, [[30, 31]])
    clock.now += 1
    publisher.publish()
    part = os.path.join(ttf.serving.delta_folder(base, 1, 3), "sparse-0-0.delta")
    data = open(part, "rb").read()
    open(part, "wb").write(data[: len(data) // 2])
    assert follower.sync() == 0 and "checksum" in follower.refused and follower.sequence == 2
    assert np.all(follower.lookup("sparse", layer_keys(layer, [[30, 31]])).numpy() == 0)


@pytest.mark.parametrize("damage", ["traversal", "absolute", "missing_field", "not_json", "unknown_table"])
def test_a_manifest_never_makes_the_follower_read_outside_its_delta(tmp_path, damage):
    """The delta folder is untrusted input: a part file naming another place, a manifest
    missing a field or not JSON, a part of a table the base lacks: one clear refusal, nothing
    applied, nothing read outside the folder."""
    base = str(tmp_path / "ctr")
    publish_chain(base, deltas=2)
    secret = tmp_path / "outside.delta"
    secret.write_bytes(b"not for the follower")
    manifest_path = os.path.join(ttf.serving.delta_folder(base, 1, 2), "manifest.json")
    manifest = json.load(open(manifest_path))
    if damage == "traversal":
        manifest["parts"][0]["file"] = "../../../../outside.delta"
    elif damage == "absolute":
        manifest["parts"][0]["file"] = str(secret)
    elif damage == "missing_field":
        del manifest["parts"][0]["fingerprint"]
    elif damage == "unknown_table":
        manifest["parts"][0]["table"] = "elsewhere"
    with open(manifest_path, "w") as f:
        f.write("{not json" if damage == "not_json" else json.dumps(manifest))
    follower = ttf.serving.DeltaFollower(base)
    assert follower.sequence == 1 and follower.refused is not None
    assert {"traversal": "not a file name in the delta's folder", "absolute": "not a file name in the delta's folder",
            "missing_field": "malformed", "not_json": "not a delta manifest",
            "unknown_table": "which base version 1 lacks"}[damage] in follower.refused


def test_a_full_disk_pauses_publishing_training_goes_on_and_it_resumes(tmp_path, monkeypatch, capfd):
    """ENOSPC injected at the part write (ttf.serving._publish._write_file)."""
    base = str(tmp_path / "ctr")
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=1, clock=clock)
    train(model, optimizer, [[1, 2], [3, 4]])
    publisher.publish()
    follower = ttf.serving.DeltaFollower(base)
    real_write = _publish._write_file

    def full(path, blob):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(_publish, "_write_file", full)
    seen = layer_keys(layer, [[1, 2], [3, 4]])
    for i in range(3):  # training goes on; each publish fails and leaves nothing visible
        ids = [[100 + i, 200 + i]]
        seen += layer_keys(layer, ids)
        train(model, optimizer, ids)
        layer.evict(before_step=int(layer.tables[0].stats()[2]) - 1)  # deletions while the disk is full
        clock.now += 1
        assert publisher.maybe_publish() is None
    err = capfd.readouterr().err
    assert err.count("publishing to") == 1 and "No space left on device" in err and "paused" in err
    assert publisher.paused and not os.listdir(os.path.join(base, "deltas", "1"))

    monkeypatch.setattr(_publish, "_write_file", real_write)
    clock.now += 1
    assert publisher.maybe_publish() == (1, 1)
    assert "resumed" in capfd.readouterr().err and publisher.paused is None
    assert follower.sync() == 1
    held, absent = assert_follower_equals_trainer(follower, layer, seen)
    assert absent > 0  # the deletions made while paused reached the follower


def test_publisher_rejects_bad_arguments(tmp_path):
    model, _ = make_model(shards=1)
    with pytest.raises(ValueError, match="publish_every must be > 0"):
        ttf.serving.Publisher(model, tmp_path, publish_every=0)
    with pytest.raises(ValueError, match="row_dtype"):
        ttf.serving.Publisher(model, tmp_path, row_dtype=tf.bfloat16)
    plain = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="holds no ttf table"):
        ttf.serving.Publisher(plain, tmp_path)
    with pytest.raises(ValueError, match="no base version yet"):
        ttf.serving.Publisher(model, tmp_path).publish_delta()


def test_delta_size_is_rows_only(tmp_path):
    """A delta's part files hold keys and rows (no optimizer slots, no meta): at most
    1.1 x touched x (8 + 4 x dim) bytes plus a fixed header."""
    model, optimizer = make_model(shards=1)
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, tmp_path, publish_every=1, clock=clock)
    publisher.publish()
    ids = np.arange(2000).reshape(-1, 2)
    train(model, optimizer, ids)
    clock.now += 1
    publisher.publish()
    manifest = json.load(open(os.path.join(ttf.serving.delta_folder(str(tmp_path), 1, 1), "manifest.json")))
    touched = sum(p["rows"] for p in manifest["parts"])
    assert touched == int(layer.size()) == 2000
    size = sum(p["bytes"] for p in manifest["parts"])
    assert size <= 1.1 * touched * (8 + 4 * DIM) + 256, size


# A fresh interpreter that never imports ttf: drives apply_delta and lookup as TF Serving would.
PLAIN_TF_APPLY = r"""
import sys
import numpy as np
import tensorflow as tf

path, arrays, out = sys.argv[1:]
given = dict(np.load(arrays))
loaded = tf.saved_model.load(path)
apply = loaded.signatures["apply_delta"]
delta = dict(keys_0=tf.constant(given["keys"]), rows_0=tf.constant(given["rows"]),
             deleted_0=tf.constant(given["deleted"]))
print(apply(sequence=tf.constant(1, tf.int64), base_version=tf.constant(1, tf.int64), **delta)["sequence"].numpy())
for sequence, version in ((3, 1), (1, 1), (2, 7)):  # a gap, a duplicate, another base: refused in the graph
    try:
        apply(sequence=tf.constant(sequence, tf.int64), base_version=tf.constant(version, tf.int64), **delta)
        raise SystemExit(f"apply_delta accepted sequence {sequence} of base {version}")
    except tf.errors.InvalidArgumentError as error:
        print("refused:", "gap or a duplicate" in error.message or "for base version" in error.message)
np.save(out, loaded.signatures["lookup"](keys_0=tf.constant(given["probe"]))["rows_0"].numpy())
assert not any(name.startswith("ttf") for name in sys.modules)
"""


def test_apply_delta_runs_in_plain_tensorflow(tmp_path):
    model, optimizer = make_model(shards=1)
    layer = model.get_layer("sparse")
    train(model, optimizer, [[1, 2], [3, 4]])
    path = ttf.export_for_serving(model, str(tmp_path / "ctr"))
    held = trainer_rows(layer)
    keys = sorted(held)
    upserted = np.array([keys[0], 1 << 50], np.int64)  # one held key changed, one new key
    rows = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    deleted = np.array([keys[1], keys[0]], np.int64)  # keys[0] deleted then re-added in the same delta
    probe = np.array(keys + [1 << 50, 1 << 51], np.int64)
    np.savez(tmp_path / "arrays.npz", keys=upserted, rows=rows, deleted=deleted, probe=probe)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-c", PLAIN_TF_APPLY, path, str(tmp_path / "arrays.npz"),
                           str(tmp_path / "rows.npy")], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["1", "refused:", "True", "refused:", "True", "refused:", "True"]
    served = np.load(tmp_path / "rows.npy")
    want = [rows[0] if k == keys[0] else np.zeros(DIM) if k == keys[1] else held[k] for k in keys]
    want += [rows[1], np.zeros(DIM)]
    np.testing.assert_array_equal(served, np.array(want, np.float32))


@pytest.mark.slow
def test_ps_cluster_each_ps_writes_its_own_rows_and_the_follower_equals_the_trainer():
    """2 real PS servers: each part's rows are serialized on the shard's PS (never on the
    chief), and base + 3 deltas (evictions included) serve every key bit for bit."""
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, os.path.join(here, "ps_cluster_publish.py")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["sequence"] == 3 and found["refused"] is None and found["equal"], found
    assert found["keys"] > found["held"] > 0  # some keys were deleted
    assert len(found["parts"]) == 3 * 2, found  # 3 deltas x 2 shards
    for name, device in found["parts"]:
        shard = int(name.split("-")[1])
        assert f"/job:ps/replica:0/task:{shard}/" in device, found


@pytest.mark.slow
def test_a_real_full_tmpfs_pauses_publishing_and_freeing_room_resumes_it(tmp_path, capfd):
    """The same on a real 4 MiB tmpfs (mount needs root: skipped otherwise), filled to the
    last byte by a filler file that is then removed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        base = str(disk / "ctr")
        model, optimizer = make_model(shards=1)
        layer = model.get_layer("sparse")
        clock = Clock()
        publisher = ttf.serving.Publisher(model, base, publish_every=1, clock=clock)
        train(model, optimizer, [[1, 2]])
        assert publisher.publish() == (1, 0)
        follower = ttf.serving.DeltaFollower(base)
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # unbuffered: every page left
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
        finally:
            os.close(fd)
        seen = layer_keys(layer, [[1, 2]])
        for i in range(2):
            ids = np.arange(64).reshape(32, 2) + 100 * (i + 1)
            seen += layer_keys(layer, ids)
            train(model, optimizer, ids)
            clock.now += 1
            assert publisher.maybe_publish() is None
        err = capfd.readouterr().err
        assert err.count("ttf: publishing to") == 1 and "paused" in err, err
        filler.unlink()
        clock.now += 1
        assert publisher.maybe_publish() == (1, 1)
        assert "resumed" in capfd.readouterr().err
        assert follower.sync() == 1
        assert_follower_equals_trainer(follower, layer, seen)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_applying_a_delta_never_copies_the_whole_overlay():
    """A delta's cost is its own rows: the apply graph reads no value of the overlay's rows
    (a variable's scatter_nd_update returns such a read, a copy of every row applied since the
    base: at 10M rows each 16k-row delta cost ~0.6 CPU s)."""
    model, _ = make_model(shards=1)
    table = ttf.serving.HashedTable(model.get_layer("sparse"))
    apply = tf.function(table.apply).get_concrete_function(
        tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, DIM], tf.float32), tf.TensorSpec([None], tf.int64))
    handle = next(inside for outside, inside in apply.graph.captures if outside is table.overlay_rows.handle)
    reads = [op for op in apply.graph.get_operations() if op.type == "ReadVariableOp" and op.inputs[0] is handle]
    assert reads == []
    keys = tf.constant([5, 6], tf.int64)
    apply(keys, tf.ones([2, DIM]), tf.zeros([0], tf.int64))
    np.testing.assert_array_equal(table.lookup(keys).numpy(), np.ones([2, DIM], np.float32))


def test_the_overlay_holds_mixed_keys_and_refuses_only_its_two_reserved_keys():
    """The overlay's DenseHashTable hashes an int64 key as itself, so it holds each key's SplitMix64
    hash instead (ttf's keys of one id in 26 fields differ in their high bits only: unmixed they
    shared one probe chain). Keys the table reserved before (-2^63, -2^63 + 1) now apply; the two
    whose hashes are its markers are refused."""
    model, _ = make_model(shards=1)
    table = ttf.serving.HashedTable(model.get_layer("sparse"))
    fields = tf.constant([(f << 56) | 7 for f in range(26)] + [-(1 << 63), -(1 << 63) + 1], tf.int64)
    rows = tf.reshape(tf.range(28 * DIM, dtype=tf.float32), [28, DIM])
    table.apply(fields, rows, tf.zeros([0], tf.int64))
    np.testing.assert_array_equal(table.lookup(fields).numpy(), rows.numpy())
    np.testing.assert_array_equal(overlay_key(tf.constant(ttf.serving.HashedTable.RESERVED_KEYS,
                                                                      tf.int64)).numpy(),
                                  [ttf.serving.HashedTable.EMPTY_KEY, ttf.serving.HashedTable.EMPTY_KEY + 1])
    for reserved in ttf.serving.HashedTable.RESERVED_KEYS:
        with pytest.raises(tf.errors.InvalidArgumentError):
            table.apply(tf.constant([reserved], tf.int64), tf.ones([1, DIM]), tf.zeros([0], tf.int64))
