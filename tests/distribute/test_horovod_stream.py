"""Online training on real Horovod (horovodrun --gloo, 2 ranks on this host): each rank reads
its own share of a stream and the ranks step together; each rank writes its own part of every
published delta (tdh.Publisher); the shares' positions go into one checkpoint.

Exactly once, as in tests/data/test_stream_training.py: with S the step of the checkpoint a run
resumes from, run 1's journal steps 1..S plus every step of the next run hold every example id
of the stream once (rank 0 writes each step's ids of every rank).
"""
import json
import os
import signal
import subprocess
import sys

import pytest

import ttf
from tests.distribute.test_horovod import horovod  # noqa: F401  (a fixture)
from tests.jobs import journal, ranks_of, resumed_step, stop, wait_for
from ttf.data import ID_SHIFT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
pytestmark = pytest.mark.slow


def job(tmp_path, run, stream, ranks, extra=()):
    """models/train.py --stream on `ranks` Horovod ranks (0: one plain process); returns (Popen, log path)."""
    log = tmp_path / f"run{run}.log"
    command = [sys.executable, os.path.join(ROOT, "models", "train.py"), "--tiacc", "--model", "fm",
               "--stream", stream, "--stream-poll", "0.2", "--batch-size", "64", "--log-every", "5",
               "--precision", "fp32", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "6",
               "--embedding-dim", "4", "--stream-journal", str(tmp_path / f"journal{run}"), *extra]
    if ranks:
        command = [HOROVODRUN, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", *command, "--horovod"]
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=ENV), log


def trained_once(tmp_path, runs, expected):
    """Run r's journal up to the step run r + 1 resumed from, then the last run's whole journal."""
    trained = []
    for (run, _), (_, next_log) in zip(runs[:-1], runs[1:]):
        step = resumed_step(next_log)
        assert step is not None and step > 0, next_log.read_text()[-3000:]
        trained += [i for s, ids in journal(tmp_path, run) if s <= step for i in ids]
    trained += [i for _, ids in journal(tmp_path, runs[-1][0]) for i in ids]
    assert len(trained) == len(expected) and sorted(trained) == sorted(expected)


def test_each_rank_publishes_its_own_rows_and_the_follower_equals_the_ranks(horovod, tmp_path):
    """tdh.Publisher on 2 ranks: rank r writes only the parts `sparse-r-*` (rank 0 the dense part
    and the manifest); a full disk on rank 1 alone pauses both ranks, the next publish resumes;
    base + 4 deltas (evictions included) serve every key's row bit for bit, and predictions
    equal the live model's."""
    proc = subprocess.run([HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
                           os.path.join(HERE, "hvd_publish.py"), str(tmp_path / "pub"), str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(2)]
    for rank, found in enumerate(ranks):
        assert found["results"] == [[1, 0], [1, 1], [1, 2], None, [1, 3], [1, 4], None], found
        assert found["paused"] is None
        assert "publish with ttf.distribute.sync.Publisher(model, base, collectives) on every rank" in found["refusal"]
        assert {name for name in found["written"] if name != "dense.delta"} == {f"sparse-{rank}-0.delta"}
    assert "dense.delta" in ranks[0]["written"] and "dense.delta" not in ranks[1]["written"]
    assert proc.stderr.count("publishing to") == 4  # paused and resumed, on each rank
    assert "paused: rank 1: [Errno 28] No space left on device" in proc.stderr
    zero = ranks[0]
    assert zero["sequence"] == 4 and zero["refused"] is None and zero["equal"] and zero["predict_equal"], zero
    assert zero["keys"] > zero["held"] > 0  # some keys were deleted
    manifest = json.loads((tmp_path / "pub" / "deltas" / "1" / "0000000004" / "manifest.json").read_text())
    assert sorted(part["file"] for part in manifest["parts"]) == ["sparse-0-0.delta", "sparse-1-0.delta"]


def test_kafka_stream_on_two_ranks_kill_9_then_one_process_exactly_once(horovod, tmp_path):
    """4 partitions, 2 ranks (partitions 0, 2 and 1, 3), publishing every second; kill -9 of one
    rank mid-stream (horovodrun stops the other); more messages arrive; the checkpoint resumes
    in one plain process, which reads every partition from the merged offsets: every example
    once. The follower then serves the one-process job's last publish."""
    kafka_mock = pytest.importorskip("kafka_mock", reason="confluent-kafka is not installed")
    cluster = kafka_mock.MockKafkaCluster(3)
    try:
        cluster.create_topic("clicks", 4)
        ttf.data.write_synthetic_criteo(str(tmp_path / "rows.tsv"), 2000, seed=4)
        lines = (tmp_path / "rows.tsv").read_text().splitlines()
        kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[:1400], 4)
        spec = f"kafka:{cluster.bootstrap}/clicks"
        publish = ["--publish-dir", str(tmp_path / "pub"), "--publish-every", "1"]
        first, log1 = job(tmp_path, 1, spec, 2, publish)
        try:
            wait_for(lambda: len(journal(tmp_path, 1)) >= 9 and any((tmp_path / "ckpt").glob("*.index")),
                     "run 1 to checkpoint and train on", first, log1)
            assert "published base 1 sequence" in log1.read_text()
            os.kill(ranks_of(first)[-1], signal.SIGKILL)  # SIGKILL one rank: no handler, no final checkpoint
            first.wait(120)
        finally:
            if first.poll() is None:
                first.kill()
        assert first.returncode != 0
        kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[1400:], 4, first_index=1400)
        second, log2 = job(tmp_path, 2, spec, 0, publish)
        try:
            wait_for(lambda: resumed_step(log2) is not None and
                     sum(len(ids) for _, ids in journal(tmp_path, 2)) +
                     sum(len(ids) for s, ids in journal(tmp_path, 1) if s <= resumed_step(log2)) >= 2000,
                     "run 2 to reach the end of the stream", second, log2)
            stop(second, log2)
        finally:
            if second.poll() is None:
                second.kill()
        trained_once(tmp_path, [(1, log1), (2, log2)], [((i % 4) << ID_SHIFT) | (i // 4) for i in range(2000)])
        follower = ttf.serving.DeltaFollower(str(tmp_path / "pub"))
        assert follower.version == 2 and follower.refused is None  # the restarted job's base, then its deltas
    finally:
        cluster.close()
