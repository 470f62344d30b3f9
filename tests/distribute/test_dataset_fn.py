"""A user's own tf.data pipeline (`Job.fit(dataset_fn)`) on every topology: each input share
its pipeline, the position kept in the checkpoint (the iterator's state in one process, the
count of batches each share trained elsewhere), a resume that re-trains no batch, one line
where no position can be kept, and one line when the data runs out before `steps`.

Every example's field-0 id is MARKER + its row number, so the table's count of that id (the
steps that updated it: tests/distribute/dataset_fn_job.py) is how many times the row was
trained: 1 for every row means each was trained exactly once, none lost, none repeated."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.distribute.dataset_fn_job import MARKER, make_dataset_fn, parse, write
from tests.distribute.own_job import own_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS, BATCH = 320, 16


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("records") / "rows.tfrecord")
    write(path, ROWS)
    return path


class Crash(Exception):
    """A process dying mid-run: the job object and everything after its last checkpoint are lost."""


def make_job(logged, checkpoint_dir=None, crash_at=None, **config):
    with ttf.distribute.OneProcess().scope():
        model, optimizer = own_model(), ttf.optimizers.Adam(1e-3)

    def log(message):
        logged.append(message)
        if crash_at is not None and message.startswith(f"step {crash_at}:"):
            raise Crash(message)

    config = ttf.distribute.JobConfig(batch_size=BATCH, checkpoint_dir=checkpoint_dir, log_every=1, **config)
    return ttf.distribute.Job(model, optimizer, config=config, log=log)


def marker_counts(job):
    """{row: times trained} from the job's table (the count kept with every id)."""
    counts = {}
    for layer in ttf.embedding.tables_in(job.model):
        for table in layer.tables:
            export = table.export()
            keys, meta = export["keys"].numpy(), export["meta"].numpy()
            for key, count in zip(keys[keys >= MARKER], meta[keys >= MARKER, 0]):
                counts[int(key - MARKER)] = counts.get(int(key - MARKER), 0) + int(count)
    return counts


def pipelines(records):
    """Deterministic pipelines of the same rows, and how a resume finds their place."""
    shuffled = make_dataset_fn(records, BATCH, seed=None)  # unseeded: the iterator's saved state keeps its order

    def sampled(context):  # a seeded random filter (stateful: TensorFlow cannot save it): the count keeps it
        kept = tf.data.TFRecordDataset(records).filter(lambda record: tf.random.uniform([], seed=3) < 2.0)
        return kept.shard(context.num_input_pipelines, context.input_pipeline_id).batch(BATCH).map(parse)

    return {"unseeded shuffle": (shuffled, "the iterator's saved state"),
            "seeded random filter": (sampled, "skipped"),
            "one Dataset": (shuffled(tf.distribute.InputContext()), "the iterator's saved state")}


@pytest.mark.parametrize("pipeline", ["unseeded shuffle", "seeded random filter", "one Dataset"])
def test_one_process_resumes_a_crashed_epoch_training_each_row_once(records, tmp_path, pipeline):
    """One epoch, checkpoints every 3 steps, the process lost at step 7 (after the checkpoint
    of step 6); a new job resumes and finishes the epoch: every row trained exactly once."""
    data, how = pipelines(records)[pipeline]
    ck, logged = str(tmp_path / "ck"), []
    with pytest.raises(Crash):
        make_job(logged, ck, crash_at=7, epochs=1, checkpoint_every=3).fit(data)
    assert not any("warning" in line for line in logged), logged
    job = make_job(logged, ck, epochs=1, checkpoint_every=3)
    result = job.fit(data)
    assert f"input position: {'dataset' if pipeline == 'one Dataset' else 'dataset_fn'} share(s) resume after 6 " \
           f"trained batch(es) ({how})" in logged, logged
    assert result["data_ran_out_at_step"] is None and result["steps"] == ROWS // BATCH
    counts = marker_counts(job)
    assert sorted(counts) == list(range(ROWS)) and set(counts.values()) == {1}, sorted(counts.items())[:20]
    assert job.examples_trained()[0] == ROWS
