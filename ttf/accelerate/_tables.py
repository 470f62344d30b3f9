"""What both converters do with a Keras Embedding: its table's settings (with a warning for
what ttf cannot carry), a one-column table of it, its rows written into a table, and the
warnings said once per conversion."""
import warnings

import numpy as np

from ttf._ops import ops
from ttf.embedding import FusedLookup, RowInitializer


def check_embedding(layer, found):
    """Records in `found` (what -> layer names) what a table drops of the Embedding."""
    if _active(layer.embeddings_regularizer) or _active(layer.activity_regularizer):
        found["regularizer dropped (ttf tables add no regularization loss)"].append(layer.name)
    if layer.embeddings_constraint is not None:
        found["embeddings_constraint dropped"].append(layer.name)


def initializer_of(layer, found):
    """The Embedding's initializer as a RowInitializer (Keras' default when ttf lacks it, recorded in `found`)."""
    try:
        return RowInitializer.of(layer.embeddings_initializer)
    except TypeError:
        found["initializer ttf lacks: new ids start from uniform(-0.05, 0.05)"].append(layer.name)
        return RowInitializer()


def seed_of(layer):
    return int(getattr(layer.embeddings_initializer, "seed", None) or 0)


def single_table(layer, key_kind, mask_value, found, rows="fp32"):
    """A lookup of its own (one untagged column) with the Embedding's settings and name; `rows`:
    how its table stores rows."""
    return FusedLookup(layer.output_dim, [None], [key_kind], [mask_value], initializer=initializer_of(layer, found),
                       seed=seed_of(layer), trainable=layer.trainable, name=layer.name, rows=rows)


def report(found, messages, stacklevel):
    """Warns the messages (a nested block's conversion said them), then once per kind of change
    in `found`, naming its layers."""
    for message in dict.fromkeys(messages):
        warnings.warn(message, stacklevel=stacklevel + 1)
    for what, names in found.items():
        warnings.warn(f"ttf.accelerate: {what}: {', '.join(dict.fromkeys(names))}", stacklevel=stacklevel + 1)


def _active(regularizer):
    """A regularizer that adds a loss (DeepCTR passes l2(0) when regularization is off)."""
    if regularizer is None:
        return False
    config = regularizer.get_config() if hasattr(regularizer, "get_config") else None
    return not (config and all(isinstance(v, (int, float)) and v == 0 for v in config.values()))


def import_rows(layer, keys, rows):
    """Writes carried-over rows into the layer's (single) table: its whole content."""
    if not len(keys):
        return
    if len(layer.tables) != 1:
        raise ValueError(f"{layer.name}: carrying rows over needs an unsharded table")
    table = layer.tables[0]
    ops().ttf_table_import(table.resource_handle, keys.astype(np.int64), rows.astype(np.float32),
                           np.zeros([len(keys), 2], np.int64), np.zeros([0], np.int64), np.zeros([0, 2], np.int64),
                           "", np.zeros([0], np.float32), 0)

