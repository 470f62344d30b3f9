"""The subclassed converter: a new instance of a subclassed model's class with its weights,
whose Embeddings (and nested functional or Sequential blocks holding Embeddings) are swapped
for ttf tables."""
import collections

import numpy as np
import tensorflow as tf

from ttf._keras import KERAS3, graph as _graph
from ttf.accelerate._compile import compile_like
from ttf.accelerate._functional import converted_block
from ttf.accelerate._keras3_copy import copy_keras3_model
from ttf.accelerate._paths import held, layer_paths, put, unlocked
from ttf.accelerate._saving import input_spec, record_swaps
from ttf.accelerate._tables import check_embedding, import_rows, report, single_table


class Subclassed:
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
        paths = layer_paths(clone)
        swaps = []  # where each twin went: its steps from clone (None: no attribute path leads there)
        with unlocked(clone):
            for parent in list(clone._flatten_layers(include_self=True)):  # pylint: disable=protected-access
                if isinstance(parent, tf.keras.layers.Embedding) or _graph.functional(parent) is not None:
                    continue  # swapped as a whole by its parent
                for name, key, layer in list(held(parent)):
                    new = self._twin(layer, originals)
                    if new is not None:
                        put(parent, name, key, layer, new)
                        swaps.append(None if id(parent) not in paths else paths[id(parent)] + [[name, key]])
        if not swaps:
            self.warnings["no Embedding found to convert (the new model equals the original)"].append(clone.name)
        report(self.warnings, self.nested_warnings, stacklevel=3)
        clone(self.sample)  # builds the new tables' anchors
        record_swaps(clone, swaps, input_spec(self.sample))
        config = _graph.compile_config(self.model)
        if config is not None:
            compile_like(clone, self.model, config)
        return clone

    def _new_instance(self):
        cls = type(self.model)
        try:
            clone = cls.from_config(self.model.get_config())
            clone(self.sample)
        except Exception as err:  # noqa: BLE001  (the user's class: say what to fix)
            if KERAS3:  # Keras 3 keeps no constructor arguments of a Model subclass: copy the objects
                return copy_keras3_model(self.model)
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
            check_embedding(layer, self.warnings)
            table = single_table(layer, "int", 0 if layer.mask_zero else None, self.warnings, self.table_rows)
            matrix = layer.get_weights()[0]
            table.build(None)
            import_rows(table, np.arange(len(matrix), dtype=np.int64), matrix)
            return table
        converted = converted_block(layer, self.keep, originals.get(id(layer), layer), self.table_rows)
        if converted is None:
            return None
        block, messages = converted
        self.nested_warnings += messages
        return block


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



def _first_line(err):
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")[:300]

