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
    import ttf.distribute.collectives.horovod as tdh
    import horovod.tensorflow as hvd
    hvd.init()
    model = make_model()                                  # uses ttf.FusedEmbedding / DynamicEmbedding
    tdh.shard_tables(model)                               # each id now lives on one rank
    optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(1e-3))
    model(sample_batch)                                   # builds the variables
    tdh.broadcast_variables(model.variables)              # rank 0's initial dense weights everywhere

and run it with `horovodrun --gloo -np 2 python your_script.py`. The model is a tf_keras (Keras 2)
model: set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (shard_tables refuses a Keras 3 model).

Compression (`compression="fp16"|"bf16"`) casts what crosses the wire to 16 bits and back:
the embedding rows, their gradients and the dense allreduce (summed in float32 on arrival).
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
        f"ttf.distribute.collectives.horovod needs horovod ({err}). Install it with ./scripts/setup_horovod.sh "
        "(builds horovod 0.28.1 against this TensorFlow with Gloo, about 6 minutes the first time)."
    ) from err

from ttf._keras import KERAS3
from ttf.distribute import _ranks, _table_sharding
from ttf.distribute.collectives import sync as _sync
from ttf.distribute._ranks import SAVE_TIMEOUT_SECONDS
from ttf.distribute.collectives._tf import CollectiveMisuseError, Collectives
from ttf.distribute.collectives._wire import COMPRESSIONS, wire_dtype as _check_compression
from ttf.embedding import tables_in

_wire_bytes = []  # the [wire, payload] int64 counter variables of the Horovod collectives, made on first use


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
    export_hint = ("Use ttf.distribute.collectives.horovod.export_for_serving(model, path) on every rank for serving, or "
                   "ttf.distribute.collectives.horovod.save_checkpoint(manager, step) on every rank for a checkpoint")
    _OPS = {"sum": "Sum", "mean": "Average", "min": "Min", "max": "Max"}

    def __init__(self):
        super().__init__()
        self._counters = _wire_bytes  # the module's counters (models read tdh._wire_bytes)
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


_collectives = []  # the HorovodCollectives, made after hvd.init()


def _backend():
    if not _collectives:
        _collectives.append(HorovodCollectives())
    return _collectives[0]


def wire_bytes():
    """Bytes this rank has sent to other ranks so far (ids, rows, row gradients and the dense
    allreduce, in their wire precision; the ring allreduce counted as 2 (n - 1) / n of the buffer)."""
    return _backend().wire_bytes()


class TableSharding(_table_sharding.TableSharding):
    """Makes a ttf embedding layer's table one shard of a table spread over the Horovod
    ranks: this rank holds the ids with shard_of(id, size) == rank. Set by shard_tables.
    (ttf.distribute.collectives.sync.TableSharding over HorovodCollectives.)"""

    def __init__(self, compression="none"):
        super().__init__(_backend(), compression)


def save_checkpoint(manager, step):
    """Saves a ttf.checkpoint.CheckpointManager checkpoint of a model sharded over the ranks,
    each rank writing its own part: call it on every rank, each with its own manager on the
    same shared `directory` (ttf/distribute/_ranks.py: save_checkpoint says how). Returns the
    checkpoint's path. Restore: manager.restore_latest() on every rank.

    Raises:
      RuntimeError: the save failed on some rank (every rank raises).
      CollectiveMisuseError: some rank did not call it (within COLLECTIVE_TIMEOUT_SECONDS of the
        first; the waits for the pieces and for rank 0's merge allow SAVE_TIMEOUT_SECONDS).
    """
    return _ranks.save_checkpoint(_backend(), manager, step)


ttf_layers = tables_in  # the ttf embedding layers of a Keras model, in a fixed order (ttf.embedding.tables_in)


def shard_tables(model, compression="none"):
    """Shards every ttf table of `model` over the Horovod ranks (call after hvd.init(), before
    training). Returns the sharded layers. A layer already sharded over parameter servers
    (shard_devices) cannot also be sharded over ranks."""
    if KERAS3:  # its functional graph is another (Node.operation, no _run_internal_graph): never run here
        raise ValueError(f"ttf.distribute.collectives.horovod.shard_tables: {model.name} is a Keras 3 model; ttf shards tables over "
                         "Horovod ranks in tf_keras (Keras 2) models only. Set TF_USE_LEGACY_KERAS=1 before TensorFlow "
                         "is imported, with tf_keras installed (before TensorFlow is imported)")
    return _table_sharding.shard_tables(model, _backend(), compression,
                                        group=lambda m, sharding: _group_lookups(m, sharding),
                                        make_sharding=lambda: TableSharding(compression))


_group_lookups = _table_sharding._group_lookups  # pylint: disable=protected-access (benchmarks swap it)


def table_size(model):
    """Ids stored over all ranks, summed over the model's ttf tables (a collective)."""
    return _table_sharding.table_size(model, _backend())


def broadcast_variables(variables, root_rank=0):
    """Rank `root_rank`'s values of `variables` (e.g. model.variables after building) everywhere.
    ttf tables are not variables and are not broadcast: each rank owns its own ids.

    Raises:
      CollectiveMisuseError (on every rank): a sharded table among `variables` was restored
        on some ranks only ("restore on rank 0, then broadcast" would keep the ids rank 0
        owns, 1/N of the table). Restore the checkpoint on every rank instead: each keeps
        the ids it owns.
    """
    _table_sharding.broadcast_variables(variables, _backend(), root_rank)


