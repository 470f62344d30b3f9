"""DeepFM and Wide&Deep, each built from one spec in three forms that differ only in the
sparse part and the optimizer:

  native: tf.keras Hashing + Embedding (a fixed bucket count per field) + tf.keras optimizer
  tfra:   TFRA dynamic_embedding.keras.layers.Embedding + de.DynamicEmbeddingOptimizer
  ttf:    ttf.FusedEmbedding (one fused lookup for all fields) + ttf.optimizers

Every form embeds each id into dim + 1 floats: dim for the FM / deep part, 1 as the id's
first-order (linear / wide) weight, so the three are the same model. The dense part is
built by one function with seeded initialisers: for a given seed all forms start from the
same dense weights.
"""
import dataclasses

import numpy as np
import tensorflow as tf

import ttf

PATHS = ("native", "tfra", "ttf")
OPTIMIZERS = ("adam", "adagrad", "ftrl", "sgd")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """model: "fm" (DeepFM) or "wdl" (Wide&Deep). mlp: hidden layer sizes of the deep part
    (default (400, 400, 400) for fm, (1024, 512, 256) for wdl). native_buckets: rows per
    field of the native path's fixed-size tables. The input: num_fields one-hot fields
    (feature "ids", int64 [B, num_fields]), num_dense dense columns ("dense", float32
    [B, num_dense]) and multi_hot, a tuple of (feature name, combiner "mean" | "sum") for
    ragged int64 [B, None] features; `spec_for(schema)` fills these from a ttf.data.Schema."""

    model: str = "fm"
    embedding_dim: int = 16
    mlp: tuple = ()
    num_fields: int = ttf.data.NUM_FIELDS
    num_dense: int = ttf.data.NUM_DENSE
    native_buckets: int = 100_000
    multi_hot: tuple = ()

    def __post_init__(self):
        if self.model not in ("fm", "wdl"):
            raise ValueError(f"model must be 'fm' or 'wdl', got {self.model!r}")
        if self.embedding_dim <= 0 or self.native_buckets <= 0:
            raise ValueError("embedding_dim and native_buckets must be > 0")
        object.__setattr__(self, "multi_hot", tuple(tuple(entry) for entry in self.multi_hot))
        if self.num_fields < 0 or self.num_dense < 0:
            raise ValueError(f"num_fields and num_dense must be >= 0, got {self.num_fields} and {self.num_dense}")
        if self.num_fields + len(self.multi_hot) == 0:
            raise ValueError("a CTR model needs at least one categorical field (one-hot or multi-hot)")
        for entry in self.multi_hot:
            if len(entry) != 2 or entry[1] not in ("mean", "sum"):
                raise ValueError(f"multi_hot entries are (name, 'mean' | 'sum'), got {entry!r}")
        if not self.mlp:
            object.__setattr__(self, "mlp", (400, 400, 400) if self.model == "fm" else (1024, 512, 256))

    @property
    def num_embedded_fields(self):
        return self.num_fields + len(self.multi_hot)


def spec_for(schema, **kwargs):
    """A ModelSpec whose input is the features of `schema` (a ttf.data.Schema or its name)."""
    schema = ttf.data.load_schema(schema)
    return ModelSpec(num_fields=schema.num_fields, num_dense=schema.num_dense,
                     multi_hot=tuple((c.name, c.combiner) for c in schema.multi_hot), **kwargs)


class NativeSparse(tf.keras.layers.Layer):
    """Hashing into native_buckets rows per field, one Embedding holding every field's rows."""

    def __init__(self, spec, seed, **kwargs):
        super().__init__(**kwargs)
        self.hashing = tf.keras.layers.Hashing(num_bins=spec.native_buckets)
        self.embedding = tf.keras.layers.Embedding(
            spec.num_fields * spec.native_buckets, spec.embedding_dim + 1,
            embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed))
        self.offsets = tf.constant(np.arange(spec.num_fields, dtype=np.int64) * spec.native_buckets)

    def call(self, ids, training=None):
        return self.embedding(self.hashing(ids) + self.offsets)


def tfra_missing():
    """Why the TFRA path cannot run here, in one line, or None when it can."""
    if not tf.__version__.startswith("2.16."):
        return (f"--tfra needs TensorFlow 2.16 (TFRA 0.8.1, its last release, exists for no later TF), but "
                f"TensorFlow {tf.__version__} is installed: set up with TTF_TF=2.16 ./scripts/setup_env.sh")
    try:
        from tensorflow_recommenders_addons import dynamic_embedding  # noqa: F401
    except Exception as err:  # ImportError, or its ops not loading (NotFoundError)
        return f"--tfra needs tensorflow-recommenders-addons 0.8.1, which does not import here ({err}); pip install -r requirements-tf2.16.txt"
    return None


