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
import hashlib
import json
import os
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
# The same for the two waits of save_checkpoint after its first collective: for the slowest
# rank's pieces (a large part takes minutes to write), and for rank 0's merge and fsync.
SAVE_TIMEOUT_SECONDS = 1800.0
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
from ttf.data import open_stream as _open_stream
from ttf.distribute import _table_sharding
from ttf.distribute._collectives import CollectiveMisuseError, Collectives
from ttf.distribute._wire import COMPRESSIONS, wire_dtype as _check_compression
from ttf.embedding import tables_in
from ttf.serving import Publisher as _Publisher
from ttf.serving._publish import exported_steps

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
    """The collectives interface (ttf/distribute/_collectives.py) over Horovod, so table
    sharding, the dense allreduce and broadcast_variables are written once for both
    backends. Horovod's alltoall takes variable splits itself: nothing is padded."""

    workers_name = "Horovod ranks"
    export_hint = ("Use ttf.distribute.horovod.export_for_serving(model, path) on every rank for serving, or "
                   "ttf.distribute.horovod.save_checkpoint(manager, step) on every rank for a checkpoint")
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
    (ttf.distribute.sync.TableSharding over HorovodCollectives.)"""

    def __init__(self, compression="none"):
        super().__init__(_backend(), compression)


def save_checkpoint(manager, step):
    """Saves a ttf.checkpoint.CheckpointManager checkpoint of a model sharded over the ranks,
    each rank writing its own part: call it on every rank (a collective), each with its own
    manager on the same shared `directory`. Returns the path of the checkpoint (every rank).

    1. Rank 0 picks a full checkpoint or a delta (its manager's delta_plan) and tells every rank.
    2. Each rank exports its shard of each table and writes it with SaveV2 into
       `<directory>/ttf-parts-<step>/` in pieces of at most 64 MiB (the checkpoint format's
       source `rank`), then fsyncs them: no rank holds another rank's rows.
    3. A barrier; rank 0's manager.save(step) writes the dense state and merges every rank's
       pieces into the checkpoint (MergeV2Checkpoints: an index merge and renames, no copy of
       rows), fsyncs, then records the chain (ttf_chain.json) last.
    4. Every rank learns the outcome; then each forgets the deleted ids its save took (those
       deleted after its shards were copied stay for the next delta). A failure on any rank
       raises on every rank, naming the rank and the cause, and leaves the previous checkpoint
       the latest.

    Restore: manager.restore_latest() on every rank; each keeps the ids it owns (any topology's
    checkpoint). Other state (dense variables, InputPosition) is rank 0's: make it agree first
    (tdh.gather_input_position).

    Raises:
      RuntimeError: the save failed on some rank (every rank raises).
      CollectiveMisuseError: some rank did not call it (within COLLECTIVE_TIMEOUT_SECONDS of the
        first; the waits for the pieces and for rank 0's merge allow SAVE_TIMEOUT_SECONDS).
    """
    from ttf._durable import fsync_path  # noqa: PLC0415
    from ttf.checkpoint._format import table_names, write_rank_part  # noqa: PLC0415

    rank = hvd.rank()
    with collective("save_checkpoint"):
        plan = hvd.broadcast_object(manager.delta_plan() if rank == 0 else None, root_rank=0, name="ttf_save_plan")
    tables = [(name, logical) for name, logical in table_names(manager.checkpoint)
              if logical.layer.sharding is not None]
    folder = os.path.join(manager.directory, f"ttf-parts-{int(step)}")  # removed by the merge once empty
    written = {"prefixes": {}, "layouts": {}, "error": None}
    try:
        tf.io.gfile.makedirs(folder)
        _remove_parts(folder, rank, remove_folder=False)  # a killed earlier save's pieces
        for j, (name, logical) in enumerate(tables):
            if plan is not None and logical.layer.name not in plan:
                raise ValueError(f"rank 0's delta plan names no start step for {logical.layer.name}: do the ranks "
                                 "build the same model?")
            since = None if plan is None else plan[logical.layer.name]
            logical.begin_save()
            prefixes, layout = write_rank_part(name, logical, os.path.join(folder, f"r{rank}-t{j}"), rank, since)
            written["prefixes"][name], written["layouts"][name] = prefixes, layout
        for name in tf.io.gfile.glob(os.path.join(folder, f"r{rank}-*")):
            fsync_path(name)
    except Exception as err:  # noqa: BLE001 (every rank must reach the barrier below, then all raise)
        written["error"] = _error_text(err)
    with collective("save_checkpoint", SAVE_TIMEOUT_SECONDS):  # the barrier: every rank's pieces written (or failed)
        every = hvd.allgather_object(written, name="ttf_save_parts")
    failed = _failed_ranks(every)
    outcome = None
    if rank == 0:
        if failed:
            outcome = {"error": failed}
        else:
            for name, logical in tables:
                logical.rank_parts = {"delta": plan is not None,
                                      "prefixes": {name: [p for w in every for p in w["prefixes"][name]]},
                                      "layouts": {name: [w["layouts"][name] for w in every]}}
            try:
                outcome = {"path": manager.save(step)}
            except Exception as err:  # noqa: BLE001 (every rank learns it below, then all raise)
                outcome = {"error": "rank 0: " + _error_text(err)}
            finally:
                for _, logical in tables:
                    logical.rank_parts = None
    with collective("save_checkpoint", SAVE_TIMEOUT_SECONDS):  # rank 0's merge, fsync and chain
        outcome = hvd.broadcast_object(outcome, root_rank=0, name="ttf_save_outcome")
    if "error" in outcome:
        _remove_parts(folder, rank)
        raise RuntimeError(f"ttf: the Horovod save of step {int(step)} into {manager.directory} failed (nothing "
                           f"recorded; the last complete checkpoint is intact): {outcome['error']}")
    if rank != 0:  # rank 0's manager did this once the save was durable
        for name, logical in tables:
            logical.saved_step = max(w["layouts"][name]["step"] for w in every)
            logical.layer.commit_save()
    return outcome["path"]


def _remove_parts(folder, rank, remove_folder=True):
    """Removes this rank's pieces of a failed or killed save (and the folder once empty)."""
    for name in tf.io.gfile.glob(os.path.join(folder, f"r{rank}-*")):
        try:
            tf.io.gfile.remove(name)
        except tf.errors.NotFoundError:
            pass
    if not remove_folder:
        return
    try:
        if not tf.io.gfile.listdir(folder):
            tf.io.gfile.rmtree(folder)
    except (OSError, tf.errors.OpError):
        pass  # another rank's pieces are still there, or another rank removed it


ttf_layers = tables_in  # the ttf embedding layers of a Keras model, in a fixed order (ttf.embedding.tables_in)


def shard_tables(model, compression="none"):
    """Shards every ttf table of `model` over the Horovod ranks (call after hvd.init(), before
    training). Returns the sharded layers. A layer already sharded over parameter servers
    (shard_devices) cannot also be sharded over ranks."""
    if KERAS3:  # its functional graph is another (Node.operation, no _run_internal_graph): never run here
        raise ValueError(f"ttf.distribute.horovod.shard_tables: {model.name} is a Keras 3 model; ttf shards tables over "
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
    the same `base` on a filesystem every rank can write (one host, or a shared one, as for
    save_checkpoint). No rank holds another rank's rows:

    1. Each rank builds the serving arrays of its own shard of each table (rows only,
       HashedShard) and tells the others their layout (a few numbers).
    2. Rank 0 writes the SavedModel (graph, dense weights, its own shards, and empty
       placeholders of the other ranks' shards) into the version's temporary folder.
    3. Every other rank writes its shards' arrays there (SaveV2) under the placeholders' names.
    4. Rank 0 merges them into the SavedModel's variables (MergeV2Checkpoints: an index merge
       and renames, no copy of another rank's rows), checks the graph and renames the version
       into place (atomic, as ttf.export_for_serving).

    kwargs go to ttf.export_for_serving. Returns the version's folder on rank 0, None on the
    others. A failure on any rank raises on every rank, naming the rank."""
    from ttf.serving._export import HashedShard, HashedTable  # noqa: PLC0415 (serving imports this module's peers)
    from ttf.serving._export import export_for_serving as export  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    row_dtype = kwargs.get("row_dtype", tf.float32)
    layers = tables_in(model)
    mine, local = [], {"error": None, "layouts": [], "base": os.path.abspath(os.fspath(base))}
    try:
        for layer in layers:
            shard, step = HashedShard.of_table(layer.tables[0], layer.dim, row_dtype, f"shard_{rank}",
                                               publish_record=kwargs.get("publish_record", False))
            mine.append(shard)
            local["layouts"].append(dict(shard.layout, step=step))
    except Exception as err:  # noqa: BLE001 (every rank must reach the gather below, then all raise)
        local["error"] = _error_text(err)
    with collective("export_for_serving"):
        every = hvd.allgather_object(local, name="ttf_export_layouts")
    _raise_failed(every, "export_for_serving")
    if len({e["base"] for e in every}) != 1:
        raise ValueError(f"ttf (rank {rank}): export_for_serving was given different folders on the ranks "
                         f"({sorted({e['base'] for e in every})}); pass every rank the same base on a filesystem "
                         "they all can write")
    names = [[f"frozen_tables/{j}/shards/{r}/{field}/.ATTRIBUTES/VARIABLE_VALUE" for field in ("keys", "offsets", "rows")]
             for j in range(len(layers)) for r in range(size)]  # the SavedModel's names of each shard's arrays
    if rank != 0:
        return _write_rank_arrays(mine, names, rank, size)
    frozen = [HashedTable(layer, dtype=row_dtype,
                          rank_shards=[(mine[j] if r == 0 else every[r]["layouts"][j], every[r]["layouts"][j]["step"])
                                       for r in range(size)])
              for j, layer in enumerate(layers)]
    told = []

    def finish(temporary):  # the SavedModel is in `temporary`: every rank's arrays join it
        with collective("export_for_serving"):
            hvd.broadcast_object({"temporary": temporary}, root_rank=0, name="ttf_export_folder")
        told.append(True)
        with collective("export_for_serving", SAVE_TIMEOUT_SECONDS):
            written = hvd.allgather_object({"error": None, "prefixes": []}, name="ttf_export_arrays")
        _raise_failed(written, "export_for_serving")
        placeholders = [name for j in range(len(layers)) for r in range(1, size) for name in names[j * size + r]]
        _merge_rank_arrays(temporary, placeholders, [p for w in written for p in w["prefixes"]])

    outcome = {"error": None}
    try:
        outcome["path"] = export(model, base, _frozen=frozen, _finish=finish, **kwargs)
    except Exception as err:  # noqa: BLE001 (told to every rank below, then raised)
        outcome["error"] = "rank 0: " + _error_text(err)
        if not told:  # the other ranks wait for the folder: tell them instead
            with collective("export_for_serving"):
                hvd.broadcast_object({"error": outcome["error"]}, root_rank=0, name="ttf_export_folder")
        with collective("export_for_serving", SAVE_TIMEOUT_SECONDS):
            hvd.broadcast_object(outcome, root_rank=0, name="ttf_export_done")
        raise
    with collective("export_for_serving", SAVE_TIMEOUT_SECONDS):
        hvd.broadcast_object(outcome, root_rank=0, name="ttf_export_done")
    return outcome["path"]


class Publisher(_Publisher):
    """ttf.serving.Publisher for a model sharded over the Horovod ranks: create it and call
    maybe_publish() / publish() on every rank, in the same steps (each call is a collective).
    Rank 0's clock decides when a delta, a base or the dense part is due. A base is
    export_for_serving's (each rank writes its own shards); a delta is one folder in which
    each rank writes its own table parts (no rank holds another's rows), then rank 0, once
    every rank's parts are written and fsynced, writes the dense part and the manifest and
    renames the folder into place. A write failing on any rank pauses publishing on every
    rank (one line on each; training goes on) until a later call succeeds.

    Args: as ttf.serving.Publisher (the same `base` on every rank, on a filesystem they can
    all write: one host, or a shared one)."""

    def __init__(self, model, base, **kwargs):
        super().__init__(model, base, **kwargs)
        self._rank = hvd.rank()
        self._writes_shared = self._rank == 0

    def _agree(self, value):
        return agree(value, "Publisher")

    def _gather(self, written):
        with collective("Publisher", SAVE_TIMEOUT_SECONDS):
            every = hvd.allgather_object(written, name="ttf_publish_parts")
        for rank, report in enumerate(every):
            if report["error"]:
                report["error"] = f"rank {rank}: {report['error']}"
        return every

    def _shards(self):
        return [(layer, self._rank, layer.tables[0]) for layer in self.layers]

    def _export_base(self):
        try:
            path = export_for_serving(self.model, self.base, row_dtype=self.row_dtype, publish_record=True)
        except RuntimeError as err:  # a failed write on some rank: every rank pauses publishing
            raise OSError(str(err)) from err
        return agree(exported_steps(path) if path is not None else None, "Publisher")


def _error_text(err):
    """One rank's error as it travels to the others: its type and the start of its message."""
    return f"{type(err).__name__}: {str(err).strip()[:500]}"


def _failed_ranks(reports):
    """'rank r: error; ...' of the ranks whose report (one per rank, gathered) holds an error; '' if none."""
    return "; ".join(f"rank {r}: {report['error']}" for r, report in enumerate(reports) if report["error"])


def _raise_failed(reports, what):
    failed = _failed_ranks(reports)
    if failed:
        raise RuntimeError(f"ttf (rank {hvd.rank()}): {what} failed on {failed}")


def _write_rank_arrays(shards, names, rank, size):
    """export_for_serving on a rank other than 0: writes its shards' arrays into rank 0's
    temporary version folder under the names of their placeholders, then waits for rank 0."""
    told = hvd.broadcast_object(None, root_rank=0, name="ttf_export_folder")
    if "error" in told:
        raise RuntimeError(f"ttf (rank {rank}): export_for_serving failed on {told['error']}")
    written = {"error": None, "prefixes": []}
    try:
        for j, shard in enumerate(shards):
            prefix = os.path.join(told["temporary"], "variables", f"ttf-rank{rank}-t{j}")
            tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names[j * size + rank], shape_and_slices=[""] * 3,
                              tensors=[shard.keys, shard.offsets, shard.rows])  # the order of `names`
            written["prefixes"].append(prefix)
    except Exception as err:  # noqa: BLE001 (rank 0 learns it in the gather, then every rank raises)
        written["error"] = _error_text(err)
    with collective("export_for_serving", SAVE_TIMEOUT_SECONDS):
        hvd.allgather_object(written, name="ttf_export_arrays")
    with collective("export_for_serving", SAVE_TIMEOUT_SECONDS):
        outcome = hvd.broadcast_object(None, root_rank=0, name="ttf_export_done")
    if outcome["error"]:
        raise RuntimeError(f"ttf (rank {rank}): export_for_serving failed on {outcome['error']}")
    return None


def _merge_rank_arrays(temporary, placeholders, prefixes):
    """Rank 0: the SavedModel's variables bundle, without the other ranks' (empty) placeholders,
    merged with the bundles those ranks wrote (copied one entry at a time: rank 0's own arrays
    only; the others' are renamed into place by the merge)."""
    variables = os.path.join(temporary, "variables", "variables")
    reader = tf.train.load_checkpoint(variables)
    dtypes = reader.get_variable_to_dtype_map()
    missing = sorted(set(placeholders) - set(dtypes))
    if missing:  # TensorFlow named the SavedModel's variables otherwise
        raise RuntimeError(f"the SavedModel holds no entries {missing[:3]}: report this as a ttf bug (TensorFlow "
                           f"{tf.__version__})")
    placeholders = set(placeholders)
    kept = [name for name in dtypes if name not in placeholders]
    copies = []
    for i, name in enumerate(kept):
        copy = os.path.join(temporary, "variables", f"ttf-rank0-e{i}")
        value = tf.raw_ops.RestoreV2(prefix=variables, tensor_names=[name], shape_and_slices=[""],
                                     dtypes=[dtypes[name]])[0]
        tf.raw_ops.SaveV2(prefix=copy, tensor_names=[name], shape_and_slices=[""], tensors=[value])
        copies.append(copy)
        del value
    for name in tf.io.gfile.glob(variables + ".*"):
        tf.io.gfile.remove(name)
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=copies + list(prefixes), destination_prefix=variables,
                                  delete_old_dirs=False)


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
    """This rank's slice of each global batch: `dataset` yields global batches of
    batch_size x size (every rank reads the same stream), this rank keeps rows
    [rank * batch_size, (rank + 1) * batch_size) of each, so the ranks together see exactly
    the examples of one process's global batch, in the same steps."""
    start = hvd.rank() * batch_size

    def take(*element):
        return tf.nest.map_structure(lambda t: t[start:start + batch_size], element)

    return dataset.map(take, num_parallel_calls=tf.data.AUTOTUNE)


def gather_input_position(position):
    """Every rank's share of a ttf.data.InputPosition (rank r reads share r) into every rank's
    copy: a collective, small numbers only (call it on every rank before rank 0 saves)."""
    rank = hvd.rank()
    states = hvd.allgather(position.state[rank:rank + 1], name="ttf_input_position")
    examples = hvd.allgather(position.examples[rank:rank + 1], name="ttf_input_examples")
    position.assign(states, examples)


def open_stream(spec, **kwargs):
    """ttf.data.open_stream for this rank: its share of the stream (a Kafka topic's partitions
    p with p % size == rank; a folder's files by crc32 of the name % size). kwargs go to
    ttf.data.open_stream (schema, strict, poll_seconds, kafka_config)."""
    return _open_stream(spec, share=hvd.rank(), num_shares=hvd.size(), **kwargs)


def stream_batches(stream, batch_size, stop=None, max_steps=None):
    """ttf.data.stream_batches for a Horovod job: every rank reads its own share (open_stream)
    and the ranks take each step together. Each round every rank reads what its share has
    (waiting at most one poll interval), then one small allgather tells every rank what the
    others got: a step runs when any rank has examples (a rank with none steps on
    stream.empty_batch(); weight the loss by examples: mean_over_examples), nothing runs while
    every share is empty (each rank calls stream.on_idle, e.g. a publish), and every rank stops
    when any rank's `stop.requested` is set (a signal reaches one rank) or after max_steps.
    Commit each batch after its update, on every rank."""
    taken = 0
    while max_steps is None or taken < max_steps:
        stopping = stop is not None and stop.requested
        batch = None if stopping else stream.next_batch(batch_size, block=False)
        stopping = stopping or (stop is not None and stop.requested)
        rows = 0 if batch is None else int(tf.size(batch.labels))
        flags = hvd.allgather(tf.constant([[rows, int(stopping)]], tf.int64), name="ttf_stream_round").numpy()
        if flags[:, 1].any():
            if stop is not None and not stop.requested:
                stop.request(f"a stop on rank {int(flags[:, 1].argmax())}")
            stream.rewind()  # a batch read but not trained is read again after a restart
            return
        if not flags[:, 0].any():
            if stream.on_idle is not None:  # every rank here in the same round: a collective may run
                stream.on_idle()
            continue
        taken += 1
        yield batch if batch is not None else stream.empty_batch()


def gather_stream_position(stream):
    """Every rank's share of a stream position into every rank's copy (stream.merge_shares):
    a collective of small numbers; call it on every rank before rank 0 saves a checkpoint.
    After a restore, call stream.adopt_share() on every rank."""
    with collective("gather_stream_position"):
        states = hvd.allgather_object(stream.share_state(), name="ttf_stream_position")
    stream.merge_shares(states)


def stream_progress(stream):
    """stream.update_progress() over every rank's share (a collective): examples trained (every
    share), examples/s and messages or bytes waiting (summed), lag in seconds (the largest),
    waiting (every share). Returns (progress, newest event time over the ranks or None)."""
    local = stream.update_progress()
    mine = dict(local, since=local["examples"] - stream._merged_examples,  # pylint: disable=protected-access
                event_time=stream.last_event_time)
    with collective("stream_progress"):
        every = hvd.allgather_object(mine, name="ttf_stream_progress")
    merged = dict(local)
    merged["examples"] = stream._merged_examples + sum(e["since"] for e in every)  # pylint: disable=protected-access
    merged["examples_per_sec"] = sum(e["examples_per_sec"] for e in every)
    merged["lag_seconds"] = max(e["lag_seconds"] for e in every)
    for field in ("lag_messages", "lag_bytes"):  # -1: unknown on some share
        merged[field] = -1 if any(e[field] < 0 for e in every) else sum(e[field] for e in every)
    merged["waiting"] = all(e["waiting"] for e in every)
    times = [e["event_time"] for e in every if e["event_time"] is not None]
    return merged, max(times) if times else None


def mean_over_examples(values, name="ttf_mean_examples"):
    """The mean of per-example values (e.g. each example's loss) over every rank's examples,
    for batches that differ in size between the ranks (a stream's, or a last partial one),
    even empty. Each rank returns sum(own) x size / (examples on every rank), averaged over
    the ranks: the value is the global mean, and the gradient of each rank's term, averaged
    by the DistributedOptimizer, is the gradient of the global mean."""
    total = hvd.allreduce(tf.cast(tf.size(values), tf.float32), op=hvd.Sum, name=f"{name}_count")
    local = tf.reduce_sum(values) * float(hvd.size()) / tf.maximum(total, 1.0)
    return hvd.allreduce(local, op=hvd.Average, name=name)


def agree(value, what="agree"):
    """Rank 0's `value` on every rank (a decision one clock takes): a collective. A bool travels
    as one number (cheap enough for every step), anything else pickled."""
    with collective(what):
        if isinstance(value, bool):
            return bool(hvd.broadcast(tf.constant(value), root_rank=0, name="ttf_agree_flag").numpy())
        return hvd.broadcast_object(value, root_rank=0, name="ttf_agree")


def gather_rows(array, name):
    """Concatenates a NumPy array's rows over the ranks (rank order), e.g. eval predictions."""
    return hvd.allgather(tf.convert_to_tensor(array), name=name).numpy()


def mean_over_ranks(value, name="ttf_mean"):
    """The average of a scalar tensor over the ranks (e.g. the global batch's loss)."""
    return hvd.allreduce(value, op=hvd.Average, name=name)


def all_ranks(flag, name="ttf_all_ranks"):
    """A boolean scalar that is True only where `flag` is True on every rank (e.g. a step's
    gradients are finite: make_train_step(finite_across=all_ranks))."""
    return tf.cast(hvd.allreduce(tf.cast(flag, tf.int32), op=hvd.Min, name=name), tf.bool)


def check_same_config(config, what="flags"):
    """Raises ValueError naming the ranks whose `config` (a JSON-able dict) differs from rank 0's."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    with collective("check_same_config"):
        digests = hvd.allgather_object(digest, name="ttf_check_config")
    configs = None
    if any(d != digests[0] for d in digests):
        configs = hvd.allgather_object(config, name="ttf_check_config_values")
        diffs = []
        for rank, other in enumerate(configs):
            changed = sorted(k for k in set(other) | set(configs[0]) if other.get(k) != configs[0].get(k))
            if changed:
                diffs.append(f"rank {rank} differs from rank 0 in " + ", ".join(
                    f"{k} ({other.get(k)!r} vs {configs[0].get(k)!r})" for k in changed))
        raise ValueError(f"the ranks were started with different {what}: " + "; ".join(diffs))


__all__ = ["Publisher", "agree", "gather_stream_position", "mean_over_examples", "open_stream", "stream_batches",
           "stream_progress", "COMPRESSIONS", "SAVE_TIMEOUT_SECONDS", "SHUTDOWN_WAIT_SECONDS", "CollectiveMisuseError", "DistributedOptimizer", "collective", "export_for_serving", "TableSharding", "allreduce_dense", "broadcast_variables",
           "all_ranks", "check_same_config", "gather_rows", "mean_over_ranks", "rank_slice", "save_checkpoint", "shard_tables", "table_size",
           "ttf_layers", "wire_bytes", "HorovodCollectives"]
