"""A user's own tf.data pipeline on ttf.distribute.Job, as a user's script: TFRecord files of
tf.train.Example (written by tf.io.TFRecordWriter) read by their own dataset_fn, each input
share (worker) its shard of the records, shuffled with a seed, batched and parsed. The tests
run it as a user would: a fresh process, the chief of a parameter-server job, killed and
restarted.

    python dataset_fn_job.py write FILE --rows N            the records: row r's field 0 holds MARKER + r
    python dataset_fn_job.py fit FILE --checkpoint-dir D [--epochs 1 | --steps N]
                             [--ps-hosts .. --worker-hosts .. --chief-host .. | --sync-hosts H:P,H:P --task-index I]
                             [--unseeded]

Prints one JSON line of the job's numbers at the end.
"""
import argparse
import json
import sys

import numpy as np
import tensorflow as tf

import ttf
from tests.distribute.own_job import add_topology_flags, own_model, topology_of

MARKER = 10**9  # row r's field-0 id: MARKER + r, so the table's count of that id is the times r was trained


def write(path, rows):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5000, size=(rows, 26))
    ids[:, 0] = MARKER + np.arange(rows)
    dense = rng.random((rows, 13)).astype(np.float32)
    labels = (ids[:, 1] % 3 == 0).astype(np.float32)
    with tf.io.TFRecordWriter(path) as writer:
        for r in range(rows):
            example = tf.train.Example(features=tf.train.Features(feature={
                "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids[r])),
                "dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense[r])),
                "label": tf.train.Feature(float_list=tf.train.FloatList(value=[labels[r]]))}))
            writer.write(example.SerializeToString())


def parse(records):
    """A batch of serialized tf.train.Example -> (features, labels), as the model takes them."""
    spec = {"ids": tf.io.FixedLenFeature([26], tf.int64), "dense": tf.io.FixedLenFeature([13], tf.float32),
            "label": tf.io.FixedLenFeature([1], tf.float32)}
    parsed = tf.io.parse_example(records, spec)
    return {"ids": parsed["ids"], "dense": parsed["dense"]}, tf.reshape(parsed["label"], [-1])


def make_dataset_fn(path, batch_size, seed):
    """The user's dataset_fn: each input pipeline its shard of the records, shuffled (seed
    None: without a seed), batched, parsed."""

    def dataset_fn(input_context):
        records = tf.data.TFRecordDataset(path).shard(input_context.num_input_pipelines,
                                                      input_context.input_pipeline_id)
        return records.shuffle(256, seed=seed).batch(batch_size).map(parse).prefetch(2)

    return dataset_fn


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["write", "fit"])
    p.add_argument("path")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--steps", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--unseeded", action="store_true", help="shuffle without a seed")
    add_topology_flags(p)
    args = p.parse_args(argv)
    if args.mode == "write":
        write(args.path, args.rows)
        return 0
    topology = topology_of(args)
    with topology.scope():
        model, optimizer = own_model(), ttf.optimizers.Adam(1e-3)
    config = ttf.distribute.JobConfig(batch_size=args.batch_size, steps=args.steps, epochs=args.epochs,
                                      log_every=args.log_every, checkpoint_dir=args.checkpoint_dir,
                                      checkpoint_every=args.checkpoint_every)
    job = ttf.distribute.Job(model, optimizer, topology=topology, config=config)
    result = job.fit(make_dataset_fn(args.path, args.batch_size, None if args.unseeded else 7))
    result["examples_trained"] = job.examples_trained()[0]
    result["table_summary"] = job.table_summary()
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
