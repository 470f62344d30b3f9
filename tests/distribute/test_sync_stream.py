"""Online training on SyncWorkers (`start_all.sh --sync --workers 2`: 2 workers on TensorFlow's
collectives, in start_all's private network namespace): each worker reads its own share of a
folder stream and the workers step together; SIGTERM to one worker stops both; the shares'
positions go into one checkpoint. The Horovod ranks run the same mechanics (ttf/distribute/
_ranks.py); tests/distribute/test_horovod_stream.py runs a Kafka stream on them."""
import os
import subprocess
import sys

import pytest

import ttf
from tests.jobs import journal, stop, wait_for
from ttf.data import ID_SHIFT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
pytestmark = pytest.mark.slow


def sync_job(tmp_path, run, stream, workers=2):
    """start_all.sh --sync --stream on `workers` workers; returns (Popen, log path)."""
    log = tmp_path / f"run{run}.log"
    command = [os.path.join(ROOT, "start_all.sh"), "--sync", "--workers", str(workers), "--tiacc", "--fm",
               "--stream", stream, "--stream-poll", "0.2", "--batch-size", "64", "--precision", "fp32",
               "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "6",
               "--stream-journal", str(tmp_path / f"journal{run}"), "--", "--log-every", "5", "--embedding-dim", "4"]
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=ENV), log


def test_folder_stream_on_two_sync_workers_stops_together_and_refuses_another_worker_count(tmp_path):
    """2 workers read a folder (files by name over the workers; one worker's share runs dry
    first and it steps on empty batches until the other's does too); SIGTERM to one worker stops
    both at one step, with a checkpoint holding both shares' positions. One process is then
    refused, naming both counts. (Resuming each share exactly from the merged position: the quick
    tests/data/test_streams.py::test_folder_shares_merge_into_one_checkpoint_and_resume_exactly.)"""
    incoming = tmp_path / "in"
    incoming.mkdir()
    ttf.data.write_synthetic_criteo(str(tmp_path / "rows.tsv"), 1500, seed=5)
    lines = (tmp_path / "rows.tsv").read_text().splitlines()
    for index in range(5):
        tmp = incoming / f".part-{index:03d}"
        tmp.write_text("".join(line + "\n" for line in lines[index * 300:(index + 1) * 300]))
        tmp.rename(incoming / f"part-{index:03d}")
    first, log1 = sync_job(tmp_path, 1, f"folder:{incoming}")
    try:
        wait_for(lambda: sum(len(ids) for _, ids in journal(tmp_path, 1)) >= 1500, "run 1 to read every file",
                 first, log1)
        stop(first, log1)
    finally:
        if first.poll() is None:
            first.kill()
    ids = [i for _, ids in journal(tmp_path, 1) for i in ids]
    assert len(ids) == len(set(ids)) == 1500
    # Ids: file number = the share's own file sequence x 2 + share: both shares' files are there.
    assert {(i >> ID_SHIFT) % 2 for i in ids} == {0, 1}
    second = subprocess.run([sys.executable, os.path.join(ROOT, "models", "train.py"), "--tiacc", "--model", "fm",
                             "--stream", f"folder:{incoming}", "--checkpoint-dir", str(tmp_path / "ckpt"),
                             "--embedding-dim", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert "written by a job of 2 share(s) (ranks), this job reads it in 1" in second.stderr
