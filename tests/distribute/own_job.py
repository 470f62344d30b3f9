"""A user's own script on ttf.distribute.Job: their 10-line functional model, their loss, no
models/ or CLI. The library tests run it as a user would (a fresh process, killed and
restarted, as the chief of a parameter-server job), on whichever Keras the env selects.

    python own_job.py fit DATA --checkpoint-dir D [--epochs 1 | --steps N] [--ps-hosts .. --worker-hosts .. --chief-host ..]
    python own_job.py follow folder:DIR --checkpoint-dir D --journal F [--publish BASE]
    ... [--sync-hosts H:P,H:P --task-index I]   one worker of a synchronous job (TF collectives)

Prints one JSON line of the job's numbers at the end.
"""
import argparse
import hashlib
import json
import os
import sys

import ttf
import tensorflow as tf


def own_model():
    """The user's model: one fused table for the 26 fields, dense features beside it, logits out."""
    ids = tf.keras.Input([26], dtype=tf.int64, name="ids")
    dense = tf.keras.Input([13], name="dense")
    rows = ttf.FusedEmbedding(8, num_fields=26)(ids)
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(rows), dense])
    x = tf.keras.layers.Dense(32, activation="relu", name="hidden")(x)
    return tf.keras.Model({"ids": ids, "dense": dense}, tf.keras.layers.Dense(1, name="logit")(x))


class OwnSubclassed(tf.keras.Model):
    """The same model subclassed, with a second table for 4 fields' ids folded into 97 values
    and, with dropout, a Dropout layer (its call then changes state)."""

    def __init__(self, dropout=False, ragged=False):
        super().__init__(name="own_subclassed")
        self.fields = ttf.FusedEmbedding(8, num_fields=26, name="fields")
        self.folded = ttf.DynamicEmbedding(4, name="folded", combiner="mean" if ragged else None)
        self.ragged = ragged
        self.flatten = tf.keras.layers.Flatten()
        self.hidden = tf.keras.layers.Dense(32, activation="relu", name="hidden")
        self.logit = tf.keras.layers.Dense(1, name="logit")
        self.dropout = tf.keras.layers.Dropout(0.5) if dropout else None

    def call(self, features, training=False):
        ids = features["ids"]
        x = tf.concat([self.flatten(self.fields(ids, training=training)),
                       self.flatten(self.folded(self.folded_ids(ids), training=training)), features["dense"]], axis=1)
        x = self.hidden(x)
        if self.dropout is not None:
            x = self.dropout(x, training=training)
        return self.logit(x)

    def folded_ids(self, ids):
        """4 fields' ids folded into 97 values; ragged: a bag of those that are not 0 (a mean)."""
        folded = ids[:, :4] % 97
        return tf.RaggedTensor.from_tensor(folded, padding=0) if self.ragged else folded


def add_topology_flags(parser):
    """The flags that pick the topology (topology_of)."""
    parser.add_argument("--ps-hosts")
    parser.add_argument("--worker-hosts")
    parser.add_argument("--chief-host")
    parser.add_argument("--sync-hosts")
    parser.add_argument("--task-index", type=int)


def topology_of(args):
    """The user's topology: one synchronous worker, the chief of a parameter-server cluster (by
    flags or TF_CONFIG), or one process."""
    if args.sync_hosts:  # made before the model: TensorFlow renames the devices for collectives
        return ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts=args.sync_hosts, task_type="worker",
                                                                 task_index=args.task_index))
    if args.ps_hosts:
        return ttf.distribute.ParameterServers(
            ttf.distribute.Cluster(args.ps_hosts, args.worker_hosts, args.chief_host, "chief"))
    if os.environ.get("TF_CONFIG"):  # the chief of a cluster TF_CONFIG names (start_all.sh --script)
        return ttf.distribute.ParameterServers()  # TF_CONFIG
    return ttf.distribute.OneProcess()


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["fit", "follow"])
    p.add_argument("source")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--steps", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--journal")
    p.add_argument("--publish")
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--model", choices=["functional", "subclassed", "dropout", "ragged"], default="functional",
                   help="own_model(), or OwnSubclassed (dropout: with a Dropout layer; ragged: a bag of ids)")
    p.add_argument("--seed", type=int, help="the dense layers' initial weights (default: random)")
    add_topology_flags(p)
    args = p.parse_args(argv)
    topology = topology_of(args)
    if args.seed is not None:
        tf.keras.utils.set_random_seed(args.seed)
    with topology.scope():
        model = own_model() if args.model == "functional" else OwnSubclassed(dropout=args.model == "dropout",
                                                                                  ragged=args.model == "ragged")
        optimizer = ttf.optimizers.Adam(args.learning_rate)
    config = ttf.distribute.JobConfig(
        batch_size=args.batch_size, steps=args.steps, epochs=args.epochs, log_every=10,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, journal=args.journal,
        publish=ttf.distribute.PublishConfig(args.publish, every=0.5) if args.publish else None,
        pipeline=args.pipeline)
    job = ttf.distribute.Job(model, optimizer, topology=topology, config=config)
    if args.mode == "fit":
        result = job.fit(ttf.data.Reader([args.source], "criteo"))
        result.update(job.evaluate(ttf.data.Reader([args.source], "criteo")))
        result["examples_trained"] = job.examples_trained()[0]
    else:
        result = job.follow(args.source, schema="criteo", poll_seconds=0.2)
    result["table_summary"] = job.table_summary()
    result["dense_digest"] = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights
                                                     if ttf.embedding.embedding_of(v) is None)).hexdigest()
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
