"""Every path through TensorFlow's file systems (issue 48 item 6), on TF's in-process ram://
file system, in one process: a checkpoint chain (ttf.checkpoint.CheckpointManager) restored
into a fresh model, ttf.export_for_serving loaded back, and a Publisher's base and deltas
followed by a DeltaFollower. ram:// has no folder rename (a renamed folder leaves its files
behind), as object stores have none: versions and deltas are written in place with their
marker last, and the follower waits for it."""
import json
import os
import uuid

import numpy as np
import tensorflow as tf

import ttf
from tests.serving.test_publish import DIM, Clock, layer_keys, make_model, train, trainer_rows


def ram(name):
    return f"ram://{uuid.uuid4().hex}/{name}"  # one process, one file system: a fresh root per test


def served_rows(follower, layer, keys):
    return follower.lookup(layer.name, np.array(keys, np.int64)).numpy()


def test_checkpoint_chain_on_ram_restores_bit_for_bit():
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    directory = ram("ckpt")
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), directory,
                                               full_every=3)
    train(model, optimizer, [[1, 2], [3, 4]])
    assert manager.save(step=1).endswith("ckpt-1")
    train(model, optimizer, [[5, 6]])
    layer.evict(before_step=2)  # a deletion the delta carries
    assert manager.save(step=2).endswith("delta-2")
    want = trainer_rows(layer)
    fresh, fresh_optimizer = make_model()
    restored = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=fresh, optimizer=fresh_optimizer),
                                                directory, full_every=3)
    assert restored.restore_latest() == 2
    got = trainer_rows(fresh.get_layer("sparse"))
    assert sorted(got) == sorted(want) and len(want) == 2
    for key, row in want.items():
        np.testing.assert_array_equal(got[key], row)
    assert json.loads(tf.io.gfile.GFile(os.path.join(directory, "ttf_chain.json")).read())["deltas"] == ["delta-2"]


def test_export_publish_and_follow_on_ram():
    model, optimizer = make_model()
    layer = model.get_layer("sparse")
    train(model, optimizer, [[1, 2], [3, 4]])
    exported = ttf.export_for_serving(model, ram("export"))
    ids = tf.constant([[1, 2], [3, 9]], tf.int64)
    loaded = tf.saved_model.load(exported)
    np.testing.assert_allclose(loaded.signatures["serving_default"](ids=ids)["logits"].numpy(),
                               model(ids).numpy(), atol=1e-6)
    assert not [n for n in tf.io.gfile.listdir(os.path.dirname(exported)) if n.startswith(".tmp")]

    base = ram("publish")
    clock = Clock()
    publisher = ttf.serving.Publisher(model, base, publish_every=1, clock=clock)
    assert publisher.publish() == (1, 0)
    follower = ttf.serving.DeltaFollower(base).start()
    try:
        assert follower.watcher.startswith("polling") and follower.version == 1
        train(model, optimizer, [[5, 6]])
        layer.evict(before_step=2)  # deletes the keys of [[1, 2], [3, 4]]
        clock.now += 1
        assert publisher.maybe_publish() == (1, 1)
        folder = os.path.join(base, "deltas", "1")
        assert tf.io.gfile.listdir(folder) == ["0000000001"]  # written in place: no temporary folder
        follower.sync()
        assert follower.sequence == 1 and follower.refused is None
        keys = layer_keys(layer, [[1, 2], [3, 4], [5, 6]])
        want = trainer_rows(layer)
        np.testing.assert_array_equal(served_rows(follower, layer, keys),
                                      np.stack([want.get(k, np.zeros(DIM, np.float32)) for k in keys]))
        np.testing.assert_allclose(follower.predict({"ids": ids})["logits"].numpy(), model(ids).numpy(), atol=1e-6)

        # a delta still being written (no manifest yet) is waited for, never applied
        train(model, optimizer, [[7, 8]])
        clock.now += 1
        assert publisher.maybe_publish() == (1, 2)
        manifest_path = os.path.join(ttf.serving.delta_folder(base, 1, 2), "manifest.json")
        manifest = tf.io.gfile.GFile(manifest_path).read()
        tf.io.gfile.remove(manifest_path)
        follower.stop()
        follower.sync()
        assert follower.sequence == 1 and follower.refused is None
        with tf.io.gfile.GFile(manifest_path, "w") as f:
            f.write(manifest)
        assert follower.sync() == 1 and follower.sequence == 2

        # a version folder without its marker (a copy under way) is not loaded; the whole one is
        publisher.publish_base()
        info = os.path.join(base, "2", "assets.extra", "ttf_serving.json")
        text = tf.io.gfile.GFile(info).read()
        tf.io.gfile.remove(info)
        follower.sync()
        assert follower.version == 1
        with tf.io.gfile.GFile(info, "w") as f:
            f.write(text)
        follower.sync()
        assert (follower.version, follower.sequence) == (2, 0)
    finally:
        follower.stop()
