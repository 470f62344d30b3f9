"""ttf.accelerate: a user's Keras model with its Embedding layers turned into ttf tables."""
import collections
import contextlib
import dataclasses
import inspect
import sys
import types
import warnings
import weakref

import numpy as np
import tensorflow as tf

from ttf._keras import KERAS3
if KERAS3:
    from ttf._keras3 import FunctionalGraph as _graph
else:
    from ttf._keras import FunctionalGraph as _graph
from ttf._ops import ops
from ttf.data._schema import FIELD_SHIFT
from ttf.embedding import DynamicEmbedding, RowInitializer, tables_in
from ttf.embedding._table import check_rows
import ttf.optimizers as ttf_optimizers
from ttf.optimizers import from_keras, not_reaching_rows

_VALUE_MASK = (1 << FIELD_SHIFT) - 1  # the id part of a key: the tag sits above it, as the parser's field
_MAX_TAGS = 256
_LOOKUPS = (tf.keras.layers.StringLookup, tf.keras.layers.IntegerLookup, tf.keras.layers.Hashing)


def _keys(ids, key_kind):
    """Raw ids -> int64 keys: int ids as they are, strings as a 64-bit hash (below 2**56)."""
    if key_kind == "string":
        return tf.strings.to_hash_bucket_fast(ids, 1 << FIELD_SHIFT)
    return tf.cast(ids, tf.int64)


def _id_list(ids, n, layer_name):
    if not isinstance(ids, (list, tuple)):  # a model loaded from a file passes one tensor alone
        ids = [ids]
    if len(ids) != n:
        raise ValueError(f"{layer_name}: expected {n} id tensors, got {len(ids)}")
    return ids


def _below_tag(keys):
    """int64 keys -> keys in [0, 2**56), below the tag. Keys already there stay as they are;
    wider ones (negative, or 2**56 and up) are hashed (Fingerprint64) into that range, never
    cut: cutting the top bits would give id 2**56 + 5 the row of id 5, always. A hashed id
    collides with another id with the odds of a string id's 64-bit hash (about n**2 / 2**57)."""
    keys = tf.convert_to_tensor(keys, tf.int64)
    wide = tf.logical_or(keys < 0, keys > _VALUE_MASK)
    fingerprints = tf.fingerprint(tf.reshape(keys, [-1, 1]))  # [N, 8] uint8
    hashed = tf.reshape(tf.bitcast(fingerprints, tf.int64), tf.shape(keys))
    return tf.where(wide, tf.bitwise.bitwise_and(hashed, _VALUE_MASK), keys)


def _tagged(keys, tags, below_tag=False):
    """Puts each column's tag in the top 8 bits: columns of different embeddings never share a row.
    below_tag: the keys are already in [0, 2**56) (a string's hash), so no per-key range check."""
    tags = tf.constant([t << FIELD_SHIFT for t in tags], tf.int64)
    return tf.bitwise.bitwise_or(keys if below_tag else _below_tag(keys), tags)


@tf.keras.utils.register_keras_serializable(package="ttf")
class FusedLookup(DynamicEmbedding):
    """N id tensors (columns) of any dense shape, looked up in one table with one op call.

    Column j's ids become keys (int: as they are, string: a 64-bit hash) tagged with
    tags[j] in the top 8 bits, so columns with equal tags share rows (one Keras Embedding
    called on several inputs) and others never collide; a column whose tag is None keys its
    ids untagged (the single column of a table saved as a TableLookup). Returns one embedding
    per column, shaped as a Keras Embedding would return it (ids [B] -> [B, dim], [B, L] ->
    [B, L, dim]), with the Keras mask (ids != mask_values[j]) where mask_values[j] is set (the
    Embedding had mask_zero). Called with one tensor (a single column), returns one tensor.
    Made by ttf.accelerate.
    """

    def __init__(self, dim, tags, key_kinds, mask_values=None, **kwargs):
        super().__init__(dim, **kwargs)
        mask_values = [None] * len(tags) if mask_values is None else list(mask_values)
        if len(tags) != len(key_kinds) or len(tags) != len(mask_values) or not all(
                t is None or 0 <= t < _MAX_TAGS for t in tags):
            raise ValueError(f"tags must be N ints in [0, {_MAX_TAGS}) or None, with N key_kinds and N mask_values; "
                             f"got {tags}, {key_kinds}, {mask_values}")
        self.tags, self.key_kinds, self.mask_values = list(tags), list(key_kinds), mask_values

    def _columns(self, ids):
        return _id_list(ids, len(self.tags), self.name)

    def keys_of(self, ids):
        """-> (flat keys [sum of the columns' sizes] int64, None), column after column."""
        flat = []
        for x, kind, tag in zip(self._columns(ids), self.key_kinds, self.tags):
            keys = tf.reshape(_keys(x, kind), [-1])
            flat.append(keys if tag is None else _tagged(keys, [tag], below_tag=kind == "string"))
        return tf.concat(flat, axis=0), None

    def call(self, ids, training=None):
        columns = self._columns(ids)
        rows = self._lookup(self.keys_of(columns)[0], None, self.trains(training))
        # One split (its gradient is one concat), not N slices (N zero-padded gradients summed).
        parts = tf.split(rows, [tf.size(x) for x in columns], axis=0) if len(columns) > 1 else [rows]
        out = [tf.reshape(part, tf.concat([tf.shape(x), [self.dim]], 0)) for part, x in zip(parts, columns)]
        for o, x in zip(out, columns):
            o.set_shape(x.shape.concatenate([self.dim]))
        return out if isinstance(ids, (list, tuple)) else out[0]

    def compute_mask(self, inputs, mask=None):
        columns = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        masks = [None if value is None else _not_equal(x, value) for x, value in zip(columns, self.mask_values)]
        return masks if isinstance(inputs, (list, tuple)) else masks[0]

    def get_config(self):
        config = super().get_config()
        config.update(tags=self.tags, key_kinds=self.key_kinds, mask_values=self.mask_values)
        return config


