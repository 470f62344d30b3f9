"""Synchronous data-parallel training on TensorFlow's own collectives, with ttf tables
sharded over the workers (docs/sync.md). Any TensorFlow from 2.16, Keras 2 or Keras 3.

Each worker is one process running the whole model on its slice of the global batch; each
id of a ttf table lives on one worker. Per step, three alltoalls carry the ids to their
owners, the rows back and the row gradients to the owners; one allreduce averages the
dense gradients (ttf/distribute/_table_sharding.py). N workers of batch B compute what one
process computes on the global batch of N x B.

Your own Keras model (a GradientTape loop or model.fit):

    import ttf
    import ttf.distribute.collectives.sync as tds
    coll = ttf.distribute.TFCollectives(worker_hosts="10.0.0.1:2222,10.0.0.2:2222", task_index=i)  # or TF_CONFIG
    model = make_model()                                   # uses ttf.FusedEmbedding / DynamicEmbedding
    tds.shard_tables(model, coll)                          # each id now lives on one worker
    optimizer = tds.DistributedOptimizer(ttf.optimizers.Adam(1e-3), coll)
    model(sample_batch)                                    # builds the variables
    tds.broadcast_variables(model.variables, coll)         # worker 0's initial dense weights everywhere
    with coll.guard("training"):                           # a lost worker: LostWorkerError naming it
        ...train...

Create the collectives before the model (TensorFlow renames the devices when it enables
collectives). Every worker calls the same functions in the same order: a lookup at
inference is a collective too (each worker predicts its own slice).
"""
import tensorflow as tf

from ttf.distribute.collectives._tf import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                         LostWorkerError, TFCollectives)
from ttf.distribute._table_sharding import (DistributedOptimizer, TableSharding, allreduce_dense,
                                            broadcast_variables, shard_tables, table_size)
from ttf.distribute.collectives._wire import COMPRESSIONS


def rank_slice(dataset, batch_size, collectives):
    """This worker's slice of each global batch: `dataset` yields global batches of
    batch_size x size (every worker reads the same stream), this worker keeps rows
    [rank * batch_size, (rank + 1) * batch_size) of each, so the workers together see exactly
    the examples of one process's global batch, in the same steps."""
    start = collectives.rank * batch_size

    def take(*element):
        return tf.nest.map_structure(lambda t: t[start:start + batch_size], element)

    return dataset.map(take, num_parallel_calls=tf.data.AUTOTUNE)


def mean_over_examples(values, collectives, name="ttf_mean_examples"):
    """The mean of per-example values (e.g. each example's loss) over every worker's
    examples, for batches that differ in size between the workers (a last partial batch, a
    stream's), even empty. Its value is the global mean on every worker (so every worker
    takes the same loss-driven decisions); its gradient is that of this worker's term
    sum(own) x size / (examples on every worker), which the DistributedOptimizer's average
    over the workers turns into the gradient of the global mean."""
    total = collectives.allreduce(tf.cast(tf.size(values), tf.float32), "sum", f"{name}_count")
    local = tf.reduce_sum(values) * float(collectives.size) / tf.maximum(total, 1.0)
    # TensorFlow's collective ops have no gradient: the mean's value, this worker's term's gradient.
    return local + tf.stop_gradient(collectives.allreduce(local, "mean", name) - local)


def all_workers(flag, collectives, name="ttf_all_workers"):
    """A boolean scalar that is True only where `flag` is True on every worker (e.g. a
    step's gradients are finite: skip the step everywhere when one worker saw a NaN)."""
    return tf.cast(collectives.allreduce(tf.cast(flag, tf.int32), "min", name), tf.bool)


__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "COMPRESSIONS", "CollectiveMisuseError", "Collectives", "DistributedOptimizer",
           "LostWorkerError", "TFCollectives", "TableSharding", "all_workers", "allreduce_dense",
           "broadcast_variables", "mean_over_examples", "rank_slice", "shard_tables", "table_size"]
