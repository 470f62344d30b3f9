"""kill -9 of a parameter server, a worker and the follower of a stream job that publishes
(benchmarks/online_faults.py, --job cluster: start_all.sh's local cluster, 1 ps and 2 workers,
the chief reading a folder stream while a producer adds files). After the kills: every example
of the stream trained exactly once, by the journal and by the model itself (each example's own
key updated once in the final checkpoint), and the follower, restarted, serves the
checkpoint's rows bit for bit at the trainer's last published sequence. The trainer's own
20-kill sweep is the benchmark (benchmarks/RESULTS.md); tests/data/test_stream_training.py
kills the trainer."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def test_cluster_stream_job_kill_9_of_worker_follower_and_ps_loses_and_repeats_nothing(tmp_path):
    summary_path = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "online_faults.py"), "--job", "cluster",
                           "--kills", "3", "--victims", "worker", "follower", "ps", "--in-order",
                           "--kill-after", "0.5", "2", "--rows-per-file", "200", "--file-every", "1",
                           "--workdir", str(tmp_path / "work"), "--out", str(summary_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert summary_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["kills_by_victim"] == {"worker": 1, "follower": 1, "ps": 1}, summary
    assert summary["job_starts"] == 2  # the lost ps stopped the job, which was started again
    assert summary["examples"] >= 1200
    assert (summary["journal_lost"], summary["journal_duplicated"], summary["journal_unknown"]) == (0, 0, 0), summary
    assert (summary["table_lost"], summary["table_duplicated"]) == (0, 0), summary
    follower = summary["follower"]
    assert follower["equal"] and follower["refused"] is None and follower["rows"] > 0, follower
    assert summary["ok"] and proc.returncode == 0, proc.stdout[-2000:]
