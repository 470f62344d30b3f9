"""Run by test_horovod_misuse.py under horovodrun -np 2: Horovod misuse raises on every rank
instead of hanging or silently keeping 1/N of a table.

  stall: rank 0 calls tdh.table_size alone: it raises CollectiveMisuseError after the
         collective timeout, and rank 1's next collective raises too.
  misc:  manager.save of a sharded table refuses, naming tdh.save_checkpoint; restore on rank 0
         then broadcast raises on every rank; tf.saved_model.save of a
         sharded model refuses naming the fix; tdh.export_for_serving writes once (rank 0).

    horovodrun --gloo -np 2 python tests/distribute/hvd_misuse.py MODE OUT_PREFIX
"""
import json
import os
import sys
import time

import numpy as np

import ttf
import tensorflow as tf
import ttf.distribute.horovod as tdh
import horovod.tensorflow as hvd

hvd.init()

coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
mode, prefix = sys.argv[1], sys.argv[2]
rank = hvd.rank()

ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=3, seed=1)(ids)))
model = tf.keras.Model(ids, out)
tdh.shard_tables(model, coll)
model(tf.zeros([1, 3], tf.int64))
with tf.GradientTape() as tape:  # rows on both ranks, stored by the update (a lookup inserts nothing)
    loss = tf.reduce_sum(model(tf.constant(np.arange(30).reshape(10, 3) + 100 * rank, tf.int64), training=True))
ttf.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
tdh.broadcast_variables(model.variables, coll)
result = {}


def outcome(fn):
    start = time.time()
    try:
        fn()
        return {"error": None, "seconds": time.time() - start}
    except Exception as err:  # noqa: BLE001 (the test checks which)
        return {"error": type(err).__name__, "message": str(err), "seconds": time.time() - start}


if mode == "stall":
    tdh.COLLECTIVE_TIMEOUT_SECONDS = 10  # the default, 45, would make the test slow
    if rank == 0:  # a collective on one rank only
        result["call"] = outcome(lambda: tdh.table_size(model, coll))
    else:  # busy elsewhere past the timeout, then the next collective
        time.sleep(15)
        result["call"] = outcome(lambda: tdh.check_same_config({"x": 1}, coll))
elif mode == "misc":
    ckpt_dir = f"{prefix}-ckpt"
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(model=model), ckpt_dir)
    result["plain_save"] = outcome(lambda: manager.save(1))  # a sharded table is saved by every rank
    tdh.save_checkpoint(manager, 1, coll)
    result["table_size"] = tdh.table_size(model, coll)
    result["saved_model"] = outcome(lambda: tf.saved_model.save(model, f"{prefix}-saved-{rank}"))
    # tdh.export_for_serving: each rank writes its own shard's arrays (no table gathered: the
    # gather of model.save would call hvd.allgather with a ttf_<layer>_export_* name).
    gathers, allgather = [], hvd.allgather
    hvd.allgather = lambda tensor, name=None, **kw: gathers.append(name) or allgather(tensor, name=name, **kw)
    version = tdh.export_for_serving(model, f"{prefix}-serving", coll)  # rank 0: base/1; others: None
    hvd.allgather = allgather
    result["export_gathers"] = [name for name in gathers if name and "_export_" in name]
    result["serving_version"] = version
    probe = tf.constant(np.concatenate([np.arange(30), np.arange(30) + 100, [7777, 8888, 9999]]).reshape(-1, 3),
                        tf.int64)
    trained = model(probe, training=False).numpy()  # every rank: the sharded lookup is a collective
    if rank == 0:
        served = tf.saved_model.load(version).signatures["serving_default"](ids=probe)["logits"].numpy()
        result["served_max_diff"] = float(np.abs(served - trained).max())
        result["served_spread"] = float(trained.std())
    # A two-table model (its Keras call replaced by the grouped one): its eager call after the
    # export traced it still exchanges, and the served model predicts what it predicts.
    ids2, user = tf.keras.Input([3], dtype=tf.int64, name="ids"), tf.keras.Input([1], dtype=tf.int64, name="user")
    joined = tf.keras.layers.Concatenate()([
        tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=3, seed=1, name="fields2")(ids2)),
        tf.keras.layers.Flatten()(ttf.DynamicEmbedding(2, seed=2, name="users2")(user))])
    two = tf.keras.Model({"ids": ids2, "user": user}, tf.keras.layers.Dense(1)(joined))
    tdh.shard_tables(two, coll)
    batch = {"ids": tf.constant(np.arange(30).reshape(10, 3) + 100 * rank, tf.int64),
             "user": tf.constant(np.arange(10).reshape(10, 1) + 50 * rank, tf.int64)}
    two(batch)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(two(batch, training=True))
    ttf.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, two.trainable_variables), two.trainable_variables))
    tdh.broadcast_variables(two.variables, coll)
    two_probe = {"ids": probe, "user": tf.constant(np.arange(probe.shape[0]).reshape(-1, 1) % 60, tf.int64)}
    before_export = two(two_probe, training=False).numpy()
    two_version = tdh.export_for_serving(two, f"{prefix}-serving-two", coll)
    after_export = two(two_probe, training=False).numpy()  # eager, after the export traced the model
    result["two_tables_eager_diff"] = float(np.abs(after_export - before_export).max())
    if rank == 0:
        served = tf.saved_model.load(two_version).signatures["serving_default"](**two_probe)
        result["two_tables_served_diff"] = float(np.abs(list(served.values())[0].numpy() - before_export).max())
    with open(f"{prefix}-{rank}.json", "w") as f:
        json.dump(result, f)
    # Last (Horovod may be shut down after it): the idiom "restore on rank 0 only, then broadcast".
    if rank == 0:
        result["idiom"] = outcome(lambda: (manager.restore_latest(), tdh.broadcast_variables(model.variables, coll)))
    else:
        result["idiom"] = outcome(lambda: tdh.broadcast_variables(model.variables, coll))
with open(f"{prefix}-{rank}.json", "w") as f:
    json.dump(result, f)
# The errors above were expected; the test reads the JSON. The script ends as users' scripts
# do (no os._exit): after ttf's watchdog shut Horovod down, the interpreter must still exit.
print(f"[hvd_misuse] rank {rank} reached the end", flush=True)
