"""ttf.accelerate(model): which converter a model takes (functional or subclassed)."""
from ttf._keras import graph as _graph
from ttf.accelerate._functional import Converter
from ttf.accelerate._subclassed import Subclassed
from ttf.embedding import tables_in
from ttf.embedding._table import check_rows


def accelerate(model, keep=(), sample=None, table_rows="fp32"):
    """Returns `model` with every tf.keras Embedding turned into a ttf table (tf_keras or Keras 3).

    The new model has the same inputs and outputs and computes the same function:
    - each Embedding becomes a ttf table keyed by its ids, and a Hashing, IntegerLookup or
      StringLookup feeding only Embeddings is dropped: the table keys the raw id (ints) or
      a 64-bit hash of it (strings), so there is no vocabulary and no collision;
    - each nested functional or Sequential block holding Embeddings (TFRS' per-feature
      `Sequential([StringLookup, Embedding])`) is converted the same way, as a model of its own;
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
        return Subclassed(model, set(keep), sample, table_rows).run()
    return Converter(model, graph, set(keep), table_rows=table_rows).run()
