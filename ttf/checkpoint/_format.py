"""The sharded, streamed table format: a TF registered checkpoint saver for LogicalTable.

Save: for each table, each shard (source i) is written on its own device (a PS writes its
part; in one process, one source per shard) by TtfTableSave, in pieces of at most PIECE_BYTES
of rows (and of candidates), one small bundle per piece, written while the shard is read one
lock shard at a time (each lock shard a consistent snapshot, docs/checkpoints.md; one piece in
RAM at a time; a tiered shard's disk rows streamed from its files); the pieces are merged (MergeV2Checkpoints: index
merge + renames, no row copy) into this saver's prefix, which TensorFlow merges into the
checkpoint. On Horovod, source i is rank i's shard: each rank writes its own pieces first
(write_rank_part, called by ttf.distribute.horovod.save_checkpoint on every rank) into the
checkpoint's folder, and rank 0's save merges every rank's bundles (_rank_parts). Tensors, under the
table's object name `<obj>`:

  <obj>/ttf/kind                       "full" or "delta"
  <obj>/ttf/num_sources                int64: shards written
  <obj>/ttf/optimizer, slot_init, step the logical table's layout and step
  <obj>/ttf/src-<i>/num_parts          int64
  <obj>/ttf/src-<i>/deleted_keys       int64 [D] (delta only)
  <obj>/ttf/src-<i>/row_layout         string (compressed rows only): the layout tag of values
  <obj>/ttf/src-<i>/part-<k>/keys, values, meta, candidate_keys, candidate_meta

values: fp32 rows in the full layout (dim * (1 + slots) floats: an fp32 table's checkpoint is
what it always was); bf16 and int8 rows as the row store holds them, their stored words as
float32 bits, decoded by the source's row_layout tag (ops/kernels/row_layout.h), so a restore
into a table of the same layout copies them (the same bits) and another decodes and converts.

Restore: each new shard, on its device, reads the pieces one at a time (RestoreV2) and
imports the keys it owns (the Import op's partition filter: shard_of), so a process holds
its own rows plus one piece. Every op of this module runs in eager mode and in a
tf.function (TensorFlow traces saves and restores that span several tasks).

The private TensorFlow APIs this needs, `registration` and `save_context` (tensorflow/python/
saved_model/, in TF 2.16 through 2.21), are imported here (and `registration` in _table.py).
"""
import sys

import tensorflow as tf
from tensorflow.python.checkpoint import graph_view  # (private, TF 2.16 through 2.21)
from tensorflow.python.saved_model import registration, save_context
from tensorflow.python.trackable import trackable_utils

from ttf._ops import ops
from ttf.embedding._logical import EXPORT_FIELDS, LogicalTable

PIECE_BYTES = 64 << 20  # the most one piece of a shard holds (rows + meta + keys)
PART_FIELDS = ("keys", "values", "meta", "candidate_keys", "candidate_meta")
_PART_DTYPES = (tf.int64, tf.float32, tf.int64, tf.int64, tf.int64)
_ATTRIBUTES = "/.ATTRIBUTES/"  # the earlier format: one entry per field of the whole table


def _save(trackables, file_prefix):
    """save_fn of the registered saver: writes every table, returns the merged prefix."""
    prefixes = []
    for j, (name, logical) in enumerate(sorted(trackables.items())):
        tmp = tf.strings.join([file_prefix, f"_temp/t{j}"])  # removed by the merge below
        prefixes.extend(tf.reshape(p, [-1]) for p in _save_table(name, logical, tmp))
    with tf.device("CPU:0"):
        merged = tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=tf.concat(prefixes, 0),
                                               destination_prefix=file_prefix, delete_old_dirs=True)
    with tf.control_dependencies([merged]):
        return [tf.identity(file_prefix)]


def _since_step(logical):
    """None (a full save) or the step a delta starts after (the plan of CheckpointManager.delta_plan)."""
    mode = logical.mode
    return None if mode is None or not mode.delta else mode.since[logical.layer.name]


def _note_step(logical, step):
    """The table step a save wrote or a restore read, for the CheckpointManager doing it (eager only)."""
    if tf.executing_eagerly() and logical.mode is not None:
        logical.mode.steps[logical.layer.name] = int(step)


