"""What a user does by mistake with ttf.distribute.Job, run as the user would: each is one
line (the exception type and its message checked) raised before training, with nothing
written, or a warning and correct training. No silent damage (issue 46)."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.distribute.own_job import own_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "criteo_sample.txt")


def one_line(error):
    message = str(error.value)
    assert "\n" not in message, message
    return message


def model_of(hidden=32, cross=0, sigmoid=False, tables=True, outputs=1, as_dict=False):
    """Variants of the user's model: another hidden width, extra layers, a sigmoid output, no
    ttf table, two outputs or a dict of outputs."""
    ids, dense = tf.keras.Input([26], dtype=tf.int64, name="ids"), tf.keras.Input([13], name="dense")
    parts = [dense]
    if tables:
        parts.append(tf.keras.layers.Flatten()(ttf.FusedEmbedding(8, num_fields=26)(ids)))
    x = tf.keras.layers.Concatenate()(parts) if len(parts) > 1 else dense
    x = tf.keras.layers.Dense(hidden, activation="relu", name="hidden")(x)
    for i in range(cross):
        x = tf.keras.layers.Dense(hidden, name=f"cross_{i}")(x)
    out = tf.keras.layers.Dense(outputs, activation="sigmoid" if sigmoid else None, name="logit")(x)
    return tf.keras.Model({"ids": ids, "dense": dense}, {"logit": out} if as_dict else out)


def job_of(model, checkpoint_dir=None, optimizer=None, **config):
    config.setdefault("steps", 4)
    return ttf.distribute.Job(model, optimizer or ttf.optimizers.Adam(1e-3), log=lambda m: None,
                              config=ttf.distribute.JobConfig(batch_size=32, checkpoint_dir=checkpoint_dir,
                                                              checkpoint_every=2, **config))


def folder_state(path):
    return sorted((name, os.path.getmtime(os.path.join(path, name))) for name in os.listdir(path))


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A checkpoint folder of the user's model at step 4."""
    path = str(tmp_path_factory.mktemp("ck"))
    job_of(model_of(cross=2), path).fit(ttf.data.Reader([SAMPLE]))
    return path


# The first difference in path order (Keras 2 and 3 name the paths differently): its layer and shapes.
@pytest.mark.parametrize("other, difference", [
    (dict(cross=3), r"\((logit|cross_2)/(kernel|bias)\)"),
    (dict(cross=1), r"\((cross_1|logit)/(kernel|bias)\) is \[(32, )?(32|1)\] float32 in the checkpoint"),
    (dict(cross=2, hidden=16), r"\(hidden/(kernel|bias)\) is \[(221, )?32\] float32 in the checkpoint, "
                               r"\[(221, )?16\] float32 in this model"),
    (dict(cross=2, tables=False), r"the checkpoint has a ttf table at \S+ \(fused_embedding"),
])
def test_a_checkpoint_of_another_model_is_refused_and_left_alone(trained_dir, other, difference):
    before = folder_state(trained_dir)
    job = job_of(model_of(**other), trained_dir)
    with pytest.raises(ValueError, match="holds a checkpoint of another model") as error:
        job.fit(ttf.data.Reader([SAMPLE]))
    message = one_line(error)
    assert trained_dir in message and "resume='warm_start'" in message
    assert __import__("re").search(difference, message), message
    assert folder_state(trained_dir) == before  # nothing written


def test_the_same_model_resumes(trained_dir):
    job = job_of(model_of(cross=2), trained_dir, steps=6)
    assert job.fit(ttf.data.Reader([SAMPLE]))["steps_run"] == 2


def test_warm_start_takes_the_matching_parts_and_starts_at_step_0(trained_dir, tmp_path):
    import shutil
    folder = str(tmp_path / "copy")
    shutil.copytree(trained_dir, folder)
    logged = []
    job = ttf.distribute.Job(model_of(cross=3), ttf.optimizers.Adam(1e-3), log=logged.append,
                             config=ttf.distribute.JobConfig(batch_size=32, steps=2, checkpoint_dir=folder,
                                                             resume="warm_start"))
    old = tf.train.load_checkpoint(tf.train.latest_checkpoint(folder))
    result = job.fit(ttf.data.Reader([SAMPLE]))
    assert result["steps_run"] == 2 and result["steps"] == 2  # from step 0
    assert any("warm start: hidden/kernel" in line for line in logged), logged
    left = [line for line in logged if "2 part(s) of this model left at their initial values" in line]
    assert left and "cross_2/bias" in left[0] and "cross_2/kernel" in left[0], logged
    table_rows = job.table_summary()[0]
    assert table_rows >= 200  # the old table's rows came over (200 sample rows' ids, then 2 steps more)
    fresh = job_of(model_of(cross=3), str(tmp_path / "fresh"), steps=2)
    fresh.fit(ttf.data.Reader([SAMPLE]))
    assert fresh.table_summary()[0] < table_rows
    del old