def _not_equal(ids, value):
    if KERAS3:  # Keras 3 asks for the mask of symbolic inputs too, which only keras.ops take
        import keras  # pylint: disable=import-outside-toplevel
        return keras.ops.not_equal(ids, value)
    return tf.not_equal(ids, value)


@tf.keras.utils.register_keras_serializable(package="ttf")
class TableLookup(FusedLookup):
    """A FusedLookup of one untagged column, under the name accelerate gave a single lookup
    before FusedLookup took ids of any shape: models saved with it load unchanged."""

    def __init__(self, dim, key_kind="int", mask_value=None, **kwargs):
        kwargs.pop("tags", None)  # a config its get_config wrote: FusedLookup's fields, one column
        key_kind = list(kwargs.pop("key_kinds", [key_kind]))[0]
        mask_value = list(kwargs.pop("mask_values", [mask_value]))[0]
        super().__init__(dim, [None], [key_kind], [mask_value], **kwargs)


@dataclasses.dataclass
class _Source:
    """Where an Embedding call's ids come from once its lookup layer is gone."""
    tensor: object  # a KerasTensor of the original model
    key_kind: str  # "int" or "string"
    vocabulary: object = None  # the lookup layer whose vocabulary maps raw ids to rows, if any
    skipped: object = None  # the lookup node replaced by the key transform


def accelerate(model, keep=(), sample=None, table_rows="fp32"):
    """Returns `model` with every tf.keras Embedding turned into a ttf table (tf_keras or Keras 3).

    The new model has the same inputs and outputs and computes the same function:
    - each Embedding becomes a ttf table keyed by its ids, and a Hashing, IntegerLookup or
      StringLookup feeding only Embeddings is dropped: the table keys the raw id (ints) or
      a 64-bit hash of it (strings), so there is no vocabulary and no collision;
    - the existing rows carry over (id i keeps row i; a vocabulary token keeps its row),
      so predictions before training match the model's (out-of-vocabulary and Hashing
      inputs excepted: they read the table's default row of zeros until trained);
    - Embeddings of equal dim, initializer and trainability share one table and one lookup
      op (a FusedLookup), whatever their ids' shapes ([B], [B, 1], sequences [B, L] with
      their mask_zero), when the ids are computed before any Embedding's output is read
      (model inputs, or a Hashing inside the model); an Embedding used on several inputs
      stays shared; an Embedding over ids computed from another's output, or over ragged
      ids, gets a lookup of its own;
    - every other layer is cloned with its weights (from get_config), so training the new
      model leaves `model` as it was;
    - if `model` is compiled, the new one is compiled with the same loss, metrics and
      loss weights and the optimizer converted by ttf.optimizers.from_keras.
    A subclassed model (a keras.Model or tfrs.Model subclass, already called on a batch) is
    rebuilt as `type(model).from_config(model.get_config())`, called once on `sample` (or
    on zeros of the input spec tf_keras recorded), given the model's weights (on Keras 3,
    which keeps no constructor arguments of a Model subclass, its objects are copied with
    new variables instead), and then each
    Embedding it holds (an attribute, in a list or dict, in a nested layer) becomes a ttf
    table, and each nested functional or Sequential block holding Embeddings (TFRS'
    `Sequential([StringLookup, Embedding])`) is converted as above; `model` is not changed.
    The new model's class is a subclass of type(model), of the same name, whose get_config
    records the tables and where they sit, so that a .keras file of it loads back
    (keras.models.load_model with the class in custom_objects, after `import ttf`).

    What changes behaviour is warned about by layer name (a dropped lookup: out-of-vocabulary
    inputs read a zero row until trained; a dropped embedding regularizer or constraint,
    Hashing rows that cannot carry over, an initializer ttf lacks, optimizer settings that
    act on dense variables only, jit_compile=True dropped); what cannot work raises
    ValueError naming the layer (a layer reading an Embedding's `.embeddings` matrix: keep
    that Embedding with `keep`; a model that already holds ttf tables, whose copies would
    start empty).

    Args:
      model: a built tf.keras functional, Sequential or subclassed model.
      keep: names of Embedding layers to leave as Keras Embeddings, and of Hashing /
        StringLookup / IntegerLookup layers to keep (their bucketing or vocabulary stays and
        the table keys their output).
      sample: a subclassed model only: one batch of inputs, as model(sample) takes them, to
        build the new model with (default: zeros of the input spec tf_keras recorded at the
        model's first call; Keras 3 records none, so it needs `sample`).
      table_rows: how the tables store rows: "fp32", "bf16" or "int8" (the `rows` of
        ttf.embedding.EmbeddingTable; docs/table_rows.md).

    Returns: the new tf.keras.Model.

    Example:
      >>> import ttf, tensorflow as tf
      >>> ids = tf.keras.Input([1], dtype=tf.int32)
      >>> out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(100, 4)(ids)))
      >>> fast = ttf.accelerate(tf.keras.Model(ids, out))
      >>> [type(layer).__name__ for layer in fast.layers][:2]
      ['InputLayer', 'FusedLookup']
    """
    held = [layer.name for layer in tables_in(model)]
    if held:  # a copy of a table would start empty: its rows live in the table, not in weights
        raise ValueError(f"ttf.accelerate: {model.name} already holds ttf tables ({', '.join(held)}); accelerate the "
                         "model that has Keras Embeddings, or use this one as it is")
    check_rows(table_rows)
    graph = _graph.functional(model)
    if graph is None:
        return _Subclassed(model, set(keep), sample, table_rows).run()
    return _Converter(model, graph, set(keep), table_rows=table_rows).run()


