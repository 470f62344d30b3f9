"""FunctionalGraph: the functional-model internals ttf walks (ttf.accelerate, the synchronous
table sharding), in tf_keras' spelling. Keras 3's (ttf/_keras3.py) subclasses it; ttf/_keras.py
picks the one of the Keras that tf.keras resolved to (`graph`)."""
import tensorflow as tf


class FunctionalGraph:
    """The functional-model internals ttf walks (ttf.accelerate, the synchronous table
    sharding), in tf_keras' spelling; Keras 3's (ttf/_keras3.py) is a subclass that spells
    what differs: how a node names its layer and holds its call's arguments, the model's
    input and output structures, a new Input, compile's arguments."""
    NODE_LAYER = "layer"  # the attribute of a Node and of a KerasTensor's history naming its layer

    @staticmethod
    def functional(model):
        """`model` when it is a functional or Sequential model with known inputs, else None."""
        return model if getattr(model, "_is_graph_network", False) else None

    @staticmethod
    def nodes_by_depth(model):
        return model._nodes_by_depth  # pylint: disable=protected-access

    @classmethod
    def layer(cls, node):
        return getattr(node, cls.NODE_LAYER)

    @staticmethod
    def inputs(node):
        return list(node.keras_inputs)

    @staticmethod
    def outputs(node):
        return tf.nest.flatten(node.outputs)

    @staticmethod
    def arguments(node):
        """(positional, keyword) arguments of `node`'s call, KerasTensors among them."""
        return node.call_args, node.call_kwargs

    @staticmethod
    def filled(node, tensors):
        """(args, kwargs) of `node`'s call with its KerasTensors mapped by id through `tensors`."""
        return node.map_arguments(_Always(tensors))

    @classmethod
    def call(cls, node, layer, tensors):
        """Calls `layer` as `node` called its layer, with KerasTensors mapped by id through `tensors`."""
        args, kwargs = cls.filled(node, tensors)
        return layer(*args, **kwargs)

    @classmethod
    def first_argument(cls, node, name):
        """The KerasTensor `node`'s layer was called with first (or as `name`), or None."""
        args, kwargs = cls.arguments(node)
        return args[0] if args else kwargs.get(name)

    @classmethod
    def producer(cls, tensor):
        """(layer, node index) that made the KerasTensor."""
        history = tensor._keras_history  # pylint: disable=protected-access
        return getattr(history, cls.NODE_LAYER), history.node_index

    @classmethod
    def new_input(cls, tensor):
        return tf.keras.Input(type_spec=tensor.type_spec, name=cls.producer(tensor)[0].name)

    @staticmethod
    def is_dense(tensor):
        return isinstance(tensor.type_spec, tf.TensorSpec)

    @staticmethod
    def structures(model):
        """(nested inputs, nested outputs) of the functional model."""
        return model._nested_inputs, model._nested_outputs  # pylint: disable=protected-access

    @staticmethod
    def compile_config(model):
        """compile()'s arguments when the model is compiled, else None."""
        if getattr(model, "optimizer", None) is None or not getattr(model, "_is_compiled", False):
            return None
        return dict(model._compile_config.config) if hasattr(model, "_compile_config") else {}  # pylint: disable=protected-access


class _Always(dict):
    """tensor_dict for tf_keras' Node.map_arguments, which pops one use per read: ours never runs out."""

    def __getitem__(self, key):
        return [dict.__getitem__(self, int(key) if isinstance(key, str) else key)]