@pytest.mark.parametrize("variant, expected", [
    (dict(sigmoid=True), "output comes from a sigmoid"),
    (dict(outputs=2), "returns shape \\[2, 2\\] for a batch of 2"),
    (dict(as_dict=True), "returns a dict \\['logit'\\]"),
])
def test_the_model_output_is_checked_once_at_setup(variant, expected, tmp_path):
    job = job_of(model_of(**variant), str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=expected) as error:
        job.fit(ttf.data.Reader([SAMPLE]))
    assert "one logit per example" in one_line(error)
    assert not os.path.exists(tmp_path / "ck") or not os.listdir(tmp_path / "ck")


def test_a_stock_keras_optimizer_becomes_its_ttf_twin_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = job_of(model_of(), optimizer=tf.keras.optimizers.Adam(1e-3))
    assert any("training with ttf.optimizers.Adam" in str(w.message) for w in caught)
    assert job.fit(ttf.data.Reader([SAMPLE]))["steps_run"] == 4
    with pytest.raises(ValueError, match="RMSprop") as error:
        job_of(model_of(), optimizer=tf.keras.optimizers.RMSprop(1e-3))
    assert "give one of them" in one_line(error)


def test_follow_without_the_stream_schema_says_so(tmp_path):
    ids, dense = tf.keras.Input([3], dtype=tf.int64, name="ids"), tf.keras.Input([2], name="dense")
    x = tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=3)(ids))
    model = tf.keras.Model({"ids": ids, "dense": dense},
                           tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Concatenate()([x, dense])))
    job = job_of(model, steps=None)
    with pytest.raises(ValueError, match="default schema 'criteo' \\(give follow\\(schema=...\\)") as error:
        job.follow(f"folder:{tmp_path}", poll_seconds=0.1)
    one_line(error)


def test_relative_checkpoint_dir_is_made_absolute_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = job_of(model_of(), "relative_ck", publish=ttf.distribute.PublishConfig("serving"))
    assert job.config.checkpoint_dir == str(tmp_path / "relative_ck")
    assert job.config.publish.base == str(tmp_path / "serving")


def test_sync_workers_made_after_the_model_is_one_line():
    script = ("import tensorflow as tf, ttf\n"
              "tf.Variable(1.0)\n"
              "ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts='localhost:1,localhost:2', task_type='worker', task_index=0))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: make the synchronous topology") and "before any TensorFlow" in last, \
        proc.stderr[-2000:]
    np.testing.assert_equal(len(proc.stderr.split("Traceback")), 2)  # one traceback, ours


def sample_lines(n):
    lines = open(SAMPLE).read().splitlines()[1:]  # after its header
    return [lines[i % len(lines)] for i in range(n)]


def test_skipped_stream_input_is_counted_in_the_result_and_the_progress_line(tmp_path):
    """A lenient stream: its bad lines and an empty file are counted, in follow()'s result
    and the progress line; nothing is dropped without a number."""
    folder = tmp_path / "stream"
    folder.mkdir()
    good = sample_lines(80)
    (folder / "a.tsv").write_text("\n".join(good[:40] + ["not a criteo line"] * 3) + "\n")
    (folder / "b.tsv").write_text("")
    (folder / "c.tsv").write_text("\n".join(good[40:]) + "\n")
    logged = []
    job = ttf.distribute.Job(model_of(), ttf.optimizers.Adam(1e-3), log=logged.append,
                             config=ttf.distribute.JobConfig(batch_size=30, steps=3, log_every=1))
    result = job.follow(f"folder:{folder}", schema="criteo", strict=False, poll_seconds=0.1)
    assert (result["bad_lines"], result["empty_files"], result["examples_trained"]) == (3, 1, 80)
    assert any("3 bad line(s) skipped, 1 empty file(s) skipped" in line for line in logged), logged


def test_input_that_went_bad_stops_the_job(tmp_path):
    path = tmp_path / "bad.tsv"
    lines = sample_lines(1200)
    for i in range(0, 1200, 6):
        lines[i] = "garbage"  # 200 of 1,200: 16.7% > max_bad_fraction 0.1
    path.write_text("\n".join(lines) + "\n")
    job = job_of(model_of(), steps=None, epochs=1, log_every=5)
    with pytest.raises(ttf.distribute.BadInputError, match="over max_bad_fraction=0.1") as error:
        job.fit(ttf.data.Reader([str(path)], strict=False))
    one_line(error)
    lenient = job_of(model_of(), steps=None, epochs=1, max_bad_fraction=0.5)
    assert lenient.fit(ttf.data.Reader([str(path)], strict=False))["bad_lines"] == 200