class _Converter:
    def __init__(self, model, graph, keep, compile_model=True, name_prefix="", table_rows="fp32"):
        self.model, self.graph, self.keep = model, graph, keep  # graph: the Functional behind model
        self.table_rows = table_rows
        self.compile_model = compile_model
        self.name_prefix = name_prefix  # a nested block's tables need names of their own (export names tables)
        by_depth = _graph.nodes_by_depth(graph)
        self.nodes = [n for depth in sorted(by_depth, reverse=True) for n in by_depth[depth]]
        self.consumers = collections.defaultdict(list)
        for node in self.nodes:
            for kt in _graph.inputs(node):
                self.consumers[id(kt)].append(node)
        self.model_outputs = {id(t) for t in graph.outputs}
        self.model_inputs = {id(t) for t in graph.inputs}
        self.warnings = collections.defaultdict(list)
        self.clones = {}  # original layer -> its clone in the new model
        self.carried = {}  # new table layer -> (keys, rows) to import

    # -- analysis

    def embeddings(self):
        found = [_graph.layer(n) for n in self.nodes if isinstance(_graph.layer(n), tf.keras.layers.Embedding)]
        layers = list(dict.fromkeys(found))
        for layer in layers:
            if layer.name in self.keep:
                continue
            for other in self.model._flatten_layers(include_self=False):
                if other is not layer and any(w is layer.embeddings for w in other.weights):
                    raise ValueError(
                        f"ttf.accelerate: layer {other.name} reads Embedding {layer.name}'s matrix (.embeddings), "
                        "which a ttf table does not have; pass keep=[...] with that Embedding's name")
        for layer in self.model._flatten_layers(include_self=False):
            if isinstance(layer, tf.keras.Model) and any(
                    isinstance(inner, tf.keras.layers.Embedding) for inner in layer._flatten_layers()):
                self.warnings["nested model whose Embedding layers stay Keras Embeddings"].append(layer.name)
        return [layer for layer in layers if layer.name not in self.keep]

    def source(self, node):
        """The ids' source of an Embedding call, looking through a lookup that feeds only Embeddings."""
        ids = _graph.inputs(node)[0]
        producer, node_index = _graph.producer(ids)
        kind = "string" if _is_string(ids) else "int"
        if _is_lookup(producer) and self._lookup_feeds_only_tables(ids):
            lookup_node = producer._inbound_nodes[node_index]
            raw = _graph.inputs(lookup_node)[0]
            if not _has_vocabulary(producer):
                self.warnings["Hashing dropped: rows are not carried over (many inputs shared a bucket), so "
                              "predictions differ until trained; the table keys each raw value, without collisions "
                              "(keep=[its name] keeps the bucketing and the rows)"].append(producer.name)
                vocabulary = None
            else:
                vocabulary = producer
                self.warnings["lookup dropped: out-of-vocabulary inputs, which read the lookup's OOV row in the "
                              "original model, now read the table's default row (zeros) until trained, so their "
                              "predictions differ; in-vocabulary inputs keep their rows"].append(producer.name)
            return _Source(raw, "string" if _is_string(raw) else "int", vocabulary, lookup_node)
        return _Source(ids, kind)

    def _lookup_feeds_only_tables(self, ids):
        layer = _graph.producer(ids)[0]
        if layer.name in self.keep:  # the user keeps its vocabulary or bucketing
            return False
        if getattr(layer, "output_mode", "int") != "int" or getattr(layer, "invert", False):
            return False
        if len(layer._inbound_nodes) != 1 or id(ids) in self.model_outputs:
            return False
        return all(isinstance(_graph.layer(c), tf.keras.layers.Embedding) and _graph.layer(c).name not in self.keep
                   for c in self.consumers[id(ids)])

    def downstream(self, embedding_nodes):
        """ids of the nodes that read an Embedding call's output, directly or not (the calls included)."""
        reached, todo = set(), list(embedding_nodes)
        while todo:
            node = todo.pop()
            if id(node) in reached:
                continue
            reached.add(id(node))
            for kt in _graph.outputs(node):
                todo += self.consumers[id(kt)]
        return reached

    # -- conversion

    def run(self):
        embeddings = self.embeddings()
        calls = {layer: [n for n in layer._inbound_nodes if n in self._node_set()] for layer in embeddings}
        sources = {id(n): self.source(n) for layer in embeddings for n in calls[layer]}
        for layer in embeddings:
            self._check_embedding(layer)
        skipped = {id(s.skipped) for s in sources.values() if s.skipped is not None}
        late = self.downstream([n for layer in embeddings for n in calls[layer]])

        new_inputs = [_graph.new_input(t) for t in self.graph.inputs]
        tensors = {id(old): new for old, new in zip(self.graph.inputs, new_inputs)}

        # Fused groups: equal dim, initializer and trainability, ids computed before any
        # Embedding's output is read (model inputs, or a Hashing inside the model) so one op
        # call can take them all; at most 256 embeddings each. Others get a lookup each.
        groups = collections.defaultdict(list)
        alone = []
        for layer in embeddings:
            srcs = [sources[id(n)] for n in calls[layer]]
            if all(_graph.is_dense(src.tensor) and id(self._producer_node(src.tensor)) not in late for src in srcs):
                groups[(layer.output_dim, self._initializer(layer), layer.trainable)].append(layer)
            else:
                alone.append(layer)
        tables = {layer: self._single_lookup(layer, sources[id(calls[layer][0])]) for layer in alone}

        # Nodes no Embedding output reaches first (the fused lookups' ids among them), then the
        # fused lookups, then the rest: a topological order in which each fused call sees all its ids.
        outputs_of = {}  # id(Embedding node) -> new tensor
        for node in self.nodes:
            if id(node) not in late:
                self._rebuild(node, skipped, outputs_of, tables, sources, tensors)
        for (dim, initializer, trainable), layers in groups.items():
            for start in range(0, len(layers), _MAX_TAGS):
                self._fuse(layers[start:start + _MAX_TAGS], dim, initializer, trainable, calls, sources, tensors,
                           outputs_of)
        for node in self.nodes:
            if id(node) in late:
                self._rebuild(node, skipped, outputs_of, tables, sources, tensors)
        for layer in list(self.clones):
            if hasattr(layer, "get_weights"):  # Keras 3 graphs hold weightless keras.ops Operations too
                self.clones[layer].set_weights(layer.get_weights())

        nested_inputs, nested_outputs = _graph.structures(self.graph)
        fast = tf.keras.Model(tf.nest.pack_sequence_as(nested_inputs, new_inputs),
                              tf.nest.pack_sequence_as(nested_outputs, [tensors[id(t)] for t in self.graph.outputs]),
                              name=f"{self.model.name}_ttf")
        for layer, (keys, rows) in self.carried.items():
            _import_rows(layer, keys, rows)
        self._report()
        config = _graph.compile_config(self.model)
        if config is not None and self.compile_model:
            _compile_like(fast, self.model, config)
        return fast

    def _rebuild(self, node, skipped, outputs_of, tables, sources, tensors):
        """Maps one node of the original graph into the new model (tensors: id(old) -> new)."""
        if node.is_input or id(node) in skipped:
            return
        if id(node) in outputs_of:
            new_out = outputs_of[id(node)]
        elif _graph.layer(node) in tables:
            new_out = tables[_graph.layer(node)](tensors[id(sources[id(node)].tensor)])
        else:
            new_out = _graph.call(node, self._clone(_graph.layer(node)), tensors)
        for kt, new in zip(_graph.outputs(node), tf.nest.flatten(new_out)):
            tensors[id(kt)] = new

    def _producer_node(self, tensor):
        layer, node_index = _graph.producer(tensor)
        return layer._inbound_nodes[node_index]  # pylint: disable=protected-access

    def _node_set(self):
        if not hasattr(self, "_nodes"):
            self._nodes = set(self.nodes)
        return self._nodes

    def _clone(self, layer):
        if layer not in self.clones:
            try:
                self.clones[layer] = layer.__class__.from_config(layer.get_config())
            except Exception as err:  # noqa: BLE001  (any user layer may fail; reported, not hidden)
                self.warnings[f"cloning failed ({type(err).__name__}), so the new model shares these layers "
                              "(and their weights) with the original"].append(layer.name)
                self.clones[layer] = layer
        return self.clones[layer]

    def _initializer(self, layer):
        try:
            return RowInitializer.of(layer.embeddings_initializer)
        except TypeError:
            self.warnings["initializer ttf lacks: new ids start from uniform(-0.05, 0.05)"].append(layer.name)
            return RowInitializer()

    def _check_embedding(self, layer):
        if _active(layer.embeddings_regularizer) or _active(layer.activity_regularizer):
            self.warnings["regularizer dropped (ttf tables add no regularization loss)"].append(layer.name)
        if layer.embeddings_constraint is not None:
            self.warnings["embeddings_constraint dropped"].append(layer.name)

    def _seed(self, layer):
        return int(getattr(layer.embeddings_initializer, "seed", None) or 0)

    def _fuse(self, layers, dim, initializer, trainable, calls, sources, tensors, outputs_of):
        tags = {layer: i for i, layer in enumerate(layers)}
        columns = [(layer, node) for layer in layers for node in calls[layer]]
        fused = FusedLookup(dim, [tags[layer] for layer, _ in columns],
                            [sources[id(node)].key_kind for _, node in columns],
                            [self._mask_value(layer, sources[id(node)]) for layer, node in columns],
                            initializer=initializer, seed=self._seed(layers[0]), trainable=trainable,
                            name=f"{self.name_prefix}ttf_fused_{dim}d_{len(self.carried)}", rows=self.table_rows)
        results = fused([tensors[id(sources[id(node)].tensor)] for _, node in columns])
        for (layer, node), out in zip(columns, results):
            outputs_of[id(node)] = out
        keys, rows = [], []
        for layer in layers:
            source = next(sources[id(n)] for n in calls[layer])
            layer_keys, layer_rows = self._rows(layer, source)
            keys.append(_tagged(tf.constant(layer_keys), [tags[layer]]).numpy())
            rows.append(layer_rows)
        self.carried[fused] = (np.concatenate(keys), np.concatenate(rows))

    def _single_lookup(self, layer, source):
        """A lookup of its own (untagged keys) for an Embedding whose ids are computed from
        another Embedding's output, or are not a dense tensor."""
        table = FusedLookup(layer.output_dim, [None], [source.key_kind], [self._mask_value(layer, source)],
                            initializer=self._initializer(layer), seed=self._seed(layer), trainable=layer.trainable,
                            name=layer.name, rows=self.table_rows)
        self.carried[table] = self._rows(layer, source)
        return table

    def _mask_value(self, layer, source):
        """The raw id the Keras mask of a mask_zero Embedding hides (index 0 once looked up)."""
        if not layer.mask_zero:
            return None
        if source.skipped is None:
            return "" if source.key_kind == "string" else 0
        if source.vocabulary is not None and source.vocabulary.mask_token is not None:
            return source.vocabulary.mask_token
        self.warnings["mask_zero over a dropped lookup without mask_token: the inputs it mapped to index 0 are no "
                      "longer masked"].append(layer.name)
        return None

    def _rows(self, layer, source):
        """(keys [N] int64 before tagging, rows [N, dim]) that carry the Embedding's rows over."""
        matrix = layer.get_weights()[0]
        if source.skipped is not None and source.vocabulary is None:  # Hashing: nothing to carry
            return np.zeros([0], np.int64), np.zeros([0, matrix.shape[1]], np.float32)
        if source.vocabulary is None:
            return np.arange(len(matrix), dtype=np.int64), matrix
        tokens = [t for t in source.vocabulary.get_vocabulary() if t != source.vocabulary.mask_token]
        tokens = [t for t in tokens if t != getattr(source.vocabulary, "oov_token", None)]
        indices = source.vocabulary(tf.constant(tokens)).numpy()
        keys = _keys(tf.constant(tokens), source.key_kind).numpy()
        return keys, matrix[indices]

    def _report(self):
        for what, names in self.warnings.items():
            warnings.warn(f"ttf.accelerate: {what}: {', '.join(dict.fromkeys(names))}", stacklevel=3)