class TfraSparse(tf.keras.layers.Layer):
    """TFRA's dynamic embedding over the flattened ids."""

    def __init__(self, spec, seed, devices=None, **kwargs):
        super().__init__(**kwargs)
        from tensorflow_recommenders_addons import dynamic_embedding as de

        self.dim = spec.embedding_dim + 1
        self.embedding = de.keras.layers.Embedding(
            self.dim, initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed), devices=devices,
            name=f"tfra_embedding_{tf.keras.backend.get_uid('tfra_embedding')}")  # TFRA names are process-global

    def call(self, ids, training=None):
        rows = self.embedding(tf.reshape(ids, [-1]))
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))


class NativeBagSparse(tf.keras.layers.Layer):
    """Native path, one multi-hot field: Hashing into native_buckets rows + Embedding, over flat ids [T]."""

    def __init__(self, spec, seed, **kwargs):
        super().__init__(**kwargs)
        self.hashing = tf.keras.layers.Hashing(num_bins=spec.native_buckets)
        self.embedding = tf.keras.layers.Embedding(
            spec.native_buckets, spec.embedding_dim + 1,
            embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed))

    def call(self, ids, training=None):
        return self.embedding(self.hashing(ids))


def bag_layer(spec, path, seed, index, shard_devices=None, table_options=None):
    """The table of multi-hot field `index`: flat ids [T] -> rows [T, dim + 1]."""
    if path == "native":
        return NativeBagSparse(spec, seed, name=f"native_bag_{index}", autocast=False)
    if path == "tfra":
        return TfraSparse(spec, seed, devices=shard_devices, name=f"tfra_bag_{index}", autocast=False)
    if path == "ttf":
        return ttf.DynamicEmbedding(spec.embedding_dim + 1, seed=seed,
                                    initializer=ttf.embedding.RowInitializer("uniform", -0.05, 0.05),
                                    shard_devices=shard_devices, name=f"ttf_bag_{index}", **(table_options or {}))
    raise ValueError(f"path must be one of {PATHS}, got {path!r}")


def sparse_layer(spec, path, seed, shard_devices=None, table_options=None):
    if spec.num_fields == 0:
        return None
    if path == "native":
        return NativeSparse(spec, seed, name="native_sparse", autocast=False)
    if path == "tfra":
        return TfraSparse(spec, seed, devices=shard_devices, name="tfra_sparse", autocast=False)
    if path == "ttf":
        return ttf.FusedEmbedding(spec.embedding_dim + 1, num_fields=spec.num_fields, seed=seed,
                                  initializer=ttf.embedding.RowInitializer("uniform", -0.05, 0.05),
                                  shard_devices=shard_devices, name="ttf_sparse", **(table_options or {}))
    raise ValueError(f"path must be one of {PATHS}, got {path!r}")


