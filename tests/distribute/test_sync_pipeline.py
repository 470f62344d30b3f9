"""JobConfig(pipeline=True) on 2 SyncWorkers (TensorFlow's collectives on loopback): batch
N+1's ids are routed while batch N trains, and the job computes exactly what the
un-pipelined one does, across an epoch's end, its short last batch and a resume from a
checkpoint taken while the next batch's ids were already routed. Misuse is one line."""
import json
import subprocess
import sys

import pytest

import ttf
from tests.distribute.test_job import OWN_JOB, ROOT, make_job, rows  # noqa: F401 (rows: a fixture)


def sync_workers(*args):
    """own_job.py on 2 SyncWorkers, the same initial weights every run: (exit codes, outputs)."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ttf.distribute.free_ports(2))
    workers = [subprocess.Popen([sys.executable, OWN_JOB, *args, "--seed", "1", "--sync-hosts", hosts, "--task-index", str(i)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(2)]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    return [w.returncode for w in workers], outs


def sync_job(*args):
    """own_job.py on 2 SyncWorkers; returns worker 0's result (the workers agree: checked)."""
    codes, outs = sync_workers(*args)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    first, second = (json.loads(out.split("RESULT ")[-1]) for out in outs)
    assert first["dense_digest"] == second["dense_digest"] and first["table_summary"] == second["table_summary"]
    return first


@pytest.mark.slow
def test_pipelined_steps_train_what_unpipelined_ones_do_across_an_epoch_end_and_a_resume(rows, tmp_path):  # noqa: F811
    """One epoch of 3,000 rows, 64 per worker and step (each share ends on a short batch):
    un-pipelined, and pipelined in two runs, stopped at step 10 (batch 11's ids already
    routed, never trained) and resumed from that checkpoint in fresh processes. The same
    weights to the bit, every row trained once."""
    plain = sync_job("fit", rows, "--epochs", "1")
    ck = str(tmp_path / "ck")
    part = sync_job("fit", rows, "--steps", "10", "--checkpoint-dir", ck, "--pipeline")
    assert part["steps"] == 10
    rest = sync_job("fit", rows, "--epochs", "1", "--checkpoint-dir", ck, "--pipeline")
    assert rest["steps_run"] == plain["steps"] - 10 and rest["steps"] == plain["steps"]
    assert rest["examples_trained"] == plain["examples_trained"] == 3000
    assert rest["table_summary"][:2] == plain["table_summary"][:2]  # the same ids
    # The rows' sum runs in the table's storage order, which a restore changes (the rows are
    # the same: the ids' checksum and the dense weights after them are bit-identical)
    assert rest["table_summary"][2] == pytest.approx(plain["table_summary"][2], rel=1e-12)
    assert rest["dense_digest"] == plain["dense_digest"]
    assert rest["auc"] == plain["auc"]


@pytest.mark.slow  # three 2-worker jobs (about 90 s on a quiet host)
def test_a_subclassed_model_pipelines_to_the_bit_and_one_whose_call_changes_state_is_one_line(rows):  # noqa: F811
    """A subclassed model of two tables (one of fields' ids, one of ragged bags of ids, whose
    rows come back through a routing traced with unknown sizes), whose ids are found by a pass of
    its call that records them: 8 pipelined steps train what 8 plain ones do, to the bit. With
    a Dropout in its call, that pass would draw random numbers: refused in one line."""
    plain = sync_job("fit", rows, "--steps", "8", "--model", "ragged")
    piped = sync_job("fit", rows, "--steps", "8", "--model", "ragged", "--pipeline")
    assert piped["steps"] == plain["steps"] == 8
    assert piped["dense_digest"] == plain["dense_digest"]
    assert piped["table_summary"] == plain["table_summary"]
    assert piped["auc"] == plain["auc"]
    codes, outs = sync_workers("fit", rows, "--steps", "2", "--model", "dropout", "--pipeline")
    assert codes[0] != 0
    assert ("ValueError: own_subclassed: its call changes state (" in outs[0] and "build it functionally (its ids "
            "then come from a sub-model), or drop pipeline" in outs[0]), outs[0][-3000:]


def test_pipeline_on_one_process_or_with_several_steps_per_call_is_one_line(rows):  # noqa: F811
    job = make_job(steps=2, pipeline=True)
    with pytest.raises(ValueError, match=r"^JobConfig\(pipeline=True\) overlaps the table exchange of a synchronous "
                                         r"job .*a single job has none: drop pipeline"):
        job.fit(ttf.data.Reader([rows], "criteo"))
    with pytest.raises(ValueError, match=r"pipeline=True runs one step per call.*give steps_per_call=1"):
        ttf.distribute.JobConfig(pipeline=True, steps_per_call=4)
    with pytest.raises(ValueError, match="JobConfig.pipeline must be True or False"):
        ttf.distribute.JobConfig(pipeline="yes")


@pytest.mark.slow  # two 2-worker CLI jobs (about 50 s each on a quiet host)
def test_the_cli_deepfm_pipelined_on_sync_workers_trains_what_the_plain_job_does(tmp_path):
    """The CLI's DeepFM, 40 steps on 2 SyncWorkers, plain and --pipeline: the same AUC, logloss
    and table to the bit. (The plain job once traced its step for the static batch size, and
    TensorFlow's graph passes then rounded it apart from the pipelined trace for any size.)"""
    metrics = {}
    for name, extra in (("plain", []), ("piped", ["--pipeline"])):
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([f"{ROOT}/start_all.sh", "--sync", "--tiacc", "--fm", "--steps", "40", "--",
                               "--metrics-out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        metrics[name] = json.loads(out.read_text())
    keys = ("steps", "examples_trained", "auc", "logloss", "table_size", "table_checksum", "table_value_sum")
    assert {k: metrics["piped"][k] for k in keys} == {k: metrics["plain"][k] for k in keys}