class _Subclassed:
    """ttf.accelerate of a subclassed model: a new instance of its class with its weights, whose
    Embeddings (and nested functional blocks holding Embeddings) are swapped for ttf tables."""

    def __init__(self, model, keep, sample, table_rows="fp32"):
        self.model, self.keep, self.table_rows = model, keep, table_rows
        if not model.weights:
            raise ValueError(f"ttf.accelerate: {model.name} ({type(model).__name__}) has no weights yet; call it once "
                             "on a batch (model(x)) before accelerating it")
        self.sample = _sample_from_spec(model) if sample is None else sample
        self.warnings = collections.defaultdict(list)
        self.nested_warnings = []  # the messages of the nested blocks' conversions
        self.twins = {}  # id(layer of the new instance) -> its ttf twin (a layer held twice gets one)

    def run(self):
        clone = self._new_instance()
        originals = dict(zip(map(id, clone._flatten_layers(include_self=True)),  # pylint: disable=protected-access
                             self.model._flatten_layers(include_self=True)))  # pylint: disable=protected-access
        paths = _layer_paths(clone)
        swaps = []  # where each twin went: its steps from clone (None: no attribute path leads there)
        with _unlocked(clone):
            for parent in list(clone._flatten_layers(include_self=True)):  # pylint: disable=protected-access
                if isinstance(parent, tf.keras.layers.Embedding) or _graph.functional(parent) is not None:
                    continue  # swapped as a whole by its parent
                for name, key, layer in list(_held(parent)):
                    new = self._twin(layer, originals)
                    if new is not None:
                        _put(parent, name, key, layer, new)
                        swaps.append(None if id(parent) not in paths else paths[id(parent)] + [[name, key]])
        if not swaps:
            self.warnings["no Embedding found to convert (the new model equals the original)"].append(clone.name)
        for message in dict.fromkeys(self.nested_warnings):
            warnings.warn(message, stacklevel=3)
        for what, names in self.warnings.items():
            warnings.warn(f"ttf.accelerate: {what}: {', '.join(dict.fromkeys(names))}", stacklevel=3)
        clone(self.sample)  # builds the new tables' anchors
        _record_swaps(clone, swaps, _input_spec(self.sample))
        config = _graph.compile_config(self.model)
        if config is not None:
            _compile_like(clone, self.model, config)
        return clone

    def _new_instance(self):
        cls = type(self.model)
        try:
            clone = cls.from_config(self.model.get_config())
            clone(self.sample)
        except Exception as err:  # noqa: BLE001  (the user's class: say what to fix)
            if KERAS3:  # Keras 3 keeps no constructor arguments of a Model subclass: copy the objects
                return _copy_keras3_model(self.model)
            raise ValueError(
                f"ttf.accelerate: cannot make a new {cls.__name__} to convert (the original stays unchanged): "
                f"{cls.__name__}.from_config({self.model.name}.get_config()) then a call on the sample failed with "
                f"{type(err).__name__}: {_first_line(err)}. Give {cls.__name__} a get_config() that "
                "returns its constructor's arguments (tf_keras does it for arguments of basic types), or pass "
                "sample= (one batch of inputs)") from None
        old, new = self.model.weights, clone.weights
        if [tuple(w.shape) for w in old] != [tuple(w.shape) for w in new]:
            raise ValueError(f"ttf.accelerate: {cls.__name__}.from_config({self.model.name}.get_config()) builds other "
                             f"weights than {self.model.name} has ({len(new)} vs {len(old)}, or other shapes): its "
                             "get_config() must return the constructor's arguments")
        for target, value in zip(new, old):
            target.assign(value)
        return clone

    def _twin(self, layer, originals):
        """The ttf twin of an Embedding or of a functional block holding Embeddings, else None."""
        if not isinstance(layer, tf.keras.layers.Layer) or layer.name in self.keep:
            return None
        if id(layer) not in self.twins:
            self.twins[id(layer)] = self._make_twin(layer, originals)
        return self.twins[id(layer)]

    def _make_twin(self, layer, originals):
        if isinstance(layer, tf.keras.layers.Embedding):
            if _active(layer.embeddings_regularizer) or _active(layer.activity_regularizer):
                self.warnings["regularizer dropped (ttf tables add no regularization loss)"].append(layer.name)
            try:
                initializer = RowInitializer.of(layer.embeddings_initializer)
            except TypeError:
                self.warnings["initializer ttf lacks: new ids start from uniform(-0.05, 0.05)"].append(layer.name)
                initializer = RowInitializer()
            table = FusedLookup(layer.output_dim, [None], ["int"], [0 if layer.mask_zero else None],
                                initializer=initializer, trainable=layer.trainable, name=layer.name,
                                seed=int(getattr(layer.embeddings_initializer, "seed", None) or 0),
                                rows=self.table_rows)
            matrix = layer.get_weights()[0]
            table.build(None)
            _import_rows(table, np.arange(len(matrix), dtype=np.int64), matrix)
            return table
        graph = _graph.functional(layer)
        if graph is not None and any(isinstance(inner, tf.keras.layers.Embedding)
                                     for inner in layer._flatten_layers()):  # pylint: disable=protected-access
            original = originals.get(id(layer), layer)  # its lookups' vocabularies, adapted or not
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                converted = _Converter(original, _graph.functional(original), self.keep, compile_model=False,
                                       name_prefix=f"{layer.name}_", table_rows=self.table_rows).run()
            self.nested_warnings += [str(w.message) for w in caught]
            return converted
        return None


