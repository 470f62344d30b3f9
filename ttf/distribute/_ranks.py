"""The job mechanics of a synchronous job, written once over the Collectives interface
(ttf/distribute/collectives/_tf.py), so Horovod ranks and TensorFlow-collective workers share
them: checkpoints (each rank writes its own rows), the serving export (no rank holds
another's rows), publishing, a stream's shares and their positions, and the small
agreements a job takes (a flag, a config, rows to gather).

Every function is a collective: every rank calls it, in the same order. A failure on one rank
raises on every rank, naming the rank and the cause. `coll.guard(what, timeout)` turns a
collective that waits too long or loses a peer into the backend's error (Horovod:
CollectiveMisuseError; TensorFlow: LostWorkerError).
"""
import hashlib
import json
import os

import tensorflow as tf

from ttf.data import open_stream as _open_stream
from ttf.embedding import tables_in
from ttf._durable import absolute_path, fsync_path
from ttf.checkpoint._format import table_names, write_rank_part
from ttf.serving import HashedShard, HashedTable, ServingVersion
from ttf.serving import Publisher as _Publisher
from ttf.serving._publish import exported_steps

# Seconds the waits of a save or export after their first collective may take: for the
# slowest rank's pieces (a large part takes minutes to write), and for rank 0's merge and fsync.
SAVE_TIMEOUT_SECONDS = 1800.0


def agree(coll, value, what="agree"):
    """Rank 0's `value` on every rank (a decision one clock takes). A bool travels as one
    number (cheap enough for every step), anything else pickled."""
    with coll.guard(what):
        if isinstance(value, bool):
            return bool(coll.broadcast(tf.constant(value), 0, "ttf_agree_flag").numpy())
        return coll.broadcast_object(value, 0, "ttf_agree")


def gather_rows(coll, array, name):
    """A NumPy array's rows concatenated over the ranks (rank order), e.g. eval predictions."""
    return coll.allgather(tf.convert_to_tensor(array), name).numpy()