def export_for_serving(model, base, **kwargs):
    """ttf.export_for_serving for a model sharded over the ranks: call it on every rank, with
    the same `base` on a filesystem every rank can write. No rank holds another rank's rows
    (ttf/distribute/_ranks.py: export_for_serving says how). kwargs go to
    ttf.export_for_serving. Returns the version's folder on rank 0, None on the others."""
    return _ranks.export_for_serving(_backend(), model, base, **kwargs)


def Publisher(model, base, **kwargs):  # noqa: N802 (a class to its callers)
    """ttf.serving.Publisher for a model sharded over the Horovod ranks: create it and call
    maybe_publish() / publish() on every rank, in the same steps; each rank writes its own
    table parts, rank 0 the dense part and the manifest (ttf/distribute/_ranks.py: RankPublisher)."""
    return _ranks.RankPublisher(_backend(), model, base, **kwargs)


def allreduce_dense(grads, compression="none", name="ttf_dense"):
    """Averages a list of dense gradient tensors over the ranks, fused into one buffer.

    float32: one Horovod allreduce. 16-bit: a reduce-scatter (alltoall of the 16-bit buffer,
    summed in float32 by each slice's owner) then an allgather of the 16-bit sums: the bytes of
    a ring allreduce in 16 bits, without summing in 16 bits (Horovod has no bfloat16 allreduce)."""
    return _table_sharding.allreduce_dense(grads, _backend(), compression, name)


def DistributedOptimizer(optimizer, compression="none"):  # noqa: N802 (named like hvd.DistributedOptimizer)
    """Wraps a ttf (or Keras) optimizer for the Horovod shape: apply_gradients averages the
    dense gradients over the ranks (one fused allreduce) and hands ttf table gradients, which
    the sharded lookup has already summed on their owners, to the fused table update.
    Works with model.compile/fit and with tape.gradient + apply_gradients."""
    return _table_sharding.DistributedOptimizer(optimizer, _backend(), compression)


def rank_slice(dataset, batch_size):
    """This rank's slice of each global batch of batch_size x size (ttf.distribute.collectives.sync.rank_slice)."""
    return _sync.rank_slice(dataset, batch_size, _backend())


def gather_input_position(position):
    """Every rank's share of a ttf.data.InputPosition into every rank's copy (before rank 0 saves)."""
    _ranks.gather_input_position(_backend(), position)


def open_stream(spec, **kwargs):
    """ttf.data.open_stream for this rank: its share of the stream. kwargs go to ttf.data.open_stream."""
    return _ranks.open_stream(_backend(), spec, **kwargs)


def stream_batches(stream, batch_size, stop=None, max_steps=None):
    """ttf.data.stream_batches for a Horovod job: every rank reads its own share and the ranks
    take each step together (ttf/distribute/_ranks.py: stream_batches)."""
    return _ranks.stream_batches(_backend(), stream, batch_size, stop, max_steps)


def gather_stream_position(stream):
    """Every rank's share of a stream position into every rank's copy (before rank 0 saves)."""
    _ranks.gather_stream_position(_backend(), stream)


def stream_progress(stream):
    """stream.update_progress() over every rank's share: (progress, newest event time or None)."""
    return _ranks.stream_progress(_backend(), stream)


def mean_over_examples(values, name="ttf_mean_examples"):
    """The mean of per-example values over every rank's examples, for batches that differ in
    size between the ranks, even empty (ttf.distribute.collectives.sync.mean_over_examples)."""
    return _sync.mean_over_examples(values, _backend(), name)


def agree(value, what="agree"):
    """Rank 0's `value` on every rank (a decision one clock takes)."""
    return _ranks.agree(_backend(), value, what)


def gather_rows(array, name):
    """Concatenates a NumPy array's rows over the ranks (rank order), e.g. eval predictions."""
    return _ranks.gather_rows(_backend(), array, name)


def mean_over_ranks(value, name="ttf_mean"):
    """The average of a scalar tensor over the ranks (e.g. the global batch's loss)."""
    return hvd.allreduce(value, op=hvd.Average, name=name)


def all_ranks(flag, name="ttf_all_ranks"):
    """A boolean scalar that is True only where `flag` is True on every rank (e.g. a step's
    gradients are finite: make_train_step(finite_across=all_ranks))."""
    return _sync.all_workers(flag, _backend(), name)


def check_same_config(config, what="flags"):
    """Raises ValueError naming the ranks whose `config` (a JSON-able dict) differs from rank 0's."""
    _ranks.check_same_config(_backend(), config, what)


__all__ = ["Publisher", "agree", "gather_stream_position", "mean_over_examples", "open_stream", "stream_batches",
           "stream_progress", "COMPRESSIONS", "SAVE_TIMEOUT_SECONDS", "SHUTDOWN_WAIT_SECONDS", "CollectiveMisuseError", "DistributedOptimizer", "collective", "export_for_serving", "TableSharding", "allreduce_dense", "broadcast_variables",
           "all_ranks", "check_same_config", "gather_rows", "mean_over_ranks", "rank_slice", "save_checkpoint", "shard_tables", "table_size",
           "ttf_layers", "wire_bytes", "HorovodCollectives"]