def _save_table(name, logical, tmp):
    delta = logical.mode is not None and logical.mode.delta
    if logical.layer.sharding is not None:  # Horovod: every rank has written its own part already
        prefixes, layouts = _rank_parts(name, logical, delta)
    else:
        prefixes, layouts = [], []
        since = _since_step(logical)
        for i, table in enumerate(logical.layer.tables):
            with tf.device(table._resource_device):  # pylint: disable=protected-access  # where the shard's rows are
                written, layout = _write_source(tf.strings.join([tmp, f"-s{i}"]), f"{name}/ttf/src-{i}", table, since)
            prefixes.append(written)
            layouts.append(layout)
    slots = tf.stack([tf.size(layout["slot_init"]) for layout in layouts])
    widest = tf.argmax(slots)  # a shard holding the optimizer's slots, if any does
    layout = {"kind": tf.constant("delta" if delta else "full"), "num_sources": tf.constant(len(layouts), tf.int64),
              "optimizer": tf.gather(tf.stack([s["optimizer"] for s in layouts]), widest),
              "slot_init": tf.concat([s["slot_init"] for s in layouts], 0)[: tf.reduce_max(slots)],
              "step": tf.reduce_max(tf.stack([s["step"] for s in layouts]))}
    with tf.device("CPU:0"):
        header = tf.strings.join([tmp, "-layout"])
        prefixes.append([_save_v2(header, [f"{name}/ttf/{k}" for k in layout], list(layout.values()))])
    _note_step(logical, layout["step"])
    return prefixes


def _write_source(prefix, base, table, since_step):
    """Writes one source (a table shard) under `base` (`<obj>/ttf/src-<i>`) in bundles
    `prefix`-p<k> (TtfTableSave: one piece of at most PIECE_BYTES in RAM at a time, a tiered
    table's disk rows streamed from its files) and `prefix`-header; returns (their prefixes
    [num_parts + 1], its layout: optimizer, slot_init, step and stride, the words of a row with
    slots). since_step: None (full) or the delta's start. A compressed table's header holds
    its row layout tag."""
    delta = since_step is not None
    parts, optimizer, slot_init, step, stride, deleted_keys, row_layout = ops().ttf_table_save(
        table.resource_handle, prefix, base, tf.cast(since_step if delta else -1, tf.int64), delta=delta,
        piece_bytes=PIECE_BYTES)
    num_parts = tf.size(parts, out_type=tf.int64)
    names = [f"{base}/num_parts"] + ([f"{base}/deleted_keys"] if delta else [])
    values = [num_parts] + ([deleted_keys] if delta else [])
    if table.rows != "fp32":  # fp32 rows are the full layout: no tag, the checkpoint of before
        names.append(f"{base}/row_layout")
        values.append(row_layout)
    header = _save_v2(tf.strings.join([prefix, "-header"]), names, values)
    layout = {"optimizer": optimizer, "slot_init": slot_init, "step": step, "stride": stride}
    return tf.concat([parts, [header]], 0), layout


def table_names(checkpoint):
    """[(object name, LogicalTable)] of `checkpoint`: the names TensorFlow's save gives the
    tables' entries (`<obj>` above), found the way it finds them (a breadth-first walk)."""
    objects, paths = graph_view.ObjectGraphView(checkpoint).breadth_first_traversal()
    return [(trackable_utils.object_path_to_string(paths[obj]), obj) for obj in objects
            if isinstance(obj, LogicalTable)]


def write_rank_part(name, logical, prefix, rank, since_step):
    """Horovod: writes this rank's shard of the table `logical` (named `name` in the
    checkpoint) as source `rank`, in pieces of at most PIECE_BYTES, into bundles `prefix`-*
    (eager, on this rank: no row leaves it). since_step: None (full) or the delta's start.
    Returns (the bundles' prefixes, the source's layout as plain Python / NumPy values)
    for rank 0, whose CheckpointManager.save(step, rank_parts=...) merges every rank's bundles
    into the checkpoint (_rank_parts)."""
    table = logical.layer.tables[0]
    with tf.device(table._resource_device):  # pylint: disable=protected-access
        written, layout = _write_source(tf.constant(prefix), f"{name}/ttf/src-{rank}", table, since_step)
    layout = {"optimizer": layout["optimizer"].numpy(), "slot_init": layout["slot_init"].numpy(),
              "step": int(layout["step"]), "stride": int(layout["stride"])}
    return [p.decode() for p in written.numpy()], layout