# Attributes of a Keras 3 model that hold functions traced for the original (they would run it).
_TRACED = ("train_function", "test_function", "predict_function", "_jit_compile", "optimizer")


def _copy_keras3_model(model):
    """A copy of a Keras 3 model whose variables are new ones holding the same values: every
    Python object reachable from the model is copied once (Keras 3 layers are plain Python
    objects over tf.Variables), functions and classes shared; the traced train/predict
    functions and the optimizer are not carried (the copy is compiled afresh)."""
    from keras.src.utils.tracking import Tracker  # pylint: disable=import-outside-toplevel
    memo = {}

    def copied(obj):
        if id(obj) in memo:
            return memo[id(obj)]
        if isinstance(obj, (str, bytes, int, float, bool, complex, type(None), type, types.FunctionType,
                            types.BuiltinFunctionType, types.ModuleType, weakref.ref, tf.Tensor, tf.DType,
                            tf.TensorShape, inspect.Signature)) or callable(obj) and not hasattr(obj, "__dict__"):
            return obj
        if isinstance(obj, types.MethodType):
            return types.MethodType(obj.__func__, copied(obj.__self__))
        if isinstance(obj, tf.Variable):
            new = tf.Variable(obj.read_value(), trainable=obj.trainable, name=obj.name.split(":")[0],
                              synchronization=obj.synchronization, aggregation=obj.aggregation)
            memo[id(obj)] = new
            return new
        if type(obj) in (list, tuple, dict, set, frozenset):
            if isinstance(obj, list):
                new = memo[id(obj)] = []
                new.extend(copied(v) for v in obj)
            elif isinstance(obj, dict):
                new = memo[id(obj)] = {}
                new.update((copied(k), copied(v)) for k, v in obj.items())
            else:
                new = memo[id(obj)] = type(obj)(copied(v) for v in obj)
            return new
        if obj is not model and _graph.functional(obj) is not None:  # a functional/Sequential block: Keras' clone
            import keras  # pylint: disable=import-outside-toplevel
            new = memo[id(obj)] = keras.models.clone_model(obj)
            new.set_weights(obj.get_weights())
            return new
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple (a KerasTensor's history, ...)
            new = memo[id(obj)] = type(obj)(*(copied(v) for v in obj))
            return new
        if type(obj).__name__ == "_DictWrapper":  # TensorFlow's tracked dict, a proxy: a new one, same items
            new = memo[id(obj)] = type(obj)()
            for key, value in obj.items():
                new[copied(key)] = copied(value)
            return new
        if type(obj).__name__ == "ListWrapper":  # TensorFlow's tracked list
            new = memo[id(obj)] = type(obj)([])
            for value in obj:
                new.append(copied(value))
            return new
        if type(obj).__module__.startswith("tensorflow."):
            return obj  # traced functions and other TensorFlow runtime objects: shared, never half-copied
        if not hasattr(obj, "__dict__"):
            return obj  # locks, threading.local and other C-level state: shared
        base = next((b for b in (list, dict, set) if isinstance(obj, b)), object)
        new = base.__new__(type(obj))
        memo[id(obj)] = new
        if base is list:  # Keras 3's TrackedList: the items live in the list itself
            list.extend(new, (copied(v) for v in obj))
        elif base is dict:  # TrackedDict
            dict.update(new, ((copied(k), copied(v)) for k, v in obj.items()))
        elif base is set:
            set.update(new, (copied(v) for v in obj))
        for name, value in vars(obj).items():
            object.__setattr__(new, name, None if obj is model and name in _TRACED else copied(value))
        if isinstance(obj, Tracker):  # it remembers its objects by id: the copies' ids
            new.stored_ids = {name: {id(v) for v in store} for name, (_, store) in new.config.items()}
        return new

    return copied(model)


def _untrack(parent, layer):
    """Keras 3 keeps a replaced sublayer in its parent's tracker (its weights would stay the parent's)."""
    tracker = getattr(parent, "_tracker", None)
    if tracker is not None:
        tracker.untrack(layer)


def _first_line(err):
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")[:300]


def _replace_item(items, index, old, new):
    if hasattr(items, "remove") and hasattr(items, "insert"):  # a tracked list: remove/insert (un)track
        items.remove(old)
        items.insert(index, new)
    else:
        items[index] = new


def _held(parent):
    """(attribute, key, layer) of each layer `parent` holds where accelerate looks for Embeddings:
    in an attribute (key None), or in a list, tuple or dict held in one (key: the index or dict key)."""
    for name, value in list(vars(parent).items()):
        if isinstance(value, tf.keras.layers.Layer):
            yield name, None, value
        elif name.startswith("_"):
            continue  # Keras' own bookkeeping (_layers, _self_tracked_trackables, ...)
        elif isinstance(value, (list, tuple)):
            yield from ((name, i, item) for i, item in enumerate(value) if isinstance(item, tf.keras.layers.Layer))
        elif isinstance(value, dict) or type(value).__name__ == "_DictWrapper":  # tf_keras wraps dicts
            yield from ((name, key, item) for key, item in list(value.items())
                        if isinstance(item, tf.keras.layers.Layer))


def _put(parent, name, key, old, new):
    """Puts `new` where _held found `old`: in parent.name, or at parent.name[key]."""
    _untrack(parent, old)
    if key is None:
        delattr(parent, name)
        setattr(parent, name, new)
    elif isinstance(getattr(parent, name), (list, tuple)):
        _replace_item(getattr(parent, name), key, old, new)
    else:
        getattr(parent, name)[key] = new


def _layer_paths(root):
    """id(layer) -> its steps from root through _held ([attribute, key] pairs), the shortest."""
    paths, todo = {id(root): []}, collections.deque([root])
    while todo:
        parent = todo.popleft()
        for name, key, layer in _held(parent):
            if id(layer) not in paths:
                paths[id(layer)] = paths[id(parent)] + [[name, key]]
                todo.append(layer)
    return paths


def _at(root, steps):
    """The layer at `steps` from root (see _layer_paths)."""
    for name, key in steps:
        root = getattr(root, name) if key is None else getattr(root, name)[key]
    return root


@contextlib.contextmanager
def _unlocked(model):
    """Keras 3 locks a built layer's state (no new sublayers); swapping replaces sublayers."""
    trackers = [t for t in (getattr(layer, "_tracker", None) for layer in model._flatten_layers())  # pylint: disable=protected-access
                if t is not None and t.locked]
    for tracker in trackers:
        tracker.locked = False
    try:
        yield
    finally:
        for tracker in trackers:
            tracker.locked = True


def _input_spec(sample):
    """Each input's dtype and shape after the batch dimension, as "dtype:d1,d2" (a config holds it)."""
    def spec(x):
        x = tf.convert_to_tensor(x)
        return f"{x.dtype.name}:{','.join(str(d) for d in x.shape[1:])}"
    return tf.nest.map_structure(spec, sample)


def _zeros_of(spec):
    """One example of zeros ("" for strings) of each input of an _input_spec."""
    def zeros(leaf):
        dtype, dims = leaf.split(":")
        shape = [1] + [int(d) for d in dims.split(",") if d]
        return tf.fill(shape, "") if dtype == "string" else tf.zeros(shape, dtype)
    return tf.nest.map_structure(zeros, spec)


class _Accelerated:
    """Mixed into the class of an accelerated subclassed model (see _accelerated_class) so that a
    .keras file of it loads back: its config is the original class's config, the ttf layers
    accelerate swapped in with where each went (steps from the model), and one example's input
    spec; from_config makes the original class from its config, swaps the same layers in and
    calls the model on one example of zeros, which builds every layer (Keras' own build from the
    recorded shapes feeds floats, which string ids cannot take), and Keras then restores each
    variable by its usual path."""

    def get_config(self):
        if any(steps is None for steps in self._ttf_swaps):
            raise NotImplementedError(
                f"ttf.accelerate: {self.name} has a ttf table that no attribute, list or dict of the model leads "
                "to, so its config cannot say where it goes: save the weights (save_weights) instead")
        layers, swaps = {}, []  # id(layer) -> (index, layer): a layer held twice is saved once
        for steps in self._ttf_swaps:
            layer = _at(self, steps)
            swaps.append([steps, layers.setdefault(id(layer), (len(layers), layer))[0]])
        accelerated = type(self)
        original = accelerated._ttf_original  # pylint: disable=no-member
        self.__class__ = original  # Keras checks whether the class wrote its own get_config: the user's class
        try:
            config = self.get_config()
        finally:
            self.__class__ = accelerated
        return {"model": {"module": original.__module__, "class_name": original.__name__,
                          "registered_name": tf.keras.utils.get_registered_name(original), "config": config},
                "layers": [tf.keras.utils.serialize_keras_object(layer) for _, layer in layers.values()],
                "swaps": swaps, "inputs": self._ttf_inputs}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        model = tf.keras.utils.deserialize_keras_object(config["model"], custom_objects=custom_objects)
        layers = [tf.keras.utils.deserialize_keras_object(layer, custom_objects=custom_objects)
                  for layer in config["layers"]]
        with _unlocked(model):
            for steps, index in config["swaps"]:
                parent = _at(model, steps[:-1])
                _put(parent, *steps[-1], _at(parent, steps[-1:]), layers[index])
        model(_zeros_of(config["inputs"]))
        _record_swaps(model, [steps for steps, _ in config["swaps"]], config["inputs"])
        return model

    def build_from_config(self, config):
        if not self.built:  # from_config built it (tf_keras asks again)
            super().build_from_config(config)


tf.keras.utils.register_keras_serializable(package="ttf", name="AcceleratedModel")(_Accelerated)
_ACCELERATED_CLASSES = {}  # a user's model class -> its _Accelerated subclass


def _accelerated_class(cls):
    """cls's subclass of the same name with _Accelerated mixed in, registered under
    "ttf>AcceleratedModel": the name its .keras files carry, whichever class they hold (from_config
    reads the original class from the config, so any registered one loads any other's)."""
    if issubclass(cls, _Accelerated):
        return cls
    if cls not in _ACCELERATED_CLASSES:
        accelerated = type(cls.__name__, (_Accelerated, cls),
                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_ttf_original": cls})
        _ACCELERATED_CLASSES[cls] = tf.keras.utils.register_keras_serializable(
            package="ttf", name="AcceleratedModel")(accelerated)
    return _ACCELERATED_CLASSES[cls]


def _record_swaps(model, swaps, inputs):
    """Makes `model` an instance of its class's _Accelerated subclass that knows where its ttf
    layers went (swaps: their steps from model) and what one example of its inputs is."""
    model.__class__ = _accelerated_class(type(model))
    object.__setattr__(model, "_ttf_swaps", list(swaps))  # plain data, kept out of Keras' tracking
    object.__setattr__(model, "_ttf_inputs", inputs)


def _sample_from_spec(model):
    """A batch of one example of zeros ("" for strings) from the input spec tf_keras recorded."""
    spec = getattr(model, "_saved_model_inputs_spec", None)
    if spec is None:
        raise ValueError(f"ttf.accelerate: {model.name} is a subclassed model whose input spec is unknown (Keras 3 "
                         "records none): pass sample= (one batch of inputs, as model(sample) takes them)")

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape]
        return tf.fill(shape, "") if s.dtype == tf.string else tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)