class CTRModel(tf.keras.Model):
    """features {"ids": int64 [B, F], "dense": float32 [B, D], <multi-hot name>: ragged int64
    [B, None], ...} -> click probability [B]. A multi-hot field's row is the mean (or sum) of
    its ids' rows (zeros for an empty list) and then counts as one more field."""

    def __init__(self, spec, sparse, seed=0, bags=(), **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.sparse = sparse
        self.bags = list(bags)
        glorot = lambda offset: tf.keras.initializers.GlorotUniform(seed=seed + offset)  # noqa: E731
        self.dense_linear = tf.keras.layers.Dense(1, kernel_initializer=glorot(1), name="dense_linear")
        self.hidden = [tf.keras.layers.Dense(units, activation="relu", kernel_initializer=glorot(10 + i),
                                             name=f"mlp_{i}") for i, units in enumerate(spec.mlp)]
        self.deep_out = tf.keras.layers.Dense(1, kernel_initializer=glorot(2), name="deep_out")

    def call(self, features, training=False):
        return tf.sigmoid(self.logits(features, training=training))

    def logits(self, features, training=False, compute_dtype=None):
        """[B] float32 logits. The dense part runs in compute_dtype (default: this model's
        compute dtype, bfloat16 inside ttf.precision's low-precision step); weights stay fp32."""
        rows = self.field_rows(features, training)  # [B, F + M, dim + 1]
        return self.dense_logits(rows, features["dense"] if self.spec.num_dense else None, compute_dtype)

    def dense_logits(self, rows, dense, compute_dtype=None):
        """The dense part: [B] float32 logits from the embedding rows [B, F + M, dim + 1] (one-hot
        fields, then one combined row per multi-hot field) and the dense features [B, D] (None
        when the spec has no dense columns). Runs in compute_dtype (default: this model's
        compute dtype, bfloat16 inside ttf.precision's low-precision step); weights stay fp32."""
        dtype = tf.as_dtype(compute_dtype or self.compute_dtype)
        dim = self.spec.embedding_dim
        rows = tf.cast(rows, tf.float32)
        emb, first_order = rows[..., :dim], rows[..., dim]
        logit = tf.reduce_sum(first_order, axis=1)
        x = tf.reshape(emb, [-1, self.spec.num_embedded_fields * dim])
        if self.spec.num_dense:
            dense = tf.cast(dense, tf.float32)
            linear = _mlp([self.dense_linear], dense, dtype)
            logit += tf.cast(linear[:, 0], tf.float32)
            x = tf.concat([x, dense], axis=1)
        deep_logit = _mlp(self.hidden + [self.deep_out], x, dtype)
        logit += tf.cast(deep_logit[:, 0], tf.float32)
        if self.spec.model == "fm":  # FM second order: 0.5 * sum((sum_f e)^2 - sum_f e^2)
            e = tf.cast(emb, dtype)
            square_of_sum = tf.square(tf.reduce_sum(e, axis=1))
            sum_of_squares = tf.reduce_sum(tf.square(e), axis=1)
            logit += tf.cast(0.5 * tf.reduce_sum(square_of_sum - sum_of_squares, axis=1), tf.float32)
        return logit

    def field_rows(self, features, training):
        """[B, F + M, dim + 1] float32: the one-hot fields' rows, then one row per multi-hot
        field, the mean (or sum) of its ids' rows (zeros for an empty list)."""
        parts = []
        if self.sparse is not None:
            parts.append(tf.cast(self.sparse(features["ids"], training=training), tf.float32))
        for (name, combiner), bag in zip(self.spec.multi_hot, self.bags):
            ids = features[name]  # ragged [B, None]
            rows = tf.cast(bag(ids.values, training=training), tf.float32)  # [T, dim + 1]
            summed = tf.math.unsorted_segment_sum(rows, ids.value_rowids(), ids.nrows())
            if combiner == "mean":
                counts = tf.cast(tf.maximum(ids.row_lengths(), 1), summed.dtype)
                summed = summed / counts[:, None]
            parts.append(summed[:, None, :])
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)


class Logits(tf.keras.Model):
    """The logits of a CTRModel as a Keras model sharing its weights: what the training
    step runs (a from-logits loss is stabler than one on probabilities)."""

    def __init__(self, model, **kwargs):
        super().__init__(name=f"{model.name}_logits", **kwargs)
        self.ctr = model

    def call(self, features, training=False):
        return self.ctr.logits(features, training=training)


def _mlp(layers, x, compute_dtype):
    """Runs Dense layers in compute_dtype. A layer whose policy already computes in it
    (float32, or bfloat16 under ttf.precision.low_precision) casts by itself; otherwise
    inputs and kernels are cast here, so the same fp32 weights serve both precisions."""
    for layer in layers:
        if not layer.built:
            layer.build(x.shape)
        if tf.as_dtype(layer.compute_dtype) == compute_dtype:
            x = layer(x)
            continue
        x = tf.matmul(tf.cast(x, compute_dtype), tf.cast(layer.kernel, compute_dtype)) + tf.cast(layer.bias, compute_dtype)
        if layer.activation is not None:
            x = layer.activation(x)
    return x


def build(spec, path, seed=0, shard_devices=None, table=None):
    """The model of `spec` in form `path` (native | tfra | ttf). table (ttf only): a
    ttf.embedding.TableConfig bounding every ttf table (capacity, eviction, DRAM + SSD tier)."""
    if table is not None and path != "ttf":
        raise ValueError(f"a TableConfig bounds ttf tables, not the {path!r} path's")
    table_options = table.layer_options() if table is not None else None
    if path == "tfra" and tfra_missing():
        raise RuntimeError(tfra_missing())
    bags = [bag_layer(spec, path, seed, i, shard_devices, table_options) for i in range(len(spec.multi_hot))]
    return CTRModel(spec, sparse_layer(spec, path, seed, shard_devices, table_options), seed=seed, bags=bags,
                    name=f"{spec.model}_{path}")


def make_optimizer(path, name, learning_rate):
    """The optimizer `name` (adam | adagrad | ftrl | sgd) for `path`, with Keras defaults."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    keras_names = {"adam": "Adam", "adagrad": "Adagrad", "ftrl": "Ftrl", "sgd": "SGD"}
    if path == "ttf":
        return getattr(ttf.optimizers, keras_names[name])(learning_rate)
    optimizer = getattr(tf.keras.optimizers, keras_names[name])(learning_rate)
    if path == "tfra":
        from tensorflow_recommenders_addons import dynamic_embedding as de

        optimizer = de.DynamicEmbeddingOptimizer(optimizer)
    return optimizer
