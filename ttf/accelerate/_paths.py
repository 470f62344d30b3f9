"""Where a layer sits in a model: steps from the model through attributes, lists and dicts
(how the subclassed converter finds Embeddings to swap, and how a saved accelerated model
says where its ttf layers go)."""
import collections
import contextlib

import tensorflow as tf


def _untrack(parent, layer):
    """Keras 3 keeps a replaced sublayer in its parent's tracker (its weights would stay the parent's)."""
    tracker = getattr(parent, "_tracker", None)
    if tracker is not None:
        tracker.untrack(layer)


def _replace_item(items, index, old, new):
    if hasattr(items, "remove") and hasattr(items, "insert"):  # a tracked list: remove/insert (un)track
        items.remove(old)
        items.insert(index, new)
    else:
        items[index] = new


def held(parent):
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


def put(parent, name, key, old, new):
    """Puts `new` where held found `old`: in parent.name, or at parent.name[key]."""
    _untrack(parent, old)
    if key is None:
        delattr(parent, name)
        setattr(parent, name, new)
    elif isinstance(getattr(parent, name), (list, tuple)):
        _replace_item(getattr(parent, name), key, old, new)
    else:
        getattr(parent, name)[key] = new


def layer_paths(root):
    """id(layer) -> its steps from root through held ([attribute, key] pairs), the shortest."""
    paths, todo = {id(root): []}, collections.deque([root])
    while todo:
        parent = todo.popleft()
        for name, key, layer in held(parent):
            if id(layer) not in paths:
                paths[id(layer)] = paths[id(parent)] + [[name, key]]
                todo.append(layer)
    return paths


def at(root, steps):
    """The layer at `steps` from root (see layer_paths)."""
    for name, key in steps:
        root = getattr(root, name) if key is None else getattr(root, name)[key]
    return root


@contextlib.contextmanager
def unlocked(model):
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
