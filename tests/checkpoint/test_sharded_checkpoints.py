"""The sharded, streamed checkpoint format (ttf/checkpoint/_format.py) and the checkpoint
folder as untrusted input: rows saved and restored where they live, across topologies,
bit for bit; the earlier format restores; a moved folder restores; a failed save changes
nothing; chain entries outside the folder and corrupt files give one clear error."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from table_order import by_key

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")


def layer_and_optimizer(num_shards=2):
    layer = ttf.DynamicEmbedding(4, seed=3, admission_min_count=2, shard_devices=["/cpu:0"] * num_shards, name="emb")
    layer(tf.constant([[0, 0]], tf.int64))  # built: its tables exist before a restore
    return layer, ttf.optimizers.Adam(0.05)


def train(layer, optimizer, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(tf.constant(ids, tf.int64), training=True)))
    optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))


def assert_same_table(got, want):
    got, want = by_key(got), by_key(want)
    for name in FIELDS:  # bit-identical: exact equality, no tolerance
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def manager_of(layer, directory, full_every=4):
    return ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer), str(directory), full_every=full_every)


def trained_chain(directory, full_every=4, seed=0):
    """A full checkpoint (step 1) and a delta (step 2) carrying an eviction; returns the live layer."""
    layer, optimizer = layer_and_optimizer()
    rng = np.random.default_rng(seed)
    manager = manager_of(layer, directory, full_every)
    train(layer, optimizer, rng.integers(0, 80, size=(64, 2)))
    manager.save(1)
    train(layer, optimizer, rng.integers(40, 120, size=(64, 2)))
    layer.evict(min_count=2)
    manager.save(2)
    return layer


def test_ps_cluster_save_and_restore_keep_each_shards_rows_on_its_ps():
    """2 PS -> 3 PS and -> the chief alone (full + delta with evictions), on real servers:
    every traced op reading a shard's rows runs on its PS, several pieces per shard, and
    the restored tables are bit-identical."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, "ps_cluster_checkpoint.py")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["save_misplaced"] == [] and found["three_ps_restore_misplaced"] == [], found
    assert found["pieces"] > 2 * 2, found  # bounded pieces: more than one per shard
    assert found["delta"] == "delta-2" and found["keys"] > 100
    for target in ("three_ps", "chief"):
        assert found[f"{target}_step"] == 2 and found[f"{target}_differences"] == [], found
        assert found[f"{target}_dense"] == 1.5
        assert sum(found[f"{target}_shard_sizes"]) == found["keys"]
    assert min(found["three_ps_shard_sizes"]) > 0  # ids all multiples of 3 still reach every PS
    assert "ttf: restoring emb from 2 shards into 3" in proc.stderr


def test_every_shard_is_written_as_its_own_source(tmp_path):
    layer, optimizer = layer_and_optimizer(num_shards=3)
    for _ in range(2):  # seen twice: admitted (admission_min_count=2)
        train(layer, optimizer, np.arange(300).reshape(150, 2))
    path = tf.train.Checkpoint(layer=layer).write(str(tmp_path / "c"))
    names = dict(tf.train.list_variables(path))
    sizes = [names[f"layer/logical_table/ttf/src-{i}/part-0/keys"][0] for i in range(3)]
    assert sizes == [int(t.size()) for t in layer.tables] and sum(sizes) == 300
    restored, _ = layer_and_optimizer(num_shards=1)
    tf.train.Checkpoint(layer=restored).read(path)
    assert_same_table(restored.export_table(), layer.export_table())


def test_the_earlier_format_still_restores(tmp_path):
    """A chain written by ttf before the sharded format (fixtures/make_old_format.py, run
    with the main branch): whole-table entries, absolute paths in its chain file, and the
    folder moved since."""
    moved = tmp_path / "moved"
    shutil.copytree(os.path.join(HERE, "fixtures", "old_format"), moved)
    layer, _ = layer_and_optimizer(num_shards=3)
    assert manager_of(layer, moved, full_every=3).restore_latest() == 3
    assert_same_table(layer.export_table(), dict(np.load(moved / "expected.npz")))


