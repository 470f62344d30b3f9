"""FusedLookup: N id columns of any dense shape, int or string, in one table and one op call
(what ttf.accelerate turns a model's Keras Embeddings into), and TableLookup, its one-column
name in models saved before it."""
import tensorflow as tf

from ttf._keras import KERAS3
from ttf.data._schema import FIELD_SHIFT
from ttf.embedding._layers import DynamicEmbedding

_VALUE_MASK = (1 << FIELD_SHIFT) - 1  # the id part of a key: the tag sits above it, as the parser's field


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

    MAX_TAGS = 256  # the tag takes the key's top 8 bits

    def __init__(self, dim, tags, key_kinds, mask_values=None, **kwargs):
        super().__init__(dim, **kwargs)
        mask_values = [None] * len(tags) if mask_values is None else list(mask_values)
        if len(tags) != len(key_kinds) or len(tags) != len(mask_values) or not all(
                t is None or 0 <= t < self.MAX_TAGS for t in tags):
            raise ValueError(f"tags must be N ints in [0, {self.MAX_TAGS}) or None, with N key_kinds and N "
                             f"mask_values; got {tags}, {key_kinds}, {mask_values}")
        self.tags, self.key_kinds, self.mask_values = list(tags), list(key_kinds), mask_values

    @staticmethod
    def column_keys(ids, key_kind, tag):
        """One column's ids -> its flat keys [size of ids] int64: int ids as they are (hashed
        below the tag when wider), strings as a 64-bit hash below 2**56, then tagged unless tag is None."""
        if key_kind == "string":
            keys = tf.strings.to_hash_bucket_fast(tf.reshape(ids, [-1]), 1 << FIELD_SHIFT)
        else:
            keys = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        if tag is None:
            return keys
        below_tag = keys if key_kind == "string" else _below_tag(keys)  # a string's hash is below the tag already
        return tf.bitwise.bitwise_or(below_tag, tf.constant(tag << FIELD_SHIFT, tf.int64))

    def _columns(self, ids):
        if not isinstance(ids, (list, tuple)):  # a model loaded from a file passes one tensor alone
            ids = [ids]
        if len(ids) != len(self.tags):
            raise ValueError(f"{self.name}: expected {len(self.tags)} id tensors, got {len(ids)}")
        return ids

    def keys_of(self, ids):
        """-> (flat keys [sum of the columns' sizes] int64, None), column after column."""
        return tf.concat([self.column_keys(x, kind, tag)
                          for x, kind, tag in zip(self._columns(ids), self.key_kinds, self.tags)], axis=0), None

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


@tf.keras.utils.register_keras_serializable(package="ttf")
class TableLookup(FusedLookup):
    """A FusedLookup of one untagged column, under the name accelerate gave a single lookup
    before FusedLookup took ids of any shape: models saved with it load unchanged."""

    def __init__(self, dim, key_kind="int", mask_value=None, **kwargs):
        kwargs.pop("tags", None)  # a config its get_config wrote: FusedLookup's fields, one column
        key_kind = list(kwargs.pop("key_kinds", [key_kind]))[0]
        mask_value = list(kwargs.pop("mask_values", [mask_value]))[0]
        super().__init__(dim, [None], [key_kind], [mask_value], **kwargs)


def _below_tag(keys):
    """int64 keys -> keys in [0, 2**56), below the tag. Keys already there stay as they are;
    wider ones (negative, or 2**56 and up) are hashed (Fingerprint64) into that range, never
    cut: cutting the top bits would give id 2**56 + 5 the row of id 5, always. A hashed id
    collides with another id with the odds of a string id's 64-bit hash (about n**2 / 2**57)."""
    wide = tf.logical_or(keys < 0, keys > _VALUE_MASK)
    fingerprints = tf.fingerprint(tf.reshape(keys, [-1, 1]))  # [N, 8] uint8
    hashed = tf.reshape(tf.bitcast(fingerprints, tf.int64), tf.shape(keys))
    return tf.where(wide, tf.bitwise.bitwise_and(hashed, _VALUE_MASK), keys)


def _not_equal(ids, value):
    # Keras 3 asks for the mask of symbolic inputs too, which only keras.ops take (tf.keras is keras there).
    return tf.keras.ops.not_equal(ids, value) if KERAS3 else tf.not_equal(ids, value)
