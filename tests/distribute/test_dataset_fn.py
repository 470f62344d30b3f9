"""A user's own tf.data pipeline (`Job.fit(dataset_fn)`) on every topology: each input share
its pipeline, the position kept in the checkpoint (the iterator's state in one process, the
count of batches each share trained elsewhere), a resume that re-trains no batch, one line
where no position can be kept, and one line when the data runs out before `steps`.

Every example's field-0 id is MARKER + its row number, so the table's count of that id (the
steps that updated it: tests/distribute/dataset_fn_job.py) is how many times the row was
trained: 1 for every row means each was trained exactly once, none lost, none repeated."""
import json
import os
import re
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


def test_the_data_running_out_before_steps_is_one_line_and_epochs_repeat_the_pipeline(records):
    """steps=8 on a pipeline of 4 batches stops at step 4 saying so (the warning line and
    fit()'s data_ran_out_at_step); epochs=2 trains every row twice."""
    four_batches = tf.data.TFRecordDataset(records).take(4 * BATCH).batch(BATCH).map(parse)
    logged = []
    result = make_job(logged, steps=8).fit(four_batches)
    assert result["steps"] == 4 and result["data_ran_out_at_step"] == 4
    ran_out = [line for line in logged if "ran out" in line]
    assert ran_out == ["warning: the data ran out at step 4 before steps=8: give more data (or repeat() it), or "
                       "fewer steps"], logged
    job = make_job(logged, epochs=2)
    result = job.fit(lambda context: four_batches)
    assert result["steps"] == 8 and result["data_ran_out_at_step"] is None
    assert marker_counts(job) == {row: 2 for row in range(4 * BATCH)}


def test_a_pipeline_whose_position_cannot_be_kept_says_so_once_at_start(records, tmp_path):
    """Python in the pipeline (from_generator): TensorFlow cannot save its iterator and ttf
    cannot know it yields the same batches again, so the job says so in one line, before
    the first step; each input pipeline is told its place (InputContext)."""
    contexts = []

    def dataset_fn(context):
        contexts.append((context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync))
        batches = list(tf.data.TFRecordDataset(records).take(3 * BATCH).batch(BATCH).map(parse))
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batches[0])
        return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=signature)

    logged = []
    make_job(logged, str(tmp_path / "ck"), steps=3).fit(dataset_fn)
    warnings = [i for i, line in enumerate(logged) if line.startswith("warning: the input position cannot be kept")]
    first_step = next(i for i, line in enumerate(logged) if line.startswith("step"))
    assert len(warnings) == 1 and warnings[0] < first_step, logged
    assert "runs Python (tf.py_function, tf.numpy_function or Dataset.from_generator)" in logged[warnings[0]]
    assert "build it from tf.data ops" in logged[warnings[0]]
    assert set(contexts) == {(1, 0, 1)}
    logged.clear()  # without a checkpoint nothing is kept anyway: no notice
    make_job(logged, steps=3).fit(dataset_fn)
    assert not any("warning" in line for line in logged), logged


PIPELINES = {
    "shuffle": (lambda d: d.shuffle(64), "shuffle"),
    "seeded shuffle": (lambda d: d.shuffle(64, seed=1), None),
    "unordered map": (lambda d: d.map(lambda r: r, num_parallel_calls=2, deterministic=False), "parallel"),
    "parallel map": (lambda d: d.map(lambda r: r, num_parallel_calls=2), None),
    "unordered options": (lambda d: d.with_options(_options(deterministic=False)), "parallel"),
    "random filter": (lambda d: d.filter(lambda r: tf.random.uniform([]) < 0.5), "random"),
    "seeded random filter": (lambda d: d.filter(lambda r: tf.random.uniform([], seed=4) < 0.5), None),
    "py_function": (lambda d: d.map(lambda r: tf.py_function(lambda x: x, [r], tf.string)), "python"),
    "sample": (lambda d: tf.data.Dataset.sample_from_datasets([d, d]), "shuffle"),
    "seeded sample": (lambda d: tf.data.Dataset.sample_from_datasets([d, d], seed=2), None),
    "shuffle in interleave": (lambda d: tf.data.Dataset.range(2).interleave(lambda i: d.shuffle(8)), "shuffle"),
}


@pytest.mark.parametrize("make, kind", PIPELINES.values(), ids=PIPELINES.keys())
def test_what_makes_a_pipeline_yield_other_batches_when_made_again(records, make, kind):
    """The pipeline's graph read for what changes its batches from one making to the next."""
    found = ttf.distribute.job._user_data.nondeterminism(make(tf.data.TFRecordDataset(records)))
    assert (found and found[0]) == kind, found


