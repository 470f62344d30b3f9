"""kill -9 of a worker and of the follower of a stream job that publishes
(benchmarks/online_faults.py, --job cluster: start_all.sh's local cluster, 1 ps and 2 workers,
the chief reading a folder stream while a producer adds files). After the kills: every example
of the stream trained exactly once, by the journal and by the model itself (each example's own
key updated once in the final checkpoint), and the follower, restarted, serves the
checkpoint's rows bit for bit at the trainer's last published sequence. The sweeps of the
trainer (20 kills) and of a ps are the benchmark (benchmarks/results/online_faults.md), kept out of CI for
time; tests/data/test_stream_training.py kills the trainer once."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def test_cluster_stream_job_kill_9_of_a_worker_and_the_follower_loses_and_repeats_nothing(tmp_path):
    summary_path = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "online_faults.py"), "--job", "cluster",
                           "--kills", "2", "--victims", "worker", "follower", "--in-order",
                           "--kill-after", "0.5", "2", "--rows-per-file", "200", "--file-every", "1",
                           "--workdir", str(tmp_path / "work"), "--out", str(summary_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert summary_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["kills_by_victim"] == {"worker": 1, "follower": 1}, summary
    assert summary["job_starts"] == 1  # a lost worker is started again alone; the job goes on
    assert summary["examples"] >= 1000
    assert (summary["journal_lost"], summary["journal_duplicated"], summary["journal_unknown"]) == (0, 0, 0), summary
    assert (summary["table_lost"], summary["table_duplicated"]) == (0, 0), summary
    follower = summary["follower"]
    assert follower["equal"] and follower["refused"] is None and follower["rows"] > 0, follower
    assert summary["ok"] and proc.returncode == 0, proc.stdout[-2000:]