def _rank_parts(name, logical, delta):
    """(prefixes, layouts) of the bundles every rank wrote for this table (given to rank 0's
    CheckpointManager.save by ttf.distribute's save)."""
    staged = logical.mode and logical.mode.rank_parts
    if staged is None:
        raise ValueError(
            f"{logical.layer.name} is sharded over {logical.layer.sharding.size} ranks, and each rank writes "
            "its own part of a checkpoint: call ttf.distribute.sync.save_checkpoint(manager, step, collectives) on every rank "
            "(not manager.save or checkpoint.write, which would write this rank's ids only)")
    if staged["delta"] != delta:
        raise RuntimeError(f"{name}: the ranks wrote {'delta' if staged['delta'] else 'full'} parts for a "
                           f"{'delta' if delta else 'full'} save; report this as a ttf bug")
    prefixes = [tf.constant(p, tf.string) for p in staged["prefixes"][name]]
    layouts = [{"optimizer": tf.constant(s["optimizer"]), "slot_init": tf.constant(s["slot_init"], tf.float32),
                "step": tf.constant(s["step"], tf.int64), "stride": tf.constant(s["stride"], tf.int32)}
               for s in staged["layouts"][name]]
    return prefixes, layouts


def _save_v2(prefix, names, tensors):
    """SaveV2 of `tensors` under `names` into the bundle `prefix`; returns prefix once written."""
    saved = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(tensors), tensors=tensors)
    with tf.control_dependencies([saved]):
        return tf.identity(prefix)


# -- restore


def _restore(trackables, merged_prefix):
    """restore_fn of the registered saver (also given checkpoints of the earlier format)."""
    for name, logical in sorted(trackables.items()):
        if _ATTRIBUTES in name:
            _restore_attributes(name.rsplit(_ATTRIBUTES, 1)[0], logical, merged_prefix)
        else:
            _restore_table(name, logical, merged_prefix)
        logical.restored = True


def _read(prefix, names, dtypes):
    return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(dtypes),
                                dtypes=list(dtypes))


def _targets(layer):
    """[(table, num_partitions, partition)]: the shards of `layer` in this process."""
    if layer.sharding is not None:  # Horovod: this rank's shard
        return [(layer.tables[0], layer.sharding.size, layer.sharding.rank)]
    return [(table, len(layer.tables), i) for i, table in enumerate(layer.tables)]


