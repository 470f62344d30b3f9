"""export_for_serving: freeze ttf tables into stock TF ops and write a SavedModel in TF
Serving's layout (`base/<version>/`), atomically, in the steps of `ServingVersion`.

Each table is frozen into a HashedTable (ttf/serving/_frozen.py): built shard by shard, each
from that shard's export alone, on the device holding it, so no process ever holds the whole
table and TF's saver writes each shard's rows where they are.
"""
import json
import os

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from ttf._durable import move_into_place, remove_tree, write_text
from ttf.embedding import tables_in
from ttf.serving._frozen import HashedTable, check_row_dtype


def _input_specs(model, input_signature):
    """-> (structure of the model's input, list of named TensorSpecs in flat order)."""
    if input_signature is None and not hasattr(model, "save_spec"):  # Keras 3: a functional model's inputs
        if not getattr(model, "inputs", None):
            raise ValueError("export_for_serving: this Keras 3 model has no declared inputs (a subclassed model); "
                             "pass input_signature={name: tf.TensorSpec(...)}")
        structure = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.name), model.input)
    elif input_signature is None:
        saved = model.save_spec(dynamic_batch=True)
        if saved is None:
            raise ValueError("export_for_serving: the model was never called, so its inputs are unknown; call it "
                             "once on a batch, or pass input_signature={name: tf.TensorSpec(...)}")
        structure = saved[0][0] if len(saved[0]) == 1 else list(saved[0])
    else:
        structure = dict(input_signature)
    flat = tf.nest.flatten(structure)
    if isinstance(structure, dict):
        names = sorted(structure)  # tf.nest flattens dicts in sorted key order
    else:
        names = list(getattr(model, "input_names", None) or [])
        if len(names) != len(flat):
            names = [spec.name or f"input_{i}" for i, spec in enumerate(flat)]
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name) for spec, name in zip(flat, names)]
    return structure, specs


def versions(base):
    """The TF Serving versions under `base` (its all-digit folder names, any tf.io.gfile path),
    ascending; on gs://, s3://, ... one may still be being copied (whole_version tells)."""
    if not tf.io.gfile.isdir(base):
        return []
    names = [name.rstrip("/") for name in tf.io.gfile.listdir(base)]
    return sorted(int(name) for name in names if name.isdigit() and tf.io.gfile.isdir(os.path.join(base, name)))


def whole_version(path):
    """True once the version folder `path` is whole: its SERVING_INFO, written last, is there."""
    return tf.io.gfile.exists(os.path.join(path, SERVING_INFO))


