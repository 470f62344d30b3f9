"""DeltaFollower in the background: it learns of new deltas by inotify (or polling) and
applies each table update whole while predictions run in another thread."""
import json
import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.serving._publish import FORMAT, MANIFEST, _fingerprint

DIM = 4


def identity_model():
    """ids int64 [B] -> their rows [B, DIM]: predictions are the served rows themselves."""
    ids = tf.keras.Input([], dtype=tf.int64, name="ids")
    model = tf.keras.Model(ids, ttf.DynamicEmbedding(DIM, name="rows")(ids))
    model(tf.constant([1], tf.int64))
    return model


def write_delta(base, version, sequence, keys, value, deleted):
    """Delta `sequence` in the Publisher's format (docs/serving.md), every row of `keys` set to
    `value`, renamed into place whole as a Publisher does."""
    folder = ttf.serving.delta_folder(base, version, sequence)
    temporary = os.path.join(os.path.dirname(folder), f".tmp-{sequence}")
    os.makedirs(temporary)
    blob = tf.io.serialize_tensor(tf.stack([
        tf.io.serialize_tensor(tf.constant(keys, tf.int64)),
        tf.io.serialize_tensor(tf.fill([len(keys), DIM], float(value))),
        tf.io.serialize_tensor(tf.constant(deleted, tf.int64))]))
    tf.io.write_file(os.path.join(temporary, "rows-0-0.delta"), blob)
    manifest = {"format": FORMAT, "base_version": version, "sequence": sequence, "row_dtype": "float32",
                "tables": ["rows"], "dense": None,
                "parts": [{"file": "rows-0-0.delta", "table": "rows", "shard": 0, "rows": len(keys),
                           "deleted": len(deleted), "fingerprint": _fingerprint(blob)}]}
    with open(os.path.join(temporary, MANIFEST), "w") as f:
        json.dump(manifest, f)
    os.rename(temporary, folder)


def wait_for(condition, what, seconds=10):
    limit = time.monotonic() + seconds
    while not condition() and time.monotonic() < limit:
        time.sleep(0.002)
    assert condition(), f"the follower did not apply {what} within {seconds} s"


def test_a_prediction_never_sees_a_mix_of_two_deltas_rows(tmp_path):
    """Delta v sets the rows of A (always the same keys) and of N_v (keys new in delta v) to v,
    and deletes N_{v-1}; a prediction of every key must equal the state after exactly one
    delta: A = N_v = v, every other key the default row 0. Before the table update was swapped
    whole, a prediction could see A at v while N_v still read 0, or N_{v-1} deleted while A
    was still v - 1. poll_seconds is 60: only inotify can make the follower this quick, for the
base (published after the follower started) and for each delta."""
    base = str(tmp_path / "ctr")
    follower = ttf.serving.DeltaFollower(base, poll_seconds=60).start()  # before anything is published
    assert follower.watcher == "inotify" and follower.version is None
    ttf.serving.Publisher(identity_model(), base).publish()  # the base: no row held, every key reads 0
    wait_for(lambda: follower.version == 1, "the base version")
    deltas, fresh = 30, 400
    always = np.arange(1, 4001, dtype=np.int64)
    new = [np.arange(10_000 + v * fresh, 10_000 + (v + 1) * fresh, dtype=np.int64) for v in range(deltas + 1)]
    ids = tf.constant(np.concatenate([always] + new[1:]))
    seen, mixed, done = [], [], threading.Event()

    def predict_loop():
        while not done.is_set():
            rows = follower.predict({"ids": ids})["logits"].numpy()
            value = rows[:, 0]
            version = int(value[0])  # A's value names the delta the prediction saw
            want = np.zeros(len(value), np.float32)
            want[: len(always)] = version
            if version > 0:
                start = len(always) + (version - 1) * fresh
                want[start: start + fresh] = version
            if not (np.array_equal(value, want) and np.all(rows == value[:, None])):
                mixed.append(version)
            seen.append(version)

    reader = threading.Thread(target=predict_loop)
    reader.start()
    try:
        for v in range(1, deltas + 1):
            deleted = new[v - 1] if v > 1 else np.zeros([0], np.int64)
            write_delta(base, 1, v, np.concatenate([always, new[v]]), v, deleted)
            wait_for(lambda: follower.sequence == v, f"delta {v}")
            time.sleep(0.01)  # a few predictions on this delta's rows
    finally:
        done.set()
        reader.join()
        follower.stop()
    assert mixed == [], f"{len(mixed)} of {len(seen)} predictions mixed two deltas' rows"
    assert seen == sorted(seen)  # never back to older rows
    assert len(set(seen)) >= deltas // 3, sorted(set(seen))  # predictions ran while deltas were applied


def test_polling_follows_too_and_stop_ends_the_thread(tmp_path):
    base = str(tmp_path / "ctr")
    ttf.serving.Publisher(identity_model(), base).publish()
    with ttf.serving.DeltaFollower(base, watch="polling", poll_seconds=0.05) as follower:
        assert follower.watcher == "polling (asked for)"
        write_delta(base, 1, 1, [5, 6], 2.0, [])
        wait_for(lambda: follower.sequence == 1, "delta 1")
        np.testing.assert_array_equal(follower.lookup("rows", [5, 6, 7]).numpy()[:, 0], [2, 2, 0])
        thread = follower._thread
    assert not thread.is_alive()
    with pytest.raises(ValueError, match="watch must be 'auto' or 'polling'"):
        ttf.serving.DeltaFollower(base, watch="inotify")
