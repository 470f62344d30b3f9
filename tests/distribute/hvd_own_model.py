"""A user's own Keras model with ttf layers, trained under horovodrun (run by test_horovod.py):

    horovodrun --gloo -np 2 python tests/distribute/hvd_own_model.py OUT.json fit,tape GLOBAL_BATCH

Each rank trains on its slice of every global batch; a one-rank run trains on the whole
batch. Writes rank 0's predictions on fixed inputs and the table size over all ranks, so the
test can check that 2 ranks compute what 1 process computes; one model per mode (model.fit,
a GradientTape loop), one after the other in the same processes. The lines marked "Horovod:"
are all a user adds (as in docs/horovod.md).
"""
import json
import sys

import numpy as np

import ttf
import tensorflow as tf
import horovod.tensorflow as hvd  # Horovod:
import ttf.distribute.horovod as tdh  # Horovod:

out_path, modes, global_batch = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
hvd.init()  # Horovod:
coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
rank, size = hvd.rank(), hvd.size()
per_rank = global_batch // size


def make_model():
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    tags = tf.keras.Input([None], dtype=tf.int64, ragged=True, name="tags")
    # Three tables of three widths (as DeepFM's fields, a multi-hot bag and a linear part),
    # four calls: shard_tables groups them, so a step makes one alltoall per direction for all.
    fields = ttf.FusedEmbedding(8, num_fields=3, tag_fields=True, seed=1)(ids)
    bag = ttf.DynamicEmbedding(4, combiner="mean", seed=2)(tags)
    # The linear table is called twice (a shared layer), once on ids computed inside the model.
    linear_table = ttf.FusedEmbedding(1, num_fields=3, tag_fields=True, seed=5)
    linear = [tf.keras.layers.Flatten()(linear_table(x)) for x in (ids, tf.reverse(ids, [1]) + 7)]
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(fields), bag, *linear])
    x = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(x)
    out = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(4))(x)
    return tf.keras.Model([ids, tags], out)


rng = np.random.default_rng(0)
steps = 12
ids = rng.integers(0, 50, size=(steps * global_batch, 3))
tag_lengths = rng.integers(1, 4, size=steps * global_batch)
tag_values = rng.integers(0, 200, size=int(tag_lengths.sum()))
labels = ((ids[:, 0] + ids[:, 1]) % 3 == 0).astype("float32")


def batch(step):
    """This rank's slice of global batch `step`."""
    lo = step * global_batch + rank * per_rank
    tags = tf.RaggedTensor.from_row_lengths(tag_values, tag_lengths)[lo:lo + per_rank]
    return (tf.constant(ids[lo:lo + per_rank]), tags), tf.constant(labels[lo:lo + per_rank])


def train(mode):
    """Trains a new model in `mode`; returns what the test compares."""
    model = make_model()
    tdh.shard_tables(model, coll)  # Horovod: each id of every ttf table lives on one rank
    optimizer = tdh.DistributedOptimizer(ttf.optimizers.Adam(0.01), coll)  # Horovod: dense allreduce, table rows to owners
    model(batch(0)[0])  # builds the variables
    tdh.broadcast_variables(model.variables, coll)  # Horovod: rank 0's initial dense weights everywhere
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    alltoalls = None  # counted in the tape loop's graph
    if mode == "fit":
        model.compile(optimizer=optimizer, loss=loss_fn)

        def batches():
            for step in range(steps):
                yield batch(step)

        spec = ((tf.TensorSpec([None, 3], tf.int64), tf.RaggedTensorSpec([None, None], tf.int64, 1)),
                tf.TensorSpec([None], tf.float32))
        data = tf.data.Dataset.from_generator(batches, output_signature=spec)
        model.fit(data, epochs=1, verbose=0)
    else:
        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for step in range(steps):
            train_step(*batch(step))
        graph = train_step.get_concrete_function(*batch(0)).graph
        alltoalls = sorted(op.name for op in graph.get_operations() if op.type == "HorovodAlltoall")

    probe_ids = tf.constant(ids[:64])
    probe_tags = tf.RaggedTensor.from_row_lengths(tag_values, tag_lengths)[:64]
    predictions = model((probe_ids, probe_tags), training=False).numpy()[:, 0]  # every rank: lookups are collective
    table_size = tdh.table_size(model, coll)
    return {"predictions": predictions.tolist(), "table_size": table_size, "size": size,
            "iterations": int(optimizer.iterations.numpy()), "alltoalls": alltoalls}


results = {mode: train(mode) for mode in modes}
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(results, f)
