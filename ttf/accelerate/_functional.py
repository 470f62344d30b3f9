"""The functional converter: a functional or Sequential model's graph rebuilt with its
Embeddings as ttf tables (fused where their ids allow), nested functional or Sequential blocks
holding Embeddings converted the same way, every other layer cloned with its weights."""
import collections
import dataclasses
import warnings

import numpy as np
import tensorflow as tf

from ttf._keras import graph as _graph
from ttf.accelerate._compile import compile_like
from ttf.accelerate._tables import check_embedding, import_rows, initializer_of, report, seed_of, single_table
from ttf.embedding import FusedLookup

_LOOKUPS = (tf.keras.layers.StringLookup, tf.keras.layers.IntegerLookup, tf.keras.layers.Hashing)


@dataclasses.dataclass
class _Source:
    """Where an Embedding call's ids come from once its lookup layer is gone."""
    tensor: object  # a KerasTensor of the original model
    key_kind: str  # "int" or "string"
    vocabulary: object = None  # the lookup layer whose vocabulary maps raw ids to rows, if any
    skipped: object = None  # the lookup node replaced by the key transform


class Converter:
    """One functional graph -> the new model (see accelerate)."""

    def __init__(self, model, graph, keep, compile_model=True, name_prefix="", table_rows="fp32"):
        self.model, self.graph, self.keep = model, graph, keep  # graph: the Functional behind model
        self.table_rows = table_rows  # how the tables store rows (accelerate's table_rows)
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
        self.clones = {}  # original layer -> its clone in the new model (a nested block: its conversion)
        self.blocks = set()  # the nested blocks converted (their weights came with them)
        self.nested_messages = []  # the warnings of the nested blocks' conversions
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
        return [layer for layer in layers if layer.name not in self.keep]

    def convert_blocks(self):
        """Converts each nested functional or Sequential block holding Embeddings that the graph
        calls (TFRS' Sequential([StringLookup, Embedding])); warns about other nested models
        holding Embeddings (a subclassed one, or a block the user keeps), which stay as they are."""
        for layer in dict.fromkeys(_graph.layer(n) for n in self.nodes if not n.is_input):
            converted = converted_block(layer, self.keep)
            if converted is not None:
                self.clones[layer], messages = converted
                self.blocks.add(layer)
                self.nested_messages += messages
        inside = {id(inner) for block in self.blocks
                  for inner in block._flatten_layers()}  # pylint: disable=protected-access
        for layer in self.model._flatten_layers(include_self=False):  # pylint: disable=protected-access
            if id(layer) not in inside and isinstance(layer, tf.keras.Model) and _holds_embeddings(layer):
                self.warnings["nested model whose Embedding layers stay Keras Embeddings"].append(layer.name)

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
        self.convert_blocks()
        calls = {layer: [n for n in layer._inbound_nodes if n in self._node_set()] for layer in embeddings}
        sources = {id(n): self.source(n) for layer in embeddings for n in calls[layer]}
        for layer in embeddings:
            check_embedding(layer, self.warnings)
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
                groups[(layer.output_dim, initializer_of(layer, self.warnings), layer.trainable)].append(layer)
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
            for start in range(0, len(layers), FusedLookup.MAX_TAGS):
                self._fuse(layers[start:start + FusedLookup.MAX_TAGS], dim, initializer, trainable, calls, sources,
                           tensors, outputs_of)
        for node in self.nodes:
            if id(node) in late:
                self._rebuild(node, skipped, outputs_of, tables, sources, tensors)
        for layer in list(self.clones):
            # Keras 3 graphs hold weightless keras.ops Operations too; a converted block came with its weights.
            if hasattr(layer, "get_weights") and layer not in self.blocks:
                self.clones[layer].set_weights(layer.get_weights())

        nested_inputs, nested_outputs = _graph.structures(self.graph)
        fast = tf.keras.Model(tf.nest.pack_sequence_as(nested_inputs, new_inputs),
                              tf.nest.pack_sequence_as(nested_outputs, [tensors[id(t)] for t in self.graph.outputs]),
                              name=f"{self.model.name}_ttf")
        for layer, (keys, rows) in self.carried.items():
            import_rows(layer, keys, rows)
        self._report()
        config = _graph.compile_config(self.model)
        if config is not None and self.compile_model:
            compile_like(fast, self.model, config)
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

    def _fuse(self, layers, dim, initializer, trainable, calls, sources, tensors, outputs_of):
        tags = {layer: i for i, layer in enumerate(layers)}
        columns = [(layer, node) for layer in layers for node in calls[layer]]
        fused = FusedLookup(dim, [tags[layer] for layer, _ in columns],
                            [sources[id(node)].key_kind for _, node in columns],
                            [self._mask_value(layer, sources[id(node)]) for layer, node in columns],
                            initializer=initializer, seed=seed_of(layers[0]), trainable=trainable,
                            name=f"{self.name_prefix}ttf_fused_{dim}d_{len(self.carried)}", rows=self.table_rows)
        results = fused([tensors[id(sources[id(node)].tensor)] for _, node in columns])
        for (layer, node), out in zip(columns, results):
            outputs_of[id(node)] = out
        keys, rows = [], []
        for layer in layers:
            source = next(sources[id(n)] for n in calls[layer])
            layer_keys, layer_rows = self._rows(layer, source, tags[layer])
            keys.append(layer_keys)
            rows.append(layer_rows)
        self.carried[fused] = (np.concatenate(keys), np.concatenate(rows))

    def _single_lookup(self, layer, source):
        """A lookup of its own (untagged keys) for an Embedding whose ids are computed from
        another Embedding's output, or are not a dense tensor."""
        table = single_table(layer, source.key_kind, self._mask_value(layer, source), self.warnings, self.table_rows)
        self.carried[table] = self._rows(layer, source, None)
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

    def _rows(self, layer, source, tag):
        """(keys [N] int64 tagged with tag, rows [N, dim]) that carry the Embedding's rows over."""
        matrix = layer.get_weights()[0]
        if source.skipped is not None and source.vocabulary is None:  # Hashing: nothing to carry
            return np.zeros([0], np.int64), np.zeros([0, matrix.shape[1]], np.float32)
        if source.vocabulary is None:
            ids, rows = np.arange(len(matrix), dtype=np.int64), matrix
        else:
            ids = [t for t in source.vocabulary.get_vocabulary() if t != source.vocabulary.mask_token]
            ids = [t for t in ids if t != getattr(source.vocabulary, "oov_token", None)]
            rows = matrix[source.vocabulary(tf.constant(ids)).numpy()]
        return FusedLookup.column_keys(tf.constant(ids), source.key_kind, tag).numpy(), rows

    def _report(self):
        report(self.warnings, self.nested_messages, stacklevel=3)


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


def _holds_embeddings(layer):
    return any(isinstance(inner, tf.keras.layers.Embedding)
               for inner in layer._flatten_layers())  # pylint: disable=protected-access


def converted_block(layer, keep, original=None, table_rows="fp32"):
    """(the conversion of a nested functional or Sequential block holding Embeddings, the messages
    of its warnings), or None for any other layer or one the user keeps. original: the block to
    read (its lookups' vocabularies, adapted or not) when `layer` is a copy of it."""
    if layer.name in keep or _graph.functional(layer) is None or not _holds_embeddings(layer):
        return None
    original = layer if original is None else original
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        converted = Converter(original, _graph.functional(original), keep, compile_model=False,
                               name_prefix=f"{layer.name}_", table_rows=table_rows).run()
    return converted, [str(w.message) for w in caught]
