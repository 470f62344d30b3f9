"""A checkpoint moves between topologies on real TensorFlow servers: one process -> a
2-PS cluster -> one process, every key restored (size and checksum of rows and slots)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def run(*args):
    proc = subprocess.run([os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", "--batch-size", "64",
                           "--precision", "fp32", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def test_single_to_two_ps_and_back(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.json"
    run("--single", "--steps", "40", "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics))
    single = json.loads(metrics.read_text())
    # At the checkpoint's step: the cluster restores (keys routed over 2 PS) and trains nothing.
    out = run("--ps", "2", "--workers", "1", "--steps", "40", "--checkpoint-dir", str(ckpt),
              "--metrics-out", str(metrics))
    assert "at step 40" in out, out[-3000:]
    cluster = json.loads(metrics.read_text())
    assert cluster["cluster"] == {"ps": 2, "workers": 1}
    assert cluster["table_size"] == single["table_size"] > 0
    assert cluster["table_checksum"] == single["table_checksum"]
    # Train on in the cluster, then back to one process.
    run("--ps", "2", "--workers", "1", "--steps", "60", "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics))
    trained = json.loads(metrics.read_text())
    out = run("--single", "--steps", "60", "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics))
    back = json.loads(metrics.read_text())
    assert "at step 60" in out and back["table_size"] == trained["table_size"] >= single["table_size"]
    assert back["table_checksum"] == trained["table_checksum"]
