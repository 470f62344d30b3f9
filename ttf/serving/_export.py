"""export_for_serving: freeze ttf tables into stock TF ops and write a SavedModel."""
import os

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from ttf._keras import tables_in


class FrozenTable(tf.Module):
    """A read-only copy of a DynamicEmbedding's logical table in stock TF ops.

    ids: int64 [N + 1], the held ids sorted, then int64 max as a sentinel; rows: float32
    [N + 1, dim], the last row being the layer's
    default row. lookup(keys) finds each key by binary search (tf.searchsorted, log2(N)
    probes) and reads its row, or the default row for an id the table never held,
    exactly as the live layer's inference lookup does (no growth, no failure).
    """

    def __init__(self, layer, name=None):
        super().__init__(name=name or f"{layer.name}_frozen")
        table = layer.export_table()
        order = tf.argsort(table["keys"])
        default_row = tf.fill([1, layer.dim], tf.constant(layer.tables[0].default_value, tf.float32))
        # Variables, not constants: the rows go to the SavedModel's checkpoint, so a table
        # far larger than a GraphDef (2 GB) still exports.
        # ids ends with a sentinel (int64 max) so every search position can be read, even for an empty table.
        sentinel = tf.constant([tf.int64.max], tf.int64)
        self.ids = tf.Variable(tf.concat([tf.gather(table["keys"], order), sentinel], 0), trainable=False, name="ids")
        self.rows = tf.Variable(tf.concat([tf.gather(table["values"][:, : layer.dim], order), default_row], 0),
                                trainable=False, name="rows")

    def lookup(self, keys):
        """keys int64 [K] -> rows float32 [K, dim]."""
        ids = self.ids.read_value()
        count = tf.size(ids, out_type=tf.int64) - 1  # N held ids, then the sentinel
        position = tf.minimum(tf.searchsorted(ids, keys, out_type=tf.int64), count)  # first held id >= key
        found = (position < count) & tf.equal(tf.gather(ids, position), keys)
        return tf.gather(self.rows, tf.where(found, position, count))  # row N: the default row


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


def export_for_serving(model, path, input_signature=None, output_name="probability"):
    """Writes `model` to `path` as a SavedModel for inference that needs only stock TensorFlow.

    Each ttf embedding layer of the model (DynamicEmbedding, FusedEmbedding, any
    sharding) is frozen into a FrozenTable: the ids it holds now and their rows (not the
    optimizer slots); ids it never held read its default row. The `serving_default`
    signature takes the model's inputs by name (a dict input by its keys, e.g. `ids` int64
    [B, 26] and `dense` float32 [B, 13] for models/ctr.py; a functional model by its Input
    names) and returns {output_name: model(inputs, training=False)} (or the model's own
    dict of outputs). Predictions equal the live model's at inference. The written graph is
    checked: a ttf op left in it raises.

    Args:
      model: a built tf.keras model (called at least once) whose ttf layers are its submodules.
      path: the SavedModel directory to write.
      input_signature: optional {name: tf.TensorSpec} when the model's inputs are a dict and
        it was never called.
      output_name: the signature's output key for a single-tensor output.

    Raises:
      ValueError: the model's inputs are unknown, or a non-stock op would be exported.

    Example:
      >>> import ttf, tensorflow as tf, tempfile, os
      >>> ids = tf.keras.Input([2], dtype=tf.int64, name="ids")
      >>> out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids)))
      >>> model = tf.keras.Model(ids, out)
      >>> _ = model(tf.constant([[1, 2]], tf.int64))
      >>> ttf.export_for_serving(model, os.path.join(tempfile.mkdtemp(), "serving"))
    """
    layers = tables_in(model)
    frozen = [FrozenTable(layer) for layer in layers]
    structure, specs = _input_specs(model, input_signature)

    @tf.function(input_signature=specs, autograph=False)
    def serve(*tensors):
        outputs = model(tf.nest.pack_sequence_as(structure, list(tensors)), training=False)
        return outputs if isinstance(outputs, dict) else {output_name: outputs}

    for layer, table in zip(layers, frozen):
        layer._serving_table = table  # the layers' inference lookups read the frozen tables while tracing
    try:
        signature = serve.get_concrete_function()
    finally:
        for layer in layers:
            layer._serving_table = None
    module = tf.Module()
    module.frozen_tables = frozen
    module.model_variables = list(model.variables)  # dense weights; the ttf tables are not tracked
    tf.saved_model.save(module, path, signatures={"serving_default": signature})
    foreign = _ttf_ops_in(path)
    if foreign:
        raise ValueError(f"export_for_serving: the serving graph still uses ttf ops {sorted(foreign)}; a layer "
                         "reads a ttf table outside a DynamicEmbedding's inference lookup")


def _ttf_ops_in(path):
    """The Ttf* op types anywhere in the SavedModel at `path` (graph and function library)."""
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    found = set()
    for meta_graph in saved.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes += list(function.node_def)
        found |= {node.op for node in nodes if node.op.startswith("Ttf")}
    return found