def _active(regularizer):
    """A regularizer that adds a loss (DeepCTR passes l2(0) when regularization is off)."""
    if regularizer is None:
        return False
    config = regularizer.get_config() if hasattr(regularizer, "get_config") else None
    return not (config and all(isinstance(v, (int, float)) and v == 0 for v in config.values()))


def _import_rows(layer, keys, rows):
    """Writes carried-over rows into the layer's (single) table: its whole content."""
    if not len(keys):
        return
    if len(layer.tables) != 1:
        raise ValueError(f"{layer.name}: carrying rows over needs an unsharded table")
    table = layer.tables[0]
    ops().ttf_table_import(table.resource_handle, keys.astype(np.int64), rows.astype(np.float32),
                           np.zeros([len(keys), 2], np.int64), np.zeros([0], np.int64), np.zeros([0, 2], np.int64),
                           "", np.zeros([0], np.float32), 0)


def _is_lookup(layer):
    """A layer that maps raw ids to Embedding rows and that a table keyed by the raw id replaces:
    Keras' StringLookup, IntegerLookup, Hashing, or a hashing layer of the same contract
    (DeepCTR's Hash, use_hash=True: num_buckets, no vocabulary file, no mask)."""
    if isinstance(layer, _LOOKUPS):
        return True
    return (type(layer).__name__ == "Hash" and isinstance(getattr(layer, "num_buckets", None), int)
            and not getattr(layer, "mask_zero", True) and getattr(layer, "vocabulary_path", None) is None)


