"""Publishing sends what changed (issue 46 item 4): no delta while nothing changes (an idle
job), a delta holds the rows touched since the last one (never the last step's rows again),
the dense weights go with every delta in which they changed, deletions without a step are
published, and a follower joining late replays at most the deltas since the last base.

The reference is the trainer itself: the keys each step touched (layer.keys_of) and its table
(TtfTableExport), as in test_publish.py."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.serving.test_publish import Clock, assert_follower_equals_trainer, layer_keys, make_model, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def manifest(base, version, sequence):
    with open(os.path.join(ttf.serving.delta_folder(base, version, sequence), "manifest.json")) as f:
        return json.load(f)


def deltas(base, version=1):
    folder = os.path.join(base, "deltas", str(version))
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def delta_keys(base, version, sequence):
    """The keys of every part of a delta (read back with stock TF, as the follower does)."""
    keys = []
    for part in manifest(base, version, sequence)["parts"]:
        blob = tf.io.read_file(os.path.join(ttf.serving.delta_folder(base, version, sequence), part["file"]))
        keys += tf.io.parse_tensor(tf.io.parse_tensor(blob, tf.string)[0], tf.int64).numpy().tolist()
    return keys


def test_an_idle_publisher_writes_no_delta_and_a_delta_holds_only_the_rows_since_the_last(tmp_path):
    base = str(tmp_path / "ctr")
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=1, clock=clock)
    train(model, optimizer, [[1, 2], [3, 4]])
    assert publisher.maybe_publish() == (1, 0)
    follower = ttf.serving.DeltaFollower(base)
    for _ in range(40):  # idle: no step, no eviction, for 40 intervals
        clock.now += 1
        assert publisher.maybe_publish() is None
    assert publisher.publish(with_dense=True) == (1, 0)  # a job's last publish, idle: nothing either
    assert deltas(base) == [] and publisher.sequence == 0

    train(model, optimizer, [[5, 6]])
    clock.now += 1
    assert publisher.maybe_publish() == (1, 1)
    assert sorted(delta_keys(base, 1, 1)) == sorted(layer_keys(layer, [[5, 6]]))  # that step's rows only
    assert manifest(base, 1, 1)["dense"] is not None  # the dense weights changed with them
    train(model, optimizer, [[7, 8]])
    train(model, optimizer, [[9, 10]])
    clock.now += 1
    assert publisher.maybe_publish() == (1, 2)
    assert sorted(delta_keys(base, 1, 2)) == sorted(layer_keys(layer, [[7, 8], [9, 10]]))  # not [5, 6] again
    for _ in range(20):
        clock.now += 1
        assert publisher.maybe_publish() is None
    assert deltas(base) == ["0000000001", "0000000002"]
    assert follower.sync() == 2
    assert_follower_equals_trainer(follower, layer, layer_keys(layer, [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]))
    ids = tf.constant([[1, 2], [9, 10]], tf.int64)  # rows and dense weights of the same step
    np.testing.assert_allclose(follower.predict({"ids": ids})["logits"].numpy(), model(ids).numpy(), atol=1e-6)


def test_deletions_without_a_step_are_published_and_dense_every_bounds_the_dense_part(tmp_path):
    base = str(tmp_path / "ctr")
    model, optimizer = make_model(shards=1)
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=1, dense_publish_every=10, clock=clock)
    train(model, optimizer, [[1, 2]])
    publisher.publish()
    train(model, optimizer, [[3, 4]])
    clock.now += 1
    assert publisher.maybe_publish() == (1, 1)
    assert manifest(base, 1, 1)["dense"] is None  # changed, but not due before 10 s
    # an eviction between steps (event-time TTL does this on an idle stream): a delta of deletions only
    evicted = int(layer.evict(before_step=int(layer.tables[0].stats()[2]) + 1))
    assert evicted == 4
    clock.now += 1
    assert publisher.maybe_publish() == (1, 2)
    parts = manifest(base, 1, 2)["parts"]
    assert sum(p["rows"] for p in parts) == 0 and sum(p["deleted"] for p in parts) == 4
    clock.now += 10
    assert publisher.maybe_publish() == (1, 3)  # no row changed, the dense weights did and are due
    assert manifest(base, 1, 3)["dense"] is not None and manifest(base, 1, 3)["parts"] == []
    clock.now += 10
    assert publisher.maybe_publish() is None
    follower = ttf.serving.DeltaFollower(base)
    assert follower.sequence == 3
    assert_follower_equals_trainer(follower, layer, layer_keys(layer, [[1, 2], [3, 4]]))


def test_a_follower_joining_late_replays_only_the_deltas_since_the_last_base(tmp_path):
    """Two hours of one delta every 10 minutes with rebase_every one hour, then two idle hours:
    the first idle hour ends with one last base (it compacts the deltas since the previous one),
    the second writes nothing; a follower joining at any time replays at most the deltas since
    the last base."""
    base = str(tmp_path / "ctr")
    model, optimizer = make_model(shards=1)
    layer = model.get_layer("sparse")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=600, rebase_every=3600, clock=clock)
    train(model, optimizer, [[0, 1]])
    publisher.maybe_publish()
    for interval in range(1, 10):
        train(model, optimizer, [[interval, 100 + interval]])
        clock.now += 600
        publisher.maybe_publish()
    assert (publisher.version, publisher.sequence) == (2, 3)  # the base at minute 60, then 3 deltas
    late = ttf.serving.DeltaFollower(base)
    assert (late.version, late.sequence) == (2, 3)
    published = []
    for _ in range(12):  # two idle hours
        clock.now += 600
        published.append(publisher.maybe_publish())
    assert published == [None, None, (3, 0)] + [None] * 9  # minute 120: the last base; then nothing
    assert ttf.serving.versions(base) == [2, 3] and not os.path.exists(os.path.join(base, "deltas", "3"))
    follower = ttf.serving.DeltaFollower(base)
    assert (follower.version, follower.sequence) == (3, 0)
    assert_follower_equals_trainer(follower, layer, layer_keys(layer, [[0, 1]]))


@pytest.mark.slow  # a fresh TensorFlow process
def test_an_idle_online_job_writes_no_delta(tmp_path):
    """The user's own script (tests/distribute/own_job.py) follows a folder and publishes every
    0.5 s: it trains a file's rows and publishes them, then, with no file arriving for 4 s
    (8 intervals, each an idle poll that asks to publish), writes no delta; its last publish at
    SIGTERM, with nothing new, writes none either."""
    sample = os.path.join(ROOT, "data", "criteo_sample.txt")
    header, *lines = open(sample, encoding="utf-8").read().splitlines(keepends=True)
    incoming, base, journal = tmp_path / "incoming", tmp_path / "publish", tmp_path / "journal"
    incoming.mkdir()
    (tmp_path / "part").write_text(header + "".join(lines[:48]))
    os.rename(tmp_path / "part", incoming / "part-000.txt")
    job = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "distribute", "own_job.py"), "follow",
                            f"folder:{incoming}", "--batch-size", "8", "--journal", str(journal),
                            "--publish", str(base)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and job.poll() is None and not (
                journal.exists() and len(journal.read_text().splitlines()) == 6):
            time.sleep(0.1)  # the file's 6 steps trained
        published = None
        while time.time() < deadline and job.poll() is None and published != deltas(str(base)):
            published = deltas(str(base))
            time.sleep(3.0)  # until the last steps' delta is out (a publish every 0.5 s)
        assert published, "no delta published"
        time.sleep(4.0)
        assert deltas(str(base)) == published  # idle: nothing written
    finally:
        job.send_signal(signal.SIGTERM)
        out = job.communicate(timeout=300)[0]
    assert job.returncode == 0, out[-3000:]
    assert deltas(str(base)) == published and len(open(journal).readlines()) == 6, out[-3000:]
    follower = ttf.serving.DeltaFollower(str(base))
    assert (follower.version, follower.sequence) == (1, len(published)) and follower.refused is None
