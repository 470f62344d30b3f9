"""A model nobody here wrote (DeepCTR's DeepFM, via ttf.accelerate) under horovodrun (run by
test_horovod.py):

    horovodrun --gloo -np 2 python tests/distribute/hvd_grouped.py OUT.json

Writes rank 0's view: predictions before sharding and after (equal: the carried-over rows
moved to their owners), after a few training steps, the table size over the ranks, the
alltoalls of one training step's graph, and the warning for a subclassed model.
"""
import json
import sys
import warnings

import numpy as np

import ttf  # before deepctr: deepctr imports tf.keras, which must resolve to tf_keras
import tensorflow as tf
import horovod.tensorflow as hvd
import ttf.distribute.horovod as tdh
from deepctr.feature_column import DenseFeat, SparseFeat
from deepctr.models import DeepFM

out_path = sys.argv[1]
hvd.init()
coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
rank, size = hvd.rank(), hvd.size()
FIELDS, VOCAB, GLOBAL_BATCH, STEPS = 6, 300, 64, 8

tf.keras.utils.set_random_seed(0)  # DeepCTR leaves some initializers unseeded: runs must match
feats = [SparseFeat(f"C{i}", VOCAB, embedding_dim=8) for i in range(FIELDS)] + [DenseFeat("I0", 1)]
model = DeepFM(feats, feats, dnn_hidden_units=(16,), task="binary", seed=1)
fast = ttf.accelerate(model)  # the same on every rank: same seed, same carried-over rows
rng = np.random.default_rng(0)
x = {f"C{i}": rng.integers(0, VOCAB, GLOBAL_BATCH * STEPS).astype(np.int32) for i in range(FIELDS)}
x["I0"] = rng.random(GLOBAL_BATCH * STEPS).astype(np.float32)
y = ((x["C0"] + x["C1"]) % 2).astype(np.float32)
probe = {k: v[:128] for k, v in x.items()}

before = fast(probe, training=False).numpy()[:, 0]
local_size = sum(int(layer.size()) for layer in tdh.ttf_layers(fast))
tdh.shard_tables(fast, coll)
after = fast(probe, training=False).numpy()[:, 0]  # every rank: lookups are collective
sharded_size = tdh.table_size(fast, coll)

optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(0.01), coll)
tdh.broadcast_variables(fast.variables, coll)
loss_fn = tf.keras.losses.BinaryCrossentropy()


@tf.function
def train_step(features, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, fast(features, training=True))
    grads = tape.gradient(loss, fast.trainable_variables)
    optimizer.apply_gradients(zip(grads, fast.trainable_variables))
    return loss


per_rank = GLOBAL_BATCH // size
for step in range(STEPS):
    lo = step * GLOBAL_BATCH + rank * per_rank
    train_step({k: v[lo:lo + per_rank] for k, v in x.items()}, y[lo:lo + per_rank])
graph = train_step.get_concrete_function({k: v[:per_rank] for k, v in x.items()}, y[:per_rank]).graph
trained = fast(probe, training=False).numpy()[:, 0]
trained_size = tdh.table_size(fast, coll)  # a collective: every rank


class TwoTables(tf.keras.Model):  # subclassed: shard_tables cannot see its calls, so it warns
    def __init__(self):
        super().__init__()
        self.user, self.item = ttf.DynamicEmbedding(4, name="user_table"), ttf.DynamicEmbedding(4, name="item_table")

    def call(self, ids):
        return tf.reduce_sum(self.user(ids[:, 0]) * self.item(ids[:, 1]), -1)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tdh.shard_tables(TwoTables(), coll)

if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"before": before.tolist(), "after": after.tolist(), "trained": trained.tolist(),
                   "local_size": local_size, "sharded_size": sharded_size, "table_size": trained_size,
                   "alltoalls": sorted(op.name for op in graph.get_operations() if op.type == "HorovodAlltoall"),
                   "tables": sorted(layer.dim for layer in tdh.ttf_layers(fast)),
                   "warnings": [str(w.message) for w in caught]}, f)