def check_same_config(coll, config, what="flags"):
    """Raises ValueError naming the ranks whose `config` (a JSON-able dict) differs from rank 0's."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    with coll.guard("check_same_config"):
        digests = coll.allgather_object(digest, "ttf_check_config")
        if all(d == digests[0] for d in digests):
            return
        configs = coll.allgather_object(config, "ttf_check_config_values")
    diffs = []
    for rank, other in enumerate(configs):
        changed = sorted(k for k in set(other) | set(configs[0]) if other.get(k) != configs[0].get(k))
        if changed:
            diffs.append(f"rank {rank} differs from rank 0 in " + ", ".join(
                f"{k} ({other.get(k)!r} vs {configs[0].get(k)!r})" for k in changed))
    raise ValueError(f"the {coll.workers_name} were started with different {what}: " + "; ".join(diffs))


def gather_input_position(coll, position):
    """Every rank's share of a ttf.data.InputPosition (rank r reads share r) into every rank's
    copy: small numbers only (call it on every rank before rank 0 saves)."""
    rank = coll.rank
    # No guard: a rank may reach this a minute after the others (seen on Horovod at the end of fit)
    states = coll.allgather(position.state[rank:rank + 1], "ttf_input_position", same_shape=True)
    examples = coll.allgather(position.examples[rank:rank + 1], "ttf_input_examples", same_shape=True)
    position.assign(states, examples)


# ---- streams: each rank its share, the ranks in step ----

def open_stream(coll, spec, **kwargs):
    """ttf.data.open_stream for this rank: its share of the stream (a Kafka topic's partitions
    p with p % size == rank; a folder's files by crc32 of the name % size)."""
    return _open_stream(spec, share=coll.rank, num_shares=coll.size, **kwargs)


def stream_batches(coll, stream, batch_size, stop=None, max_steps=None):
    """ttf.data.stream_batches for ranks in step. Each round every rank reads what its share has
    (waiting at most one poll interval), then one small allgather tells every rank what the
    others got: a step runs when any rank has examples (a rank with none steps on
    stream.empty_batch(); the job weights the loss by examples), nothing runs while every share
    is empty (each rank calls stream.on_idle, e.g. a publish), and every rank stops when any
    rank's `stop.requested` is set (a signal reaches one rank) or after max_steps. Commit each
    batch after its update, on every rank."""
    taken = 0
    while max_steps is None or taken < max_steps:
        stopping = stop is not None and stop.requested
        batch = None if stopping else stream.next_batch(batch_size, block=False)
        stopping = stopping or (stop is not None and stop.requested)
        rows = 0 if batch is None else int(tf.size(batch.labels))
        flags = coll.allgather(tf.constant([[rows, int(stopping)]], tf.int64), "ttf_stream_round",
                               same_shape=True).numpy()
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


def gather_stream_position(coll, stream):
    """Every rank's share of a stream position into every rank's copy (stream.merge_shares);
    call it on every rank before rank 0 saves. After a restore, each calls stream.adopt_share()."""
    with coll.guard("gather_stream_position"):
        states = coll.allgather_object(stream.share_state(), "ttf_stream_position")
    stream.merge_shares(states)


def stream_progress(coll, stream):
    """stream.update_progress() over every rank's share: examples trained (every share),
    examples/s and messages or bytes waiting (summed), lag in seconds (the largest), waiting
    (every share). Returns (progress, newest event time over the ranks or None)."""
    local = stream.update_progress()
    mine = dict(local, since=local["examples"] - stream.merged_examples, event_time=stream.last_event_time)
    with coll.guard("stream_progress"):
        every = coll.allgather_object(mine, "ttf_stream_progress")
    merged = dict(local)
    merged["examples"] = stream.merged_examples + sum(e["since"] for e in every)
    for field in ("examples_per_sec", "bad_lines", "empty_files"):
        merged[field] = sum(e[field] for e in every)
    merged["lag_seconds"] = max(e["lag_seconds"] for e in every)
    for field in ("lag_messages", "lag_bytes"):  # -1: unknown on some share
        merged[field] = -1 if any(e[field] < 0 for e in every) else sum(e[field] for e in every)
    merged["waiting"] = all(e["waiting"] for e in every)
    times = [e["event_time"] for e in every if e["event_time"] is not None]
    return merged, max(times) if times else None


# ---- checkpoints ----

def save_checkpoint(coll, manager, step):
    """Saves a ttf.checkpoint.CheckpointManager checkpoint of a model sharded over the ranks,
    each rank writing its own part: call it on every rank, each with its own manager on the
    same shared `directory`. Returns the path of the checkpoint (every rank); at a step rank 0
    saved already, that checkpoint's (nothing is written again).

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
    (gather_input_position).

    Raises:
      RuntimeError: the save failed on some rank (every rank raises).
    """
    rank = coll.rank
    # Not again at a step rank 0 has saved already (only its manager knows).
    mine = {"saved": manager.latest if manager.last_step == step else None, "plan": manager.delta_plan()}
    with coll.guard("save_checkpoint"):
        decision = coll.broadcast_object(mine if rank == 0 else None, 0, "ttf_save_plan")
    if decision["saved"] is not None:
        return decision["saved"]
    plan = decision["plan"]
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
            manager.begin_save(logical)
            prefixes, layout = write_rank_part(name, logical, os.path.join(folder, f"r{rank}-t{j}"), rank, since)
            written["prefixes"][name], written["layouts"][name] = prefixes, layout
        for name in tf.io.gfile.glob(os.path.join(folder, f"r{rank}-*")):
            fsync_path(name)
    except Exception as err:  # noqa: BLE001 (every rank must reach the barrier below, then all raise)
        written["error"] = error_text(err)
    with coll.guard("save_checkpoint", SAVE_TIMEOUT_SECONDS):  # the barrier: every rank's pieces written (or failed)
        every = coll.allgather_object(written, "ttf_save_parts")
    failed = failed_ranks(every)
    outcome = None
    if rank == 0:
        if failed:
            outcome = {"error": failed}
        else:
            parts = {"delta": plan is not None,
                     "prefixes": {name: [p for w in every for p in w["prefixes"][name]] for name, _ in tables},
                     "layouts": {name: [w["layouts"][name] for w in every] for name, _ in tables}}
            try:
                outcome = {"path": manager.save(step, rank_parts=parts)}
            except Exception as err:  # noqa: BLE001 (every rank learns it below, then all raise)
                outcome = {"error": "rank 0: " + error_text(err)}
    with coll.guard("save_checkpoint", SAVE_TIMEOUT_SECONDS):  # rank 0's merge, fsync and chain
        outcome = coll.broadcast_object(outcome, 0, "ttf_save_outcome")
    if "error" in outcome:
        _remove_parts(folder, rank)
        raise RuntimeError(f"ttf: the save of step {int(step)} over the {coll.workers_name} into {manager.directory} "
                           f"failed (nothing recorded; the last complete checkpoint is intact): {outcome['error']}")
    if rank != 0:  # rank 0's manager did this once the save was durable
        manager.saved_by_rank_0({logical.layer.name: max(w["layouts"][name]["step"] for w in every)
                                 for name, logical in tables})
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


# ---- the serving export ----

def export_for_serving(coll, model, base, **kwargs):
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

    kwargs: row_dtype and publish_record of ttf.export_for_serving. Returns the version's folder on rank 0, None on the
    others. A failure on any rank raises on every rank, naming the rank."""
    rank, size = coll.rank, coll.size
    row_dtype = kwargs.get("row_dtype", tf.float32)
    layers = tables_in(model)
    mine, local = [], {"error": None, "layouts": [], "base": absolute_path(os.fspath(base))}
    try:
        for layer in layers:
            shard, step = HashedShard.of_table(layer.tables[0], layer.dim, row_dtype, f"shard_{rank}",
                                               publish_record=kwargs.get("publish_record", False))
            mine.append(shard)
            local["layouts"].append(dict(shard.layout, step=step))
    except Exception as err:  # noqa: BLE001 (every rank must reach the gather below, then all raise)
        local["error"] = error_text(err)
    with coll.guard("export_for_serving"):
        every = coll.allgather_object(local, "ttf_export_layouts")
    _raise_failed(coll, every, "export_for_serving")
    if len({e["base"] for e in every}) != 1:
        raise ValueError(f"ttf (rank {rank}): export_for_serving was given different folders on the ranks "
                         f"({sorted({e['base'] for e in every})}); pass every rank the same base on a filesystem "
                         "they all can write")
    names = [[f"frozen_tables/{j}/shards/{r}/{field}/.ATTRIBUTES/VARIABLE_VALUE" for field in ("keys", "offsets", "rows")]
             for j in range(len(layers)) for r in range(size)]  # the SavedModel's names of each shard's arrays
    if rank != 0:
        return _write_rank_arrays(coll, mine, names)
    return _write_version(coll, model, base, row_dtype, mine, [e["layouts"] for e in every], names)


def _write_version(coll, model, base, row_dtype, mine, layouts, names):
    """export_for_serving on rank 0: the SavedModel (its own shards' arrays, placeholders of
    the others'), then every other rank's arrays merged in, then the version moved into place."""
    size, told, outcome = coll.size, [], {"error": None}
    try:
        writer = ServingVersion(model, base, row_dtype=row_dtype)
        with writer:
            writer.save([HashedTable(layer, dtype=row_dtype,
                                     rank_shards=[(mine[j] if r == 0 else layouts[r][j], layouts[r][j]["step"])
                                                  for r in range(size)])
                         for j, layer in enumerate(writer.layers)])
            # The SavedModel is in writer.temporary: every rank's arrays join it.
            with coll.guard("export_for_serving"):
                coll.broadcast_object({"temporary": writer.temporary}, 0, "ttf_export_folder")
            told.append(True)
            with coll.guard("export_for_serving", SAVE_TIMEOUT_SECONDS):
                written = coll.allgather_object({"error": None, "prefixes": []}, "ttf_export_arrays")
            _raise_failed(coll, written, "export_for_serving")
            placeholders = [name for j in range(len(writer.layers)) for r in range(1, size)
                            for name in names[j * size + r]]
            _merge_rank_arrays(writer.temporary, placeholders, [p for w in written for p in w["prefixes"]])
            outcome["path"] = writer.finish()
    except Exception as err:  # noqa: BLE001 (told to every rank below, then raised)
        outcome["error"] = "rank 0: " + error_text(err)
        if not told:  # the other ranks wait for the folder: tell them instead
            with coll.guard("export_for_serving"):
                coll.broadcast_object({"error": outcome["error"]}, 0, "ttf_export_folder")
        with coll.guard("export_for_serving", SAVE_TIMEOUT_SECONDS):
            coll.broadcast_object(outcome, 0, "ttf_export_done")
        raise
    with coll.guard("export_for_serving", SAVE_TIMEOUT_SECONDS):
        coll.broadcast_object(outcome, 0, "ttf_export_done")
    return outcome["path"]


def _write_rank_arrays(coll, shards, names):
    """export_for_serving on a rank other than 0: writes its shards' arrays into rank 0's
    temporary version folder under the names of their placeholders, then waits for rank 0."""
    rank, size = coll.rank, coll.size
    with coll.guard("export_for_serving"):
        told = coll.broadcast_object(None, 0, "ttf_export_folder")
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
        written["error"] = error_text(err)
    with coll.guard("export_for_serving", SAVE_TIMEOUT_SECONDS):
        coll.allgather_object(written, "ttf_export_arrays")
    with coll.guard("export_for_serving", SAVE_TIMEOUT_SECONDS):
        outcome = coll.broadcast_object(None, 0, "ttf_export_done")
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


# ---- publishing ----

class RankShards:
    """ttf.serving.Publisher's `shards` for a model sharded over the ranks: create the
    Publisher and call maybe_publish() / publish() on every rank, in the same steps (each call
    is a collective). Rank 0's clock decides when a delta, a base or the dense part is due. A
    base is export_for_serving's (each rank writes its own shards); a delta is one folder in
    which each rank writes its own table parts (no rank holds another's rows), then rank 0,
    once every rank's parts are written and fsynced, writes the dense part and the manifest
    and renames the folder into place. A write failing on any rank pauses publishing on every
    rank (one line on each; training goes on) until a later call succeeds. Every rank gives
    the same `base`, on a filesystem they can all write (one host, or a shared one)."""

    def __init__(self, coll):
        self.coll = coll
        self.writes_shared = coll.rank == 0

    def agree(self, value):
        return agree(self.coll, value, "Publisher")

    def gather(self, written):
        with self.coll.guard("Publisher", SAVE_TIMEOUT_SECONDS):
            every = self.coll.allgather_object(written, "ttf_publish_parts")
        for rank, report in enumerate(every):
            if report["error"]:
                report["error"] = f"rank {rank}: {report['error']}"
        return every

    def table_shards(self, layers):
        return [(layer, self.coll.rank, layer.tables[0]) for layer in layers]

    def export_base(self, model, base, row_dtype):
        try:
            path = export_for_serving(self.coll, model, base, row_dtype=row_dtype, publish_record=True)
        except RuntimeError as err:  # a failed write on some rank: every rank pauses publishing
            raise OSError(str(err)) from err
        return agree(self.coll, exported_steps(path) if path is not None else None, "Publisher")


def RankPublisher(coll, model, base, **kwargs):  # noqa: N802 (the name ttf.distribute.horovod calls)
    """ttf.serving.Publisher over the ranks (RankShards): as ttf.serving.Publisher's arguments."""
    return _Publisher(model, base, shards=RankShards(coll), **kwargs)


# ---- errors between ranks ----

def error_text(err):
    """One rank's error as it travels to the others: its type and the start of its message."""
    return f"{type(err).__name__}: {str(err).strip()[:500]}"


def failed_ranks(reports):
    """'rank r: error; ...' of the ranks whose report (one per rank, gathered) holds an error; '' if none."""
    return "; ".join(f"rank {r}: {report['error']}" for r, report in enumerate(reports) if report["error"])


def _raise_failed(coll, reports, what):
    failed = failed_ranks(reports)
    if failed:
        raise RuntimeError(f"ttf (rank {coll.rank}): {what} failed on {failed}")


def summed_counts(coll, counts):
    """{name: number} summed over the ranks."""
    per_rank = coll.allgather_object(counts, "ttf_counts")
    return {name: sum(c[name] for c in per_rank) for name in counts}


__all__ = ["RankPublisher", "RankShards", "SAVE_TIMEOUT_SECONDS", "agree", "check_same_config", "export_for_serving",
           "gather_input_position", "gather_rows", "gather_stream_position", "open_stream", "save_checkpoint",
           "stream_batches", "stream_progress", "summed_counts"]
