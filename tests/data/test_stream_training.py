"""Exactly-once online training: `models/train.py --stream` killed with kill -9 mid-stream and
restarted, on a folder and on a Kafka topic (mock cluster, a broker outage mid-stream).

The invariant tested: let S be the step of the checkpoint the second run resumes from
(its "resumed ... at step S" line). The examples trained by run 1's steps 1..S (its
journal) plus every example trained by run 2 are every example of the stream, each
exactly once. Run 1's steps after S are not counted: their updates were lost with the
process (the model was rolled back to step S with the position), so training them again
is training them once. Ids come from the stream (ttf.data.ID_SHIFT: file or partition,
line or offset), written by --stream-journal.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import ttf
from tests.jobs import journal, wait_for
from ttf.data import ID_SHIFT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def trainer(stream, tmp_path, run, extra=()):
    log = open(tmp_path / f"run{run}.log", "w", encoding="utf-8")
    command = [sys.executable, os.path.join(ROOT, "models", "train.py"), "--tiacc", "--model", "fm",
               "--stream", stream, "--stream-poll", "0.2", "--batch-size", "128", "--log-every", "5", "--precision", "fp32",
               "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "6", "--embedding-dim", "4",
               "--stream-journal", str(tmp_path / f"journal{run}"), *extra]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), tmp_path / f"run{run}.log"


def kill_and_resume(tmp_path, stream, expected, produce_more, outage=None):
    """Run 1 until it has checkpointed and trained past it, kill -9; more data arrives; run 2
    to the end of the stream, SIGTERM. Checks the invariant; returns run 2's log."""
    first, _ = trainer(stream, tmp_path, 1)
    try:
        if outage:
            outage(first, tmp_path / "run1.log")
        wait_for(lambda: len(journal(tmp_path, 1)) >= 8 and any(tmp_path.glob("ckpt/*.index")),
                 "run 1 to checkpoint and train on")
    finally:
        first.kill()  # SIGKILL: no handler, no final checkpoint
        first.wait()
    produce_more()
    second, log2 = trainer(stream, tmp_path, 2)
    try:
        total = lambda: sum(len(ids) for _, ids in journal(tmp_path, 2))  # noqa: E731
        resumed = lambda: re.search(r"resumed from \S+ at step (\d+)", log2.read_text())  # noqa: E731
        wait_for(lambda: resumed() is not None and
                 total() + sum(len(ids) for s, ids in journal(tmp_path, 1) if s <= int(resumed().group(1)))
                 >= len(expected), "run 2 to reach the end of the stream")
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log2.read_text()
    finally:
        if second.poll() is None:
            second.kill()
    text = log2.read_text()
    step = int(resumed().group(1))
    trained = [i for s, ids in journal(tmp_path, 1) if s <= step for i in ids] + \
              [i for _, ids in journal(tmp_path, 2) for i in ids]
    assert sorted(trained) == sorted(expected)  # every example once: none lost, none twice
    assert step > 0  # run 2 resumed from a checkpoint of run 1, not from the start
    assert re.search(r"\[train\] stopped by SIGTERM after step \d+ \(\d+ examples trained\); checkpoint \S+ "
                     r"holds the model and the stream position; exiting 0", text), text
    assert re.search(r"examples/s, lag [\d.]+ s", text), text
    return text


def write_rows(path, rows, seed):
    ttf.data.write_synthetic_criteo(str(path), rows, seed=seed)
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_folder_stream_kill_9_resumes_exactly_once(tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    lines = write_rows(tmp_path / "rows.tsv", 2400, seed=1)

    def drop(index):
        tmp = incoming / f".part-{index:03d}"
        tmp.write_text("".join(line + "\n" for line in lines[index * 400:(index + 1) * 400]))
        tmp.rename(incoming / f"part-{index:03d}")

    for index in range(4):
        drop(index)
    expected = [(f << ID_SHIFT) | n for f in range(6) for n in range(1, 401)]
    text = kill_and_resume(tmp_path, f"folder:{incoming}", expected, lambda: [drop(i) for i in range(4, 6)])
    assert "bytes" in text


def test_kafka_stream_kill_9_and_broker_outage_exactly_once(tmp_path):
    kafka_mock = pytest.importorskip("kafka_mock", reason="confluent-kafka is not installed")
    cluster = kafka_mock.MockKafkaCluster(3)
    try:
        cluster.create_topic("clicks", 3)
        lines = write_rows(tmp_path / "rows.tsv", 2400, seed=2)
        kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[:1600], 3)

        def outage(process, log):
            # A broker down mid-stream: its partition stalls; the trainer reads the others, waits, resumes.
            wait_for(lambda: len(journal(tmp_path, 1)) >= 3, "run 1 to start training")
            cluster.broker_down(1)
            time.sleep(4)
            assert process.poll() is None, log.read_text()  # waiting, not crashed
            cluster.broker_up(1)

        # Line i went to partition i % 3 at offset i // 3 (the later lines continue the count).
        expected = [((i % 3) << ID_SHIFT) | (i // 3) for i in range(2400)]
        kill_and_resume(tmp_path, f"kafka:{cluster.bootstrap}/clicks", expected,
                        lambda: kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[1600:], 3,
                                                         first_index=1600), outage=outage)
    finally:
        cluster.close()


def test_parameter_server_stream_job_trains_each_example_once_and_stops_on_sigterm(tmp_path):
    """A local PS cluster (start_all.sh: 1 ps, 2 workers, the chief reading the stream): every
    example trained once, SIGTERM to start_all makes the chief checkpoint and exit 0."""
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    lines = write_rows(tmp_path / "rows.tsv", 1200, seed=3)
    for index in range(3):
        (incoming / f"part-{index}").write_text("".join(line + "\n" for line in lines[index * 400:(index + 1) * 400]))
    log = tmp_path / "job.log"
    job = subprocess.Popen([os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", "--no-isolation", "--stream",
                            f"folder:{incoming}", "--batch-size", "128", "--checkpoint-dir", str(tmp_path / "ckpt"),
                            "--checkpoint-every", "4", "--", "--stream-poll", "0.2", "--log-every", "4",
                            "--precision", "fp32", "--embedding-dim", "4", "--stream-journal", str(tmp_path / "journal1")],
                           cwd=ROOT, stdout=open(log, "w", encoding="utf-8"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: sum(len(ids) for _, ids in journal(tmp_path, 1)) >= 1200, "the job to train the stream",
                 seconds=240)
        job.send_signal(signal.SIGTERM)
        assert job.wait(90) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
    trained = [i for _, ids in journal(tmp_path, 1) for i in ids]
    assert sorted(trained) == [(f << ID_SHIFT) | n for f in range(3) for n in range(1, 401)]
    text = log.read_text()
    assert re.search(r"\[train\] stopped by SIGTERM after step \d+ \(1200 examples trained\); checkpoint", text), text