def _restore_table(name, logical, prefix):
    layer, delta = logical.layer, logical.mode is not None and logical.mode.delta
    with tf.device("CPU:0"):
        kind, num_sources, optimizer, slot_init, step = _read(
            prefix, [f"{name}/ttf/{k}" for k in ("kind", "num_sources", "optimizer", "slot_init", "step")],
            (tf.string, tf.int64, tf.string, tf.float32, tf.int64))
        want = "delta" if delta else "full"
        message = (f"{name}: the checkpoint {{}} holds a table of another kind than a {want} one (a delta restores "
                   "only through ttf.checkpoint.CheckpointManager, after its full checkpoint)")
        if tf.executing_eagerly():
            if kind.numpy().decode() != want:
                raise ValueError(message.format(prefix.numpy().decode()))
            checked = tf.no_op()
        else:
            checked = tf.debugging.Assert(tf.equal(kind, want), [tf.strings.format(message, prefix)])
        targets = _targets(layer)
        if layer.sharding is not None:  # Horovod: broadcast_variables refuses a restore on some ranks only
            layer.sharding.note_restore(layer)
        shards = targets[0][1]  # the layer's shards over every process (Horovod: ranks)
        tf.cond(tf.not_equal(num_sources, shards),
                lambda: tf.print(f"ttf: restoring {layer.name} from", num_sources, f"shards into {shards}",
                                 output_stream=sys.stderr),
                tf.no_op)
        if not delta:  # its deltas hold the same layout: one line
            _note_conversion(layer, ops().ttf_bundle_string(prefix, f"{name}/ttf/src-0/row_layout"))
    dim = layer.dim
    slot_row = tf.repeat(slot_init, dim)  # what a row without slots gets, as the optimizer would give
    for table, num_partitions, partition in targets:
        handle = table.resource_handle
        partitioned = dict(num_partitions=num_partitions, partition=partition)
        with tf.device(table._resource_device), tf.control_dependencies([checked]):  # pylint: disable=protected-access
            empty_rows = tf.zeros([0, dim * (1 + tf.size(slot_init))], tf.float32)
            empty = [tf.zeros([0], tf.int64), empty_rows, tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64),
                     tf.zeros([0, 2], tf.int64)]
            # A full restore first empties the shard and sets the layout; a delta keeps the content.
            started = ops().ttf_table_import(handle, *empty, optimizer, slot_init, step, merge=delta, **partitioned)

            def restore_source(i, done, table=table, handle=handle, partitioned=partitioned):
                base = tf.strings.join([f"{name}/ttf/src-", tf.strings.as_string(i)])
                with tf.control_dependencies([done]):
                    num_parts = _read(prefix, [tf.strings.join([base, "/num_parts"])], (tf.int64,))[0]
                    row_layout = ops().ttf_bundle_string(prefix, tf.strings.join([base, "/row_layout"]))
                    if delta:  # the keys deleted since the last save: others' are ignored
                        deleted = _read(prefix, [tf.strings.join([base, "/deleted_keys"])], (tf.int64,))[0]
                        removed = ops().ttf_table_remove(handle, deleted)
                        with tf.control_dependencies([removed]):
                            done = tf.identity(done)

                def restore_part(k, done):
                    names = [tf.strings.join([base, "/part-", tf.strings.as_string(k), f"/{f}"]) for f in PART_FIELDS]
                    with tf.control_dependencies([done]):
                        keys, values, meta, candidate_keys, candidate_meta = _read(prefix, tf.stack(names), _PART_DTYPES)
                        # Full-layout rows without slots get them here (stored words: by the import).
                        missing = tf.where(tf.equal(row_layout, ""), tf.size(slot_row) + dim - tf.shape(values)[1], 0)
                        values = tf.cond(  # no copy of the piece unless it lacks the slots
                            missing > 0,
                            lambda values=values, missing=missing: tf.concat(
                                [values, tf.tile(slot_row[None, tf.size(slot_row) - missing:],
                                                 [tf.shape(values)[0], 1])], 1),
                            lambda values=values: values)
                        imported = ops().ttf_table_import_stored(
                            handle, keys, values, meta, candidate_keys, candidate_meta, optimizer, slot_init, step,
                            row_layout, merge=True, **partitioned)
                    with tf.control_dependencies([imported]):
                        return k + 1, tf.identity(done)

                _, done = tf.while_loop(lambda k, _: k < num_parts, restore_part, (tf.constant(0, tf.int64), done))
                return i + 1, done

            done = tf.constant(True)
            with tf.control_dependencies([started]):
                done = tf.identity(done)
            tf.while_loop(lambda i, _: i < num_sources, restore_source, (tf.constant(0, tf.int64), done))
    _note_step(logical, step)


def _note_conversion(layer, row_layout):
    """One line when a checkpoint's stored rows (row_layout: a source's tag, '' for the full
    layout) are of another format than the layer's: they are decoded and converted."""
    rows = layer.tables[0].rows
    stored = tf.strings.regex_replace(row_layout, "^rows=([a-z0-9]+) .*$", "\\1")
    tf.cond(tf.logical_and(tf.not_equal(row_layout, ""), tf.not_equal(stored, rows)),
            lambda: tf.print(tf.strings.join([f"ttf: restoring {layer.name}: converting the checkpoint's ", stored,
                                              f" rows to {rows} rows (its row layout: ", row_layout, ")"]),
                             output_stream=sys.stderr),
            tf.no_op)


def _restore_attributes(base, logical, prefix):
    """The earlier format: the whole logical table in one entry per field (read by each
    process, since that is how it was written)."""
    delta = logical.mode is not None and logical.mode.delta
    fields = EXPORT_FIELDS + (("deleted_keys",) if delta else ())
    dtypes = {"optimizer": tf.string, "slot_init": tf.float32, "values": tf.float32}
    with tf.device("CPU:0"):
        names = [f"{base}{_ATTRIBUTES}{'delta_' if delta else ''}{f}" for f in fields]
        tensors = dict(zip(fields, _read(prefix, names, [dtypes.get(f, tf.int64) for f in fields])))
    logical.layer.import_table(tensors)
    _note_step(logical, tensors["step"])


def _uses_sharded_format(trackable):
    # Not for tf.saved_model.save (its graph, then its variables/ checkpoint): a SavedModel keeps
    # the whole-table entry, whose traced restore function a loaded model runs without ttf's Python.
    return (isinstance(trackable, LogicalTable) and not save_context.in_save_context()
            and not trackable.saved_model_save)


registration.register_checkpoint_saver(package="ttf", name="LogicalTable", predicate=_uses_sharded_format,
                                       save_fn=_save, restore_fn=_restore)