def test_a_moved_folder_restores_and_its_chain_holds_names_only(tmp_path):
    live = trained_chain(tmp_path / "a")
    chain = json.loads((tmp_path / "a" / "ttf_chain.json").read_text())
    assert chain == {"full": "ckpt-1", "deltas": ["delta-2"]}
    os.rename(tmp_path / "a", tmp_path / "b")
    layer, _ = layer_and_optimizer(num_shards=3)
    assert manager_of(layer, tmp_path / "b").restore_latest() == 2
    assert_same_table(layer.export_table(), live.export_table())


@pytest.mark.parametrize("entry", ["../outside/ckpt-1", "sub/ckpt-1", "..", "", 7, "/etc/passwd", "ckpt-1/../../x-1"])
def test_chain_entries_leaving_the_folder_are_refused(tmp_path, entry):
    trained_chain(tmp_path / "ckpt")
    chain_file = tmp_path / "ckpt" / "ttf_chain.json"
    chain_file.write_text(json.dumps({"full": "ckpt-1", "deltas": [entry]}))
    layer, _ = layer_and_optimizer()
    with pytest.raises(ValueError, match=r"holds the entry .* not the name of a checkpoint in this folder"):
        manager_of(layer, tmp_path / "ckpt")


def test_an_absolute_entry_is_read_inside_the_folder_only(tmp_path):
    """An absolute path (as earlier ttf wrote) never makes ttf read there: the file of that
    name in the folder is read."""
    live = trained_chain(tmp_path / "ckpt")
    elsewhere = trained_chain(tmp_path / "elsewhere", seed=1)  # another table at the path the entry names
    (tmp_path / "ckpt" / "ttf_chain.json").write_text(
        json.dumps({"full": str(tmp_path / "elsewhere" / "ckpt-1"), "deltas": [str(tmp_path / "elsewhere" / "delta-2")]}))
    files_before = listing(tmp_path / "elsewhere")
    layer, _ = layer_and_optimizer()
    manager_of(layer, tmp_path / "ckpt").restore_latest()
    assert_same_table(layer.export_table(), live.export_table())
    assert by_key(layer.export_table())["keys"].tolist() != by_key(elsewhere.export_table())["keys"].tolist()
    assert listing(tmp_path / "elsewhere") == files_before


def listing(directory):
    return {name: (os.stat(os.path.join(directory, name)).st_size, os.stat(os.path.join(directory, name)).st_mtime_ns)
            for name in os.listdir(directory)}