def _options(**fields):
    options = tf.data.Options()
    for name, value in fields.items():
        setattr(options, name, value)
    return options


def test_what_fit_refuses_in_a_pipeline(records):
    logged = []
    with pytest.raises(ValueError, match=r"dataset_fn must return a tf.data.Dataset of \(features, labels\) batches, "
                                         "got list"):
        make_job(logged, steps=2).fit(lambda context: [1, 2])
    with pytest.raises(ValueError, match=r"the dataset_fn's elements must be \(features, labels\) batches"):
        make_job(logged, steps=2).fit(lambda context: tf.data.TFRecordDataset(records).batch(4))


@pytest.mark.slow
def test_own_dataset_fn_on_two_parameter_server_workers_resumes_after_kill_9_training_each_row_once(tmp_path):
    """The target (issue 48): a user's dataset_fn (TFRecord shards, a seeded shuffle) trains a
    real PS job (1 ps, 2 workers over gRPC on loopback), each worker its own input pipeline;
    the chief is killed (kill -9) past its first checkpoints, mid-epoch, and started again on
    the same servers: it resumes each share after the batches its checkpoint recorded, and the
    epoch ends with every row trained exactly once (none lost, none twice), by the table's
    count of each row's marker id in the last checkpoint."""
    rows, records = 1200, str(tmp_path / "rows.tfrecord")
    write(records, rows)
    ps, w0, w1, chief = (f"127.0.0.1:{port}" for port in ttf.distribute.free_ports(4))
    hosts = ["--ps-hosts", ps, "--worker-hosts", f"{w0},{w1}", "--chief-host", chief]
    servers = [subprocess.Popen([sys.executable, "-m", "ttf.launch.server", "--job", role, "--index", str(i),
                                 *hosts], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role, i in (("ps", 0), ("worker", 0), ("worker", 1))]
    ck = tmp_path / "ck"
    command = [sys.executable, "-m", "tests.distribute.dataset_fn_job", "fit", records, "--epochs", "1",
               "--checkpoint-dir", str(ck), "--checkpoint-every", "8", "--log-every", "2", *hosts]
    logs = [tmp_path / "chief0.log", tmp_path / "chief1.log"]
    try:
        first = subprocess.Popen(command, cwd=ROOT, stdout=open(logs[0], "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while not re.search(r"\] step (1\d|[2-9]\d):", logs[0].read_text()) and first.poll() is None \
                and time.time() < deadline:
            time.sleep(0.05)  # past the checkpoint of step 8, mid-epoch (38 batches)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert first.returncode == -signal.SIGKILL, logs[0].read_text()[-3000:]
        second = subprocess.run(command, cwd=ROOT, stdout=open(logs[1], "w"), stderr=subprocess.STDOUT, timeout=600)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    out = logs[1].read_text()
    assert second.returncode == 0, out[-3000:]
    result = json.loads(out.split("RESULT ")[-1])
    assert result["examples_trained"] == rows and result["data_ran_out_at_step"] is None, result
    resumed = [line for line in out.splitlines() if "dataset_fn share(s) resume after" in line]
    assert len(resumed) == 1 and "(skipped)" in resumed[0], out[-3000:]
    trained = [int(n) for n in resumed[0].split("resume after ")[1].split(" trained")[0].split(", ")]
    assert len(trained) == 2 and all(n > 0 for n in trained), resumed  # each worker read its own share
    assert "warning" not in out, out[-3000:]
    counts = checkpoint_marker_counts(tf.train.latest_checkpoint(str(ck)))
    assert sorted(counts) == list(range(rows)) and set(counts.values()) == {1}, \
        {n: c for n, c in counts.items() if c != 1} or sorted(set(range(rows)) - set(counts))[:20]


def checkpoint_marker_counts(path):
    """{row: times trained} from the tables of checkpoint `path` (every shard's pieces, with
    each id's count: docs/checkpoints.md)."""
    reader = tf.train.load_checkpoint(path)
    keys = [n for n in reader.get_variable_to_shape_map() if "/ttf/src-" in n and n.endswith("/keys")]
    ids = np.concatenate([reader.get_tensor(n) for n in keys])
    meta = np.concatenate([reader.get_tensor(n[: -len("keys")] + "meta") for n in keys])
    marked = ids >= MARKER
    counts = {}
    for row, count in zip(ids[marked] - MARKER, meta[marked, 0]):
        counts[int(row)] = counts.get(int(row), 0) + int(count)
    return counts
