"""Keras 3's copy of a subclassed model: Keras 3 keeps no constructor arguments of a Model
subclass, so the subclassed converter copies its objects with new variables instead."""
import inspect
import types
import weakref

import tensorflow as tf

from ttf._keras import KERAS3, graph

if KERAS3:  # ttf/_keras3.py imports keras: only where tf.keras is it
    from ttf import _keras3

# Attributes of a Keras 3 model that hold functions traced for the original (they would run it).
_TRACED = ("train_function", "test_function", "predict_function", "_jit_compile", "optimizer")


def copy_keras3_model(model):
    """A copy of a Keras 3 model whose variables are new ones holding the same values: every
    Python object reachable from the model is copied once (Keras 3 layers are plain Python
    objects over tf.Variables), functions and classes shared; the traced train/predict
    functions and the optimizer are not carried (the copy is compiled afresh)."""
    tracker = _keras3.tracker_class()
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
        if obj is not model and graph.functional(obj) is not None:  # a functional/Sequential block: Keras' clone
            new = memo[id(obj)] = tf.keras.models.clone_model(obj)
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
        if isinstance(obj, tracker):  # it remembers its objects by id: the copies' ids
            new.stored_ids = {name: {id(v) for v in store} for name, (_, store) in new.config.items()}
        return new

    return copied(model)