@pytest.mark.parametrize("content", ['{"full": "ckpt-1", "del', "", "[1, 2]", '{"full": "ckpt-1"}', "\x00\xff"])
def test_a_corrupt_chain_file_is_one_clear_error(tmp_path, content):
    trained_chain(tmp_path)
    (tmp_path / "ttf_chain.json").write_text(content)
    layer, _ = layer_and_optimizer()
    with pytest.raises(ValueError, match="ttf_chain.json is not a ttf chain file"):
        manager_of(layer, tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove", "truncate_index"])
def test_a_missing_or_corrupt_part_names_the_checkpoint(tmp_path, damage):
    trained_chain(tmp_path)
    data = max(tmp_path.glob("delta-2.data-*"), key=lambda p: p.stat().st_size)
    if damage == "remove":
        data.unlink()
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    else:
        target = tmp_path / "delta-2.index" if damage == "truncate_index" else data
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    layer, _ = layer_and_optimizer()
    with pytest.raises(ValueError, match=r"checkpoint .*delta-2 cannot be restored \(a file is missing or corrupt\)"):
        manager_of(layer, tmp_path).restore_latest()


def test_a_failed_save_changes_nothing_and_the_next_delta_holds_everything(tmp_path):
    """The issue's repro: the save at step 3 fails; the next delta must still carry key 3,
    and the keys evicted before the failed save must stay deleted."""
    layer, optimizer = layer_and_optimizer()
    manager = manager_of(layer, tmp_path, full_every=10)

    def admit(*keys):  # seen in two lookups: admitted (admission_min_count=2)
        for _ in range(2):
            train(layer, optimizer, [[k, k] for k in keys])

    admit(1, 2)
    manager.save(1)
    admit(4)
    manager.save(2)
    train(layer, optimizer, [[1, 1]])  # key 1 seen 3 times, 2 and 4 twice
    assert int(layer.evict(min_count=3)) == 2  # removes 2 and 4
    admit(3)
    (tmp_path / "delta-3.index").mkdir()  # the save cannot write its index: it fails
    with pytest.raises(tf.errors.OpError, match=r"the save of .*delta-3 failed \(nothing recorded"):
        manager.save(3)
    assert json.loads((tmp_path / "ttf_chain.json").read_text()) == {"full": "ckpt-1", "deltas": ["delta-2"]}
    admit(5)
    assert manager.save(4).endswith("delta-4")
    restored, _ = layer_and_optimizer(num_shards=3)
    assert manager_of(restored, tmp_path, full_every=10).restore_latest() == 4
    assert sorted(restored.export_table()["keys"].numpy().tolist()) == [1, 3, 5]
    assert_same_table(restored.export_table(), layer.export_table())


def _mix64(x):
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def reference_summary(export):
    """TtfTableSummary's contract in plain Python: size, wrapping sum of per-entry hashes, float sum."""
    mask, checksum = (1 << 64) - 1, 0
    for salt, keys, rows, meta in ((0x5851F42D4C957F2D, export["keys"], export["values"], export["meta"]),
                                   (0x14057B7EF767814F, export["candidate_keys"], None, export["candidate_meta"])):
        for i, key in enumerate(np.asarray(keys).tolist()):
            h = _mix64(salt ^ (key & mask))
            for bits in ([] if rows is None else np.asarray(rows)[i].view(np.uint32).tolist()):
                h = _mix64(h ^ bits)
            h = _mix64(h ^ (int(meta[i][0]) & mask))
            checksum = (checksum + _mix64(h ^ (int(meta[i][1]) & mask))) & mask
    checksum = checksum - (1 << 64) if checksum >= 1 << 63 else checksum
    return len(export["keys"]), checksum, float(np.sum(np.asarray(export["values"], np.float64)))


def test_table_summary_matches_its_reference_and_every_sharding():
    layer, optimizer = layer_and_optimizer(num_shards=2)
    rng = np.random.default_rng(3)
    for _ in range(3):
        train(layer, optimizer, rng.integers(-50, 200, size=(64, 2)))
    export = {name: t.numpy() for name, t in layer.export_table().items()}
    size, checksum, value_sum = ttf.embedding.table_summary(layer)
    want = reference_summary(export)
    assert (size, checksum) == want[:2] and len(export["candidate_keys"]) > 0
    assert value_sum == pytest.approx(want[2], rel=1e-9)  # float64 sums in another order
    for num_shards in (1, 3):
        other, _ = layer_and_optimizer(num_shards)
        other.import_table(layer.export_table())
        assert ttf.embedding.table_summary(other)[:2] == (size, checksum)
    train(layer, optimizer, [[7, 7]])  # one more lookup changes a count: another checksum
    assert ttf.embedding.table_summary(layer)[1] != checksum


@pytest.mark.slow
def test_ten_million_keys_restore_into_another_sharding(tmp_path):
    """10M keys (dim 2, no slots: ~1.5 GiB peak) saved from 2 shards in many pieces and
    restored into 3: the same size and checksum (every key, row and counter)."""
    from ttf._ops import ops
    source = ttf.DynamicEmbedding(2, seed=1, shard_devices=["/cpu:0"] * 2, name="emb")
    source(tf.constant([[0]], tf.int64))
    for start in range(0, 10_000_000, 1_000_000):
        keys = np.arange(start, start + 1_000_000, dtype=np.int64) * 2654435761
        owner = ttf.embedding.shard_of(keys, 2).numpy()
        for i, table in enumerate(source.tables):
            ops().ttf_table_find_or_insert(table.resource_handle, keys[owner == i], dim=2)
    want = ttf.embedding.table_summary(source)
    assert want[0] == 10_000_000
    path = tf.train.Checkpoint(layer=source).write(str(tmp_path / "c"))
    pieces = [n for n, _ in tf.train.list_variables(path) if n.endswith("/keys")]
    assert len(pieces) >= 4  # 320 MB of rows in pieces of at most 64 MiB
    del source
    target = ttf.DynamicEmbedding(2, seed=1, shard_devices=["/cpu:0"] * 3, name="emb")
    target(tf.constant([[0]], tf.int64))
    tf.train.Checkpoint(layer=target).read(path)
    assert ttf.embedding.table_summary(target)[:2] == want[:2]


@pytest.mark.slow
def test_a_kill_during_saves_leaves_the_last_complete_checkpoint(tmp_path):
    """kill -9 of a process saving in a loop (full + deltas), at 5 moments: the folder
    restores to a step at or after the last save that returned, and that step's table
    equals a replay of the same training (same size and checksum)."""
    import random
    import signal
    import time
    script = os.path.join(HERE, "save_loop.py")
    rng = random.Random(7)
    for kill in range(5):
        folder = tmp_path / f"k{kill}"
        proc = subprocess.Popen([sys.executable, script, "--dir", str(folder)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        saved = []
        first = proc.stdout.readline()  # the first save returned: the loop is running
        assert first.startswith("saved"), first
        time.sleep(rng.uniform(0.0, 3.0))
        proc.send_signal(signal.SIGKILL)
        saved += [int(line.split()[1]) for line in [first] + proc.stdout.read().splitlines() if line.startswith("saved")]
        proc.wait()
        layer = ttf.DynamicEmbedding(4, seed=3, shard_devices=["/cpu:0"] * 3, name="emb")
        layer(tf.constant([[0]], tf.int64))
        step = manager_of(layer, folder, full_every=3).restore_latest()
        assert step >= max(saved), (step, saved)
        replay = subprocess.run([sys.executable, script, "--dir", str(folder), "--replay", str(step)],
                                capture_output=True, text=True, timeout=300)
        assert json.loads(replay.stdout.strip().splitlines()[-1]) == list(ttf.embedding.table_summary(layer)[:2])


class _LosesATaskOnce(tf.train.Checkpoint):
    """A checkpoint whose first write fails as a save does when a worker of a parameter-server
    job dies mid-save (the coordinator re-connects the cluster under it): UnavailableError."""

    failures = 1

    def write(self, *args, **kwargs):
        if _LosesATaskOnce.failures:
            _LosesATaskOnce.failures -= 1
            raise tf.errors.UnavailableError(None, None, "Graph execution error:\n\nDetected at node x\n"
                                             "failed to connect to all addresses (worker 1)")
        return super().write(*args, **kwargs)


def test_a_save_lost_to_a_network_error_is_tried_again(tmp_path, capfd):
    layer, optimizer = layer_and_optimizer()
    manager = ttf.checkpoint.CheckpointManager(_LosesATaskOnce(layer=layer, optimizer=optimizer), str(tmp_path),
                                               full_every=4)  # deltas: Checkpoint.write
    train(layer, optimizer, [[1, 2], [1, 2]])
    manager.save(1)
    train(layer, optimizer, [[3, 3], [3, 3]])
    _LosesATaskOnce.failures = 1
    assert manager.save(2, retry_wait=0).endswith("delta-2")  # the second attempt writes it
    assert "[ttf] checkpoint: UnavailableError: ttf: the save of " in capfd.readouterr().err
    restored, _ = layer_and_optimizer(num_shards=3)
    assert manager_of(restored, tmp_path).restore_latest() == 2
    assert_same_table(restored.export_table(), layer.export_table())
    # Three network failures in a row: raised after the retries, nothing recorded.
    _LosesATaskOnce.failures = 3
    with pytest.raises(tf.errors.UnavailableError, match=r"the save of .*delta-3 failed \(nothing recorded"):
        manager.save(3, retries=2, retry_wait=0)
    assert json.loads((tmp_path / "ttf_chain.json").read_text()) == {"full": "ckpt-1", "deltas": ["delta-2"]}


def test_error_summary_names_the_cause_behind_graph_execution_error():
    @tf.function
    def check(x):
        return tf.debugging.check_numerics(x, "bad value in x")

    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        check(tf.constant([float("nan")]))
    assert ttf.distribute.error_summary(error.value) == (
        "InvalidArgumentError: Graph execution error: ... bad value in x : Tensor had NaN values")