def _has_vocabulary(layer):
    return isinstance(layer, (tf.keras.layers.StringLookup, tf.keras.layers.IntegerLookup))


def _is_string(tensor):
    return tf.as_dtype(tensor.dtype) == tf.string  # Keras 3 spells dtypes as strings


def _compile_like(fast, model, config):
    config["optimizer"] = from_keras(model.optimizer)
    unreached = not_reaching_rows(config["optimizer"])
    if unreached:
        warnings.warn(f"ttf.accelerate: {model.name}'s optimizer settings {unreached} act on dense variables only, "
                      "not on the ttf tables' rows", stacklevel=3)
    if config.get("jit_compile") is True:
        warnings.warn(f"ttf.accelerate: jit_compile=True dropped for {fast.name}: ttf tables' ops run outside XLA "
                      "(XLA cannot compile a step that holds them)", stacklevel=3)
        config["jit_compile"] = False
    for name in ("loss", "metrics", "weighted_metrics"):
        config[name] = tf.nest.map_structure(_fresh, config.get(name))
    optimizer = config["optimizer"]
    # Where Keras' dense update moves rows the batch did not touch (Adam's momentum, any weight
    # decay, FTRL's l2 shrinkage), the lazy table update differs: said here, once.
    lazy = "" if not (isinstance(optimizer, ttf_optimizers.Adam) or optimizer.weight_decay or getattr(
        optimizer, "l2_shrinkage_regularization_strength", 0)) else (
        " (its table updates are lazy: only the rows a batch touches move, with their optimizer slots, where Keras "
        "also moves the other rows of an Embedding matrix each step)")
    print(f"ttf.accelerate: {fast.name} compiled like {model.name}, with ttf.optimizers.{type(optimizer).__name__}"
          f"{lazy}", file=sys.stderr)
    fast.compile(**config)


def _fresh(obj):
    """A new metric or loss object of the same config (they hold state tied to one model)."""
    if isinstance(obj, (tf.keras.metrics.Metric, tf.keras.losses.Loss)):
        return obj.__class__.from_config(obj.get_config())
    return obj
