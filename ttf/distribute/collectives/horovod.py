"""Synchronous data-parallel training on Horovod, with ttf tables sharded over the ranks.

Every rank runs the whole model on its slice of the global batch. Each id of a ttf table
lives on exactly one rank, `ttf.embedding.shard_of(id, size)`. A training step:

  forward:  each rank de-duplicates its batch's ids (per table, over all its fields and calls)
            and one alltoall sends each id to its owner; the owner finds the rows (a new id:
            the row its update will insert) and one alltoall brings them back;
  backward: one alltoall carries each id's row gradient to its owner, which sums it over
            the ranks and applies the fused optimizer once per id (ttf.optimizers);
            dense gradients are allreduced (averaged, fused into one buffer).

Table gradients are averaged over the ranks like dense ones, so with every rank's loss the
mean over its slice, N ranks of batch B compute what one process computes on the global
batch of N x B. The three alltoalls carry all the model's ttf tables together: shard_tables
makes a functional model compute every ttf layer's ids first and exchange them at once.
Importing this module imports horovod; `import ttf` never does.

Your own Keras model (both model.fit and a GradientTape loop work):

    import ttf
    import ttf.distribute.horovod as tdh
    tdh.hvd.init()
    coll = tdh.HorovodCollectives()                       # the ranks' collectives, passed to every call
    model = make_model()                                  # uses ttf.FusedEmbedding / DynamicEmbedding
    tdh.shard_tables(model, coll)                         # each id now lives on one rank
    optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(1e-3), coll)
    model(sample_batch)                                   # builds the variables
    tdh.broadcast_variables(model.variables, coll)        # rank 0's initial dense weights everywhere

and run it with `horovodrun --gloo -np 2 python your_script.py`. The model is a tf_keras (Keras 2)
model: set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (shard_tables refuses a Keras 3 model).

Compression (`compression="fp16"|"bf16"`) casts what crosses the wire to 16 bits and back:
the embedding rows, their gradients and the dense allreduce (summed in float32 on arrival).

Every function takes the collectives explicitly, as ttf.distribute.sync's do: they are the same
functions (checkpoints, the serving export, publishing, streams, agreeing), over any backend;
this module adds the Horovod backend, its watchdog (`collective`) and the Keras 2 check of
`shard_tables`.
"""
import contextlib
import threading
import warnings

import tensorflow as tf

# Seconds one of ttf's own collectives (table_size, a table's gather for a save, restore or
# export, broadcast_variables, export_for_serving, check_same_config) may wait for the other
# ranks before this rank shuts Horovod down and raises CollectiveMisuseError. A collective
# that some rank never joins (`if hvd.rank() == 0: ckpt.write(...)`) would otherwise wait for
# ever: Horovod 0.28.1's own stall shutdown (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) did not
# fire on this build with Gloo. After the shutdown, every other rank's next collective raises.
# Raise it when a rank legitimately works alone longer before joining one.
COLLECTIVE_TIMEOUT_SECONDS = 45.0
# Seconds a collective that ttf's watchdog failed waits for Horovod's shutdown to finish
# before raising (see `collective`: an unfinished shutdown would hang the interpreter's exit).
SHUTDOWN_WAIT_SECONDS = 60.0

try:
    import horovod.tensorflow as hvd
except ImportError as err:  # pragma: no cover (depends on the environment)
    raise ImportError(
        f"ttf.distribute.horovod needs horovod ({err}). Install it with ./scripts/setup_horovod.sh "
        "(builds horovod 0.28.1 against this TensorFlow with Gloo, about 6 minutes the first time)."
    ) from err

from ttf._keras import KERAS3
from ttf.distribute import _table_sharding
from ttf.distribute.collectives import sync as _sync
from ttf.distribute.collectives.sync import (COMPRESSIONS, SAVE_TIMEOUT_SECONDS, CollectiveMisuseError,
                                             DistributedOptimizer, Publisher, TableSharding, agree, allreduce_dense,
                                             broadcast_variables, check_same_config, export_for_serving,
                                             gather_input_position, gather_rows, gather_stream_position,
                                             mean_over_examples, open_stream, rank_slice, save_checkpoint,
                                             stream_batches, stream_progress, table_size, ttf_layers)
from ttf.distribute.collectives._tf import Collectives


@contextlib.contextmanager
def collective(what, timeout=None):
    """Runs (eager) Horovod collectives for `what`. When they wait longer than `timeout`
    (default COLLECTIVE_TIMEOUT_SECONDS) for the other ranks, Horovod is shut down on this rank (every
    other rank's next collective then fails too); a Horovod error inside (that shutdown, or
    another collective on another rank) becomes CollectiveMisuseError naming the call and the
    fix instead of a hang or a bare Horovod error."""
    done, timed_out, rank = threading.Event(), [], hvd.rank()  # hvd.rank() fails once Horovod is shut down
    timeout = COLLECTIVE_TIMEOUT_SECONDS if timeout is None else timeout

    def watchdog():
        if not done.wait(timeout):
            timed_out.append(True)
            hvd.shutdown()  # fails the collective this rank waits in

    guard = threading.Thread(target=watchdog, name="ttf_collective_watchdog", daemon=True)
    guard.start()
    try:
        yield
    except tf.errors.OpError as err:
        message = str(err)
        if "horovod" not in message.lower():  # not a Horovod op's error
            raise
        waited = (f"waited {timeout:g}s for the other ranks (ttf shut Horovod down)" if timed_out
                  else "failed")
        raise CollectiveMisuseError(
            f"ttf (rank {rank}): {what} {waited}: it is a Horovod collective, and the ranks did not all join it "
            "alike. Call it on every rank, in the same order (not under `if hvd.rank() == 0:`); only the writing of "
            "files is rank 0's, as tdh.save_checkpoint and tdh.export_for_serving do it. Horovod said: "
            f"{message.strip().splitlines()[0][:300]}") from err
    finally:
        done.set()
        # The collective fails as soon as Horovod's shutdown begins, before the watchdog's
        # hvd.shutdown() has joined Horovod's background thread. Left running, that join races
        # Horovod's own atexit hvd.shutdown(): both join one thread and the process hangs at
        # interpreter exit. Waiting here lets the shutdown finish first (the atexit one is then a no-op).
        guard.join(SHUTDOWN_WAIT_SECONDS)
        if guard.is_alive():
            warnings.warn(f"ttf (rank {rank}): Horovod's shutdown after {what} has not finished within "
                          f"{SHUTDOWN_WAIT_SECONDS:g}s; this process may hang at exit: end it with os._exit()",
                          RuntimeWarning, stacklevel=3)


