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


def sync_job(*args):
    """own_job.py on 2 SyncWorkers, the same initial weights every run; returns worker 0's result
    (the workers agree: checked)."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ttf.distribute.free_ports(2))
    workers = [subprocess.Popen([sys.executable, OWN_JOB, *args, "--seed", "1", "--sync-hosts", hosts, "--task-index", str(i)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(2)]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
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


def test_pipeline_on_one_process_or_with_several_steps_per_call_is_one_line(rows):  # noqa: F811
    job = make_job(steps=2, pipeline=True)
    with pytest.raises(ValueError, match=r"^JobConfig\(pipeline=True\) overlaps the table exchange of a synchronous "
                                         r"job .*a single job has none: drop pipeline"):
        job.fit(ttf.data.Reader([rows], "criteo"))
    with pytest.raises(ValueError, match=r"pipeline=True runs one step per call.*give steps_per_call=1"):
        ttf.distribute.JobConfig(pipeline=True, steps_per_call=4)
    with pytest.raises(ValueError, match="JobConfig.pipeline must be True or False"):
        ttf.distribute.JobConfig(pipeline="yes")