_SHAPE_ONLY = {"Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "IdentityN"}


def _output_kind(output):
    """"probability" when a (traced) output comes from a sigmoid or softmax, looking through
    ops that only reshape or cast it; else "logits"."""
    op = getattr(output, "op", None)
    while op is not None and op.type in _SHAPE_ONLY and op.inputs:
        op = op.inputs[0].op
    return "probability" if op is not None and op.type in ("Sigmoid", "Softmax") else "logits"


SERVING_INFO = "assets.extra/ttf_serving.json"  # what DeltaFollower needs to know of a version


def export_for_serving(model, base, version=None, input_signature=None, output_name=None,
                       row_dtype=tf.float32, publish_record=False):
    """Writes `model` for inference that needs only stock TensorFlow, as version `version`
    of TF Serving's layout: the SavedModel is `base/<version>/`.

    Each ttf embedding layer of the model (DynamicEmbedding, FusedEmbedding, any
    sharding) is frozen into a HashedTable: its rows only (no optimizer slots), float32,
    float16 or int8 (`row_dtype`; int8 rows carry a float32 scale and bias each, dequantized
    in the export's graph by a gather, a cast and a multiply-add), each shard built from its
    own export on its own device; ids never held read the layer's default row. The `serving_default` signature takes the model's
    inputs by name (a dict input by its keys, e.g. `ids` int64 [B, 26] and `dense` float32
    [B, 13] for models/ctr.py; a functional model by its Input names) and returns
    {output_name: model(inputs, training=False)} (or the model's own dict of outputs); by
    default output_name is "probability" when the model ends in a sigmoid or softmax, else
    "logits" (keras-rs and TFRS models return logits or scores).

    Two more signatures let a server follow published deltas without reloading (see
    docs/serving.md, ttf.serving.Publisher and DeltaFollower): `apply_delta` (sequence,
    base_version, then keys_<i>, rows_<i>, deleted_<i> for the i-th table in the order of
    `assets.extra/ttf_serving.json`, and scale_bias_<i> for an int8 table) and `apply_dense`
    (dense_<j>: the model's variables); `lookup` (keys_<i> -> rows_<i>) reads the rows served.

    Atomic: the version is written into `base/.tmp-<version>-<pid>`, its graph checked (a ttf
    op left in it raises), fsynced and renamed to `base/<version>`, so a server polling `base`
    never sees a half-written version. On gs://, s3://, hdfs://, ram:// (no atomic folder
    rename) it is copied there with saved_model.pb, then SERVING_INFO (the marker) last.

    Args:
      model: a built tf.keras model (called at least once) whose ttf layers are its submodules.
      base: the model's base folder (created if missing).
      version: a positive int; default one more than the largest version in `base` (1 if none).
      input_signature: optional {name: tf.TensorSpec} when the model's inputs are a dict and
        it was never called.
      output_name: the signature's output key for a single-tensor output; None: "probability"
        or "logits", as the model's last op is a sigmoid/softmax or not.
      row_dtype: tf.float32 (default; predictions equal the live model's), tf.float16 (half
        the rows' bytes) or tf.int8 (row-wise affine int8: about (dim + 8) / (4 dim) of them).
      publish_record: reset each table shard's "publish" record of deleted keys in the
        export's snapshot (for ttf.serving.Publisher, whose deltas start there).

    Its steps are `ServingVersion`'s (ranks of a synchronous job add their rows' arrays to
    the version between them: ttf.distribute).

    Returns:
      the version's folder, `base/<version>`.

    Raises:
      ValueError: the model's inputs are unknown, the version exists or is not positive, the
        row_dtype is not one of the three, or a non-stock op would be exported.

    Example:
      >>> import ttf, tensorflow as tf, tempfile, os
      >>> ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
      >>> out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids)))
      >>> model = tf.keras.Model(ids, out)
      >>> _ = model(tf.constant([[1, 2]], tf.int64))
      >>> os.path.basename(ttf.export_for_serving(model, os.path.join(tempfile.mkdtemp(), "ctr")))
      '1'
    """
    writer = ServingVersion(model, base, version, row_dtype)
    frozen = [HashedTable(layer, dtype=writer.row_dtype, publish_record=publish_record) for layer in writer.layers]
    with writer:
        writer.save(frozen, input_signature, output_name)
        return writer.finish()


class ServingVersion:
    """The steps of export_for_serving, for a caller that adds to a version before it is
    moved into place (the ranks of a synchronous job add the arrays of their rows):

        writer = ServingVersion(model, base, version, row_dtype)  # checks the version and the layers
        with writer:                        # the temporary folder is removed however it ends
            writer.save(frozen_tables)      # the SavedModel, in writer.temporary
            ...                             # (more files into writer.temporary)
            path = writer.finish()          # graph checked, moved into place atomically
    """

    def __init__(self, model, base, version=None, row_dtype=tf.float32):
        self.model, self.base = model, os.fspath(base)
        self.row_dtype = check_row_dtype(row_dtype, "export_for_serving")
        if version is None:
            version = (versions(self.base) or [0])[-1] + 1
        if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
            raise ValueError(f"export_for_serving: version must be a positive int (TF Serving's folder name), got "
                             f"{version!r}")
        self.version, self.final = version, os.path.join(self.base, str(version))
        if tf.io.gfile.exists(self.final):
            raise ValueError(f"export_for_serving: {self.final} exists; TF Serving never reloads a version in place: "
                             "pass another version (the default takes the next free one)")
        self.layers = tables_in(model)
        if len({layer.name for layer in self.layers}) != len(self.layers):
            raise ValueError(f"export_for_serving: the model's ttf layers need distinct names (deltas name their "
                             f"tables), got {[layer.name for layer in self.layers]}")
        self.temporary = os.path.join(self.base, f".tmp-{version}-{os.getpid()}")
        self._info = None

    def __enter__(self):
        tf.io.gfile.makedirs(self.base)
        remove_tree(self.temporary)
        return self

    def __exit__(self, *exc):
        remove_tree(self.temporary)

    def save(self, frozen, input_signature=None, output_name=None):
        """Writes the SavedModel of the model with its layers' `frozen` tables (HashedTables,
        in the order of `layers`) into `temporary`."""
        model, layers = self.model, self.layers
        structure, specs = _input_specs(model, input_signature)

        @tf.function(input_signature=specs, autograph=False)
        def serve(*tensors):
            outputs = model(tf.nest.pack_sequence_as(structure, list(tensors)), training=False)
            return outputs if isinstance(outputs, dict) else {output_name or _output_kind(outputs): outputs}

        for layer, table in zip(layers, frozen):
            # The layers' inference lookups read the frozen tables while tracing. Set past Keras'
            # attribute tracking: a tracked table's variables would join model.variables (the dense
            # weights a Publisher sends and apply_dense assigns).
            object.__setattr__(layer, "_serving_table", table)
        try:
            signature = serve.get_concrete_function()
        finally:
            for layer in layers:
                object.__setattr__(layer, "_serving_table", None)
        module = tf.Module()
        module.frozen_tables = frozen
        module.model_variables = list(model.variables)  # dense weights; the ttf tables are not tracked
        module.base_version = tf.Variable(self.version, dtype=tf.int64, trainable=False, name="base_version")
        module.sequence = tf.Variable(0, dtype=tf.int64, trainable=False, name="sequence")  # the last delta applied
        signatures = {"serving_default": signature, "apply_delta": _apply_delta_signature(module),
                      "apply_dense": _apply_dense_signature(module), "lookup": _lookup_signature(module)}
        self._info = {"version": self.version,
                      "tables": [{"name": layer.name, "dim": layer.dim, "row_dtype": table.row_dtype.name}
                                 for layer, table in zip(layers, frozen)],
                      "dense": [{"name": v.name, "shape": list(v.shape), "dtype": tf.as_dtype(v.dtype).name}
                                for v in module.model_variables],
                      "exported_steps": {layer.name: table.exported_steps.tolist()
                                         for layer, table in zip(layers, frozen)}}
        tf.saved_model.save(module, self.temporary, signatures=signatures)

    def finish(self):
        """Writes SERVING_INFO, checks the graph holds no ttf op and moves the version into
        place (the marker last); returns its folder."""
        tf.io.gfile.makedirs(os.path.join(self.temporary, os.path.dirname(SERVING_INFO)))
        write_text(os.path.join(self.temporary, SERVING_INFO), json.dumps(self._info))
        foreign = _ttf_ops_in(self.temporary)
        if foreign:
            raise ValueError(f"export_for_serving: the serving graph still uses ttf ops {sorted(foreign)}; a layer "
                             "reads a ttf table outside a DynamicEmbedding's inference lookup")
        move_into_place(self.temporary, self.final, last=["saved_model.pb", SERVING_INFO])  # the marker last
        return self.final


def _apply_delta_signature(module):
    """apply_delta(sequence, base_version, keys_<i>, rows_<i>, deleted_<i>[, scale_bias_<i>]):
    applies one delta
    to every table's overlay, refusing (InvalidArgument) another base version or a sequence
    other than the next; the sequence variable is updated last."""
    specs = [tf.TensorSpec([], tf.int64, name="sequence"), tf.TensorSpec([], tf.int64, name="base_version")]
    for i, table in enumerate(module.frozen_tables):
        quantized = table.row_dtype == tf.int8  # int8 rows travel as they are stored, with their scale and bias
        specs += [tf.TensorSpec([None], tf.int64, name=f"keys_{i}"),
                  tf.TensorSpec([None, table.dim], tf.int8 if quantized else tf.float32, name=f"rows_{i}"),
                  tf.TensorSpec([None], tf.int64, name=f"deleted_{i}")]
        if quantized:
            specs.append(tf.TensorSpec([None, 2], tf.float32, name=f"scale_bias_{i}"))

    @tf.function(input_signature=specs, autograph=False)
    def apply_delta(sequence, base_version, *tensors):
        checked = [
            tf.debugging.Assert(tf.equal(base_version, module.base_version),
                                ["apply_delta: the delta is for base version", base_version, "but this model is version",
                                 module.base_version]),
            tf.debugging.Assert(tf.equal(sequence, module.sequence + 1),
                                ["apply_delta: delta sequence", sequence, "is not the next one after",
                                 module.sequence, "(a gap or a duplicate): load the next base version"]),
        ]
        applied, given = [], list(tensors)
        with tf.control_dependencies(checked):
            for table in module.frozen_tables:
                keys, rows, deleted = given[:3]
                scale_bias = given[3] if table.row_dtype == tf.int8 else None
                del given[:3 if scale_bias is None else 4]
                applied.append(table.apply(keys, rows, deleted, scale_bias))
        with tf.control_dependencies(applied):
            return {"sequence": tf.identity(module.sequence.assign(sequence))}

    return apply_delta.get_concrete_function()


def _lookup_signature(module):
    """lookup(keys_<i>) -> {rows_<i>}: the rows served for each table's keys (base + overlay)."""
    specs = [tf.TensorSpec([None], tf.int64, name=f"keys_{i}") for i in range(len(module.frozen_tables))]

    @tf.function(input_signature=specs, autograph=False)
    def lookup(*keys):
        return {f"rows_{i}": table.lookup(k) for i, (table, k) in enumerate(zip(module.frozen_tables, keys))}

    return lookup.get_concrete_function()


def _apply_dense_signature(module):
    """apply_dense(dense_<j>): assigns the model's dense variables (j in model_variables order)."""
    specs = [tf.TensorSpec(v.shape, v.dtype, name=f"dense_{j}") for j, v in enumerate(module.model_variables)]

    @tf.function(input_signature=specs, autograph=False)
    def apply_dense(*values):
        assigned = [v.assign(value) for v, value in zip(module.model_variables, values)]
        with tf.control_dependencies(assigned):
            return {"assigned": tf.constant(len(assigned), tf.int64)}

    return apply_dense.get_concrete_function()


def _ttf_ops_in(path):
    """The Ttf* op types anywhere in the SavedModel at `path` (graph and function library)."""
    saved = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    found = set()
    for meta_graph in saved.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes += list(function.node_def)
        found |= {node.op for node in nodes if node.op.startswith("Ttf")}
    return found