class HorovodCollectives(Collectives):
    """The collectives interface (ttf/distribute/collectives/_tf.py) over Horovod, so table
    sharding, the dense allreduce and broadcast_variables are written once for both
    backends. Horovod's alltoall takes variable splits itself: nothing is padded."""

    workers_name = "Horovod ranks"
    export_hint = ("Use ttf.distribute.horovod.export_for_serving(model, path, collectives) on every rank for serving, "
                   "or ttf.distribute.horovod.save_checkpoint(manager, step, collectives) on every rank for a checkpoint")
    _OPS = {"sum": "Sum", "mean": "Average", "min": "Min", "max": "Max"}

    def __init__(self):
        """Call after hvd.init(); one per process, passed to every function of this module."""
        super().__init__()
        self.rank, self.size = hvd.rank(), hvd.size()

    def alltoall(self, tensor, splits, name="ttf_alltoall", all_splits=None, count=False):
        del all_splits  # Horovod exchanges the splits itself
        received, received_splits = hvd.alltoall(tensor, splits=splits, name=name)
        if count:  # what leaves this rank: every row but its own block
            row_bytes = tf.reduce_prod(tf.shape(tensor)[1:]) * tensor.dtype.size
            received = self._counted(received, (tf.reduce_sum(splits) - splits[self.rank]) * row_bytes)
        return received, received_splits

    def alltoall_even(self, tensor, name="ttf_alltoall", count=False):
        received = hvd.alltoall(tensor, name=name)
        if count:
            received = self._counted(received, tf.size(tensor) // self.size * (self.size - 1) * tensor.dtype.size)
        return received

    def allreduce(self, tensor, op="sum", name="ttf_allreduce", count=False):
        out = hvd.allreduce(tensor, op=getattr(hvd, self._OPS[op]), name=name)
        if count:  # a ring allreduce sends 2 (n - 1) / n of the buffer
            out = self._counted(out, 2 * (self.size - 1) * tf.size(tensor, tf.int64) * tensor.dtype.size // self.size)
        return out

    def allgather(self, tensor, name="ttf_allgather", count=False, same_shape=False):
        del same_shape
        out = hvd.allgather(tensor, name=name)
        if count:
            out = self._counted(out, (self.size - 1) * tf.size(tensor) * tensor.dtype.size)
        return out

    def broadcast(self, tensor, root=0, name="ttf_broadcast"):
        return hvd.broadcast(tensor, root_rank=root, name=name)

    def allgather_object(self, obj, name="ttf_object"):
        return hvd.allgather_object(obj, name=name)

    def broadcast_object(self, obj, root=0, name="ttf_object"):
        return hvd.broadcast_object(obj, root_rank=root, name=name)

    def broadcast_variables(self, variables, root=0):
        hvd.broadcast_variables(variables, root_rank=root)

    def guard(self, what, timeout=None):
        return collective(what, timeout)


def shard_tables(model, collectives, compression="none"):
    """Shards every ttf table of `model` over the Horovod ranks (call after hvd.init(), before
    training). Returns the sharded layers. A layer already sharded over parameter servers
    (shard_devices) cannot also be sharded over ranks. (ttf.distribute.sync.shard_tables, for
    tf_keras models only on Horovod.)"""
    if KERAS3:  # its functional graph is another (Node.operation, no _run_internal_graph): never run here
        raise ValueError(f"ttf.distribute.horovod.shard_tables: {model.name} is a Keras 3 model; ttf shards tables over "
                         "Horovod ranks in tf_keras (Keras 2) models only. Set TF_USE_LEGACY_KERAS=1 before TensorFlow "
                         "is imported, with tf_keras installed (before TensorFlow is imported)")
    return _table_sharding.shard_tables(model, collectives, compression,
                                        group=lambda m, sharding: _group_lookups(m, sharding))


_group_lookups = _table_sharding._group_lookups  # pylint: disable=protected-access (benchmarks swap it)
all_ranks = _sync.all_workers  # (flag, collectives, name): True where `flag` holds on every rank


def mean_over_ranks(value, collectives, name="ttf_mean"):
    """The average of a scalar tensor over the ranks (e.g. the global batch's loss)."""
    return collectives.allreduce(value, "mean", name)


__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "COMPRESSIONS", "CollectiveMisuseError", "DistributedOptimizer",
           "HorovodCollectives", "Publisher", "SAVE_TIMEOUT_SECONDS", "SHUTDOWN_WAIT_SECONDS", "TableSharding", "agree",
           "all_ranks", "allreduce_dense", "broadcast_variables", "check_same_config", "collective",
           "export_for_serving", "gather_input_position", "gather_rows", "gather_stream_position", "mean_over_examples",
           "mean_over_ranks", "open_stream", "rank_slice", "save_checkpoint", "shard_tables", "stream_batches",
           "stream_progress", "table_size", "ttf_layers"]
