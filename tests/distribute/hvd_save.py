"""Run by test_horovod_save.py under horovodrun -np 2: each rank writes its own part of a
checkpoint (tdh.save_checkpoint), full and deltas; the ranks restore it; a failed save on one
rank raises on every rank and leaves the last checkpoint intact.

  save:     trains, saves ckpt-1, delta-2 (new ids), delta-3 (after an eviction); writes each
            rank's own rows after each save, restores the chain into a fresh model on every
            rank and writes what each rank then holds.
  restore:  restores DIR (written by any topology) into 2 ranks; writes each rank's rows.
  fail:     saves ckpt-1, then a save whose rank-1 part fails (injected): every rank raises.

    horovodrun --gloo -np 2 python tests/distribute/hvd_save.py MODE DIR OUT_PREFIX
"""
import json
import os
import sys

import numpy as np

import ttf
import tensorflow as tf
import ttf.distribute.horovod as tdh
import horovod.tensorflow as hvd
from ttf.distribute import _ranks  # where each rank writes its part (write_rank_part)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from table_order import by_key  # noqa: E402 (tests/checkpoint/, beside this script's folder)

hvd.init()

coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
mode, directory, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
rank = hvd.rank()
ROWS = ("keys", "values", "meta", "candidate_keys", "candidate_meta")


def make_model():
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=3, seed=1)(ids)))
    model = tf.keras.Model(ids, out)
    tdh.shard_tables(model, coll)
    optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adagrad(0.1), coll)
    model(tf.zeros([1, 3], tf.int64))
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), directory,
                                               full_every=3)
    return model, optimizer, manager


def train(model, optimizer, first_id, steps=3):
    for step in range(steps):  # every rank its own ids, and some shared ones
        ids = np.arange(30).reshape(10, 3) + first_id + 1000 * rank + 100 * step
        ids[0] = [7, 8, 9]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.constant(ids, tf.int64), training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def own_rows(model):
    """This rank's table (rows and candidates, sorted by key)."""
    export = by_key(tdh.ttf_layers(model)[0].tables[0].export())
    return {field: export[field] for field in ROWS}


def save_rows(model, name):
    np.savez(f"{prefix}-{name}-{rank}.npz", **own_rows(model))


result = {}
if mode == "save":
    model, optimizer, manager = make_model()
    train(model, optimizer, 0)
    result["paths"] = [tdh.save_checkpoint(manager, 1, coll)]
    save_rows(model, "step1")
    train(model, optimizer, 10_000)
    result["paths"].append(tdh.save_checkpoint(manager, 2, coll))
    save_rows(model, "step2")
    layer = tdh.ttf_layers(model)[0]
    step = int(layer.tables[0].stats()[2])
    result["evicted"] = int(layer.evict(before_step=step - 1))  # ids not updated in the last steps: deleted
    train(model, optimizer, 20_000, steps=1)
    result["paths"].append(tdh.save_checkpoint(manager, 3, coll))
    save_rows(model, "step3")
    restored, _, restored_manager = make_model()
    result["restored_step"] = restored_manager.restore_latest()
    save_rows(restored, "restored")
elif mode == "restore":
    model, _, manager = make_model()
    result["restored_step"] = manager.restore_latest()
    save_rows(model, "restored")
elif mode == "fail":
    model, optimizer, manager = make_model()
    train(model, optimizer, 0)
    result["first"] = tdh.save_checkpoint(manager, 1, coll)
    train(model, optimizer, 10_000)
    real = _ranks.write_rank_part
    if rank == 1:
        def write_rank_part(*args):
            raise OSError("no space left on device (injected)")
        _ranks.write_rank_part = write_rank_part
    try:
        tdh.save_checkpoint(manager, 2, coll)
        result["error"] = None
    except RuntimeError as err:
        result["error"], result["message"] = type(err).__name__, str(err)
    result["latest"] = manager.latest
    _ranks.write_rank_part = real  # the disk has room again: the next save holds everything since ckpt-1
    result["next"] = tdh.save_checkpoint(manager, 3, coll)
    save_rows(model, "step3")
with open(f"{prefix}-{rank}.json", "w") as f:
    json.dump(result, f)
