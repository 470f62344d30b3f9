"""Synchronous data-parallel training on TensorFlow's own collectives, with ttf tables
sharded over the workers (docs/sync.md). Any TensorFlow from 2.16, Keras 2 or Keras 3.

Each worker is one process running the whole model on its slice of the global batch; each
id of a ttf table lives on one worker. Per step, three alltoalls carry the ids to their
owners, the rows back and the row gradients to the owners; one allreduce averages the
dense gradients (ttf/distribute/_table_sharding.py). N workers of batch B compute what one
process computes on the global batch of N x B.

Your own Keras model (a GradientTape loop or model.fit):

    import ttf
    import ttf.distribute.sync as tds
    cluster = ttf.distribute.Cluster(worker_hosts="10.0.0.1:2222,10.0.0.2:2222", task_type="worker", task_index=i)
    coll = ttf.distribute.TFCollectives(cluster)           # or TFCollectives() with TF_CONFIG set
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

Every function here takes the collectives explicitly, after its required arguments, and works
over any backend (TFCollectives, ttf.distribute.horovod's HorovodCollectives): checkpoints,
the serving export and publishing with each worker writing its own rows, a stream's shares and
positions, and agreeing on values (ttf/distribute/_ranks.py says how each works).
"""
import tensorflow as tf

from ttf.distribute import _ranks
from ttf.distribute._ranks import SAVE_TIMEOUT_SECONDS
from ttf.distribute.collectives._tf import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                         LostWorkerError, TFCollectives)
from ttf.distribute._table_sharding import (DistributedOptimizer, TableSharding, allreduce_dense,
                                            broadcast_variables, shard_tables, table_size)
from ttf.distribute.collectives._wire import COMPRESSIONS
from ttf.embedding import tables_in

ttf_layers = tables_in  # the ttf embedding layers of a Keras model, in a fixed order (ttf.embedding.tables_in)


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


def save_checkpoint(manager, step, collectives):
    """Saves a ttf.checkpoint.CheckpointManager checkpoint of a model sharded over the workers,
    each writing its own part: call it on every worker, each with its own manager on the same
    shared `directory` (ttf/distribute/_ranks.py: save_checkpoint says how). Returns the
    checkpoint's path. Restore: manager.restore_latest() on every worker.

    Raises:
      RuntimeError: the save failed on some worker (every worker raises).
      CollectiveMisuseError / LostWorkerError: some worker did not call it (within the collectives'
        timeout of the first; the waits for the pieces and for worker 0's merge allow SAVE_TIMEOUT_SECONDS).
    """
    return _ranks.save_checkpoint(collectives, manager, step)


def export_for_serving(model, base, collectives, **kwargs):
    """ttf.export_for_serving for a model sharded over the workers: call it on every worker, with
    the same `base` on a filesystem every worker can write. No worker holds another's rows
    (ttf/distribute/_ranks.py: export_for_serving says how). kwargs go to ttf.export_for_serving.
    Returns the version's folder on worker 0, None on the others."""
    return _ranks.export_for_serving(collectives, model, base, **kwargs)


def Publisher(model, base, collectives, **kwargs):  # noqa: N802 (a class to its callers)
    """ttf.serving.Publisher for a model sharded over the workers: create it and call
    maybe_publish() / publish() on every worker, in the same steps; each writes its own table
    parts, worker 0 the dense part and the manifest (ttf/distribute/_ranks.py: RankPublisher)."""
    return _ranks.RankPublisher(collectives, model, base, **kwargs)


def gather_input_position(position, collectives):
    """Every worker's share of a ttf.data.InputPosition into every worker's copy (before worker 0 saves)."""
    _ranks.gather_input_position(collectives, position)


def open_stream(spec, collectives, **kwargs):
    """ttf.data.open_stream for this worker: its share of the stream. kwargs go to ttf.data.open_stream."""
    return _ranks.open_stream(collectives, spec, **kwargs)


def stream_batches(stream, batch_size, collectives, stop=None, max_steps=None):
    """ttf.data.stream_batches for a synchronous job: every worker reads its own share and the
    workers take each step together (ttf/distribute/_ranks.py: stream_batches)."""
    return _ranks.stream_batches(collectives, stream, batch_size, stop, max_steps)


def gather_stream_position(stream, collectives):
    """Every worker's share of a stream position into every worker's copy (before worker 0 saves)."""
    _ranks.gather_stream_position(collectives, stream)


def stream_progress(stream, collectives):
    """stream.update_progress() over every worker's share: (progress, newest event time or None)."""
    return _ranks.stream_progress(collectives, stream)


def agree(value, collectives, what="agree"):
    """Worker 0's `value` on every worker (a decision one clock takes)."""
    return _ranks.agree(collectives, value, what)


def gather_rows(array, collectives, name="ttf_rows"):
    """Concatenates a NumPy array's rows over the workers (rank order), e.g. eval predictions."""
    return _ranks.gather_rows(collectives, array, name)


def check_same_config(config, collectives, what="flags"):
    """Raises ValueError naming the workers whose `config` (a JSON-able dict) differs from worker 0's."""
    _ranks.check_same_config(collectives, config, what)


__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "COMPRESSIONS", "CollectiveMisuseError", "Collectives", "DistributedOptimizer",
           "LostWorkerError", "Publisher", "SAVE_TIMEOUT_SECONDS", "TFCollectives", "TableSharding", "agree",
           "all_workers", "allreduce_dense", "broadcast_variables", "check_same_config", "export_for_serving",
           "gather_input_position", "gather_rows", "gather_stream_position", "mean_over_examples", "open_stream",
           "rank_slice", "save_checkpoint", "shard_tables", "stream_batches", "stream_progress", "table_size",
           "ttf_layers"]
