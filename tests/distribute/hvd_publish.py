"""Run by test_horovod_stream.py under horovodrun -np 2: tdh.Publisher on a model whose table
is sharded over the ranks. Each rank writes its own parts of every delta; rank 0 writes the
manifest. A base and 4 deltas (evictions included; the third delta's part write fails on rank
1 only, injected, and both ranks pause, then resume) are followed by a DeltaFollower on rank 0,
which must serve every key's row bit for bit as the ranks hold it.

    horovodrun --gloo -np 2 python tests/distribute/hvd_publish.py BASE OUT_PREFIX

Writes OUT_PREFIX.<rank>.json: the part files this rank wrote, what each publish returned and,
on rank 0, the follower's check.
"""
import errno
import json
import os
import sys

import numpy as np
import tensorflow as tf

import ttf
import ttf.distribute.horovod as tdh
from ttf.serving import _publish

hvd = tdh.hvd
hvd.init()
coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
base, prefix = sys.argv[1], sys.argv[2]
rank = hvd.rank()
DIM = 4

ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
layer = ttf.FusedEmbedding(DIM, num_fields=2, name="sparse")
model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
tdh.shard_tables(model, coll)
optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adagrad(0.1), coll)
model(tf.constant([[1, 2]], tf.int64))
tdh.broadcast_variables(model.variables, coll)


@tf.function(reduce_retracing=True)
def train(batch):
    with tf.GradientTape() as tape:
        loss = tdh.mean_over_examples(tf.square(model(batch, training=True))[:, 0], coll)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


written, fail = [], [False]
real_write = _publish._write_file


def recording_write(path, blob):
    if fail[0]:
        raise OSError(errno.ENOSPC, "No space left on device", path)
    written.append(os.path.basename(path))
    return real_write(path, blob)


_publish._write_file = recording_write
try:  # the one-process publisher refuses a sharded model, naming the one to use
    ttf.serving.Publisher(model, base)
    refusal = None
except ValueError as err:
    refusal = str(err)
clock = [0.0]
publisher = tdh.Publisher(model, base, coll, publish_every=1, dense_publish_every=1, clock=lambda: clock[0] + rank * 0.5)
rng = np.random.default_rng(rank)
seen = set()


def step(high):
    batch = rng.integers(0, high, size=[32, 2])  # each rank its own ids
    seen.update(layer.keys_of(tf.constant(batch, tf.int64))[0].numpy().ravel().tolist())
    train(tf.constant(batch, tf.int64))


step(300)
results = [publisher.maybe_publish()]  # the base
for delta in range(4):
    step(600)
    layer.evict(before_step=int(layer.tables[0].stats()[2]) - 1)  # deletions the deltas carry
    clock[0] += 1
    fail[0] = delta == 2 and rank == 1  # a full disk on rank 1 only: both ranks pause
    results.append(publisher.maybe_publish())
    fail[0] = False
step(600)
clock[0] += 1
results.append(publisher.maybe_publish())  # that step's rows
clock[0] += 1
results.append(publisher.maybe_publish())  # no step since: no delta (every rank agrees)
out = {"written": written, "results": results, "paused": publisher.paused, "refusal": refusal}
# The reference: every rank's rows and the ids any rank saw, gathered for this check only.
mine = layer.tables[0].export()
keys = hvd.allgather(mine["keys"]).numpy()
values = hvd.allgather(mine["values"][:, :DIM]).numpy()
every_seen = sorted(set().union(*hvd.allgather_object(sorted(seen))))
probe = tf.constant([[1, 2], [3, 4]], tf.int64)
live = model(probe, training=False).numpy()  # a lookup is a collective: every rank calls it
if rank == 0:
    follower = ttf.serving.DeltaFollower(base)
    expected = dict(zip(keys.tolist(), values))
    lookup = np.array(sorted(set(every_seen) | set(expected)), np.int64)
    served = follower.lookup("sparse", lookup).numpy()
    want = np.stack([expected.get(int(k), np.zeros(DIM, np.float32)) for k in lookup])
    out.update(version=follower.version, sequence=follower.sequence, refused=follower.refused,
               equal=bool(np.array_equal(served, want)), keys=len(lookup), held=len(expected),
               predict_equal=bool(np.allclose(follower.predict({"ids": probe})["logits"].numpy(), live, atol=1e-6)))
with open(f"{prefix}.{rank}.json", "w") as f:
    json.dump(out, f)
