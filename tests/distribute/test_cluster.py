"""Real parameter-server jobs (TensorFlow servers over gRPC, started by start_all.sh):
training, checkpoint and resume, a worker killed mid-training, a parameter server killed."""
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = os.path.join(ROOT, "start_all.sh")
pytestmark = pytest.mark.slow


def start(*args):
    return subprocess.Popen([START, "--tiacc", "--fm", "--batch-size", "64", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(proc, pattern, timeout=240):
    """Reads proc's output until a line holds `pattern`; returns everything read."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if pattern in line:
            return "".join(lines)
    raise AssertionError(f"'{pattern}' not seen; output:\n{''.join(lines)[-4000:]}")


def child_pid(parent, needle):
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "--", needle], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, f"expected one child matching {needle!r}, got {out}"
    return int(out[0])


def finish(proc, timeout=300):
    out, _ = proc.communicate(timeout=timeout)
    return out


def test_cluster_trains_checkpoints_and_resumes(tmp_path):
    """With the PS's table on a DRAM + SSD tier (2 MiB of DRAM rows): the progress lines show
    its tiers, and the checkpoint holds the rows of both."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.json"
    tier = ("--dram-budget", "2M", "--ssd-dir", str(tmp_path / "ssd"))
    out = finish(start("--steps", "60", "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics), *tier))
    assert "[train] done: 60 steps" in out, out[-3000:]
    tiers = r"\[train\] step \d+: .* global steps/s, rows \d+ DRAM \+ [1-9]\d* disk, DRAM hit rate"
    assert re.search(tiers, out), out[-3000:]
    first = json.loads(metrics.read_text())
    assert first["cluster"] == {"ps": 1, "workers": 2} and first["global_steps_per_sec"] > 0
    out = finish(start("--steps", "100", "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics), *tier))
    assert "at step 60" in out and "[train] done: 100 steps" in out, out[-3000:]
    assert json.loads(metrics.read_text())["table_size"] >= first["table_size"]


def test_killing_a_worker_lets_the_job_finish(tmp_path):
    proc = start("--steps", "400", "--metrics-out", str(tmp_path / "m.json"))
    out = wait_for(proc, "[train] step")
    os.kill(child_pid(proc.pid, "--job worker --index 1"), signal.SIGKILL)
    out += finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "worker 1 (pid" in out and "killed by signal 9" in out and "goes on with the remaining workers" in out
    assert json.loads((tmp_path / "m.json").read_text())["steps"] == 400


def checkpoint_tables(path):
    """(ids, float64 sum of values) of every table saved in checkpoint `path` (the pieces of
    every shard, ttf/checkpoint/_format.py)."""
    reader = tf.train.load_checkpoint(path)
    names = reader.get_variable_to_shape_map()
    keys = [n for n in names if "/ttf/src-" in n and n.endswith("/keys")]
    values = [n[: -len("keys")] + "values" for n in keys]
    assert keys, sorted(names)
    all_keys = np.concatenate([reader.get_tensor(k) for k in keys])
    all_values = np.concatenate([reader.get_tensor(v) for v in values])
    return len(all_keys), float(np.sum(all_values, dtype=np.float64))


def test_killing_the_ps_stops_the_job_and_a_restart_restores_every_key(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = start("--steps", "5000", "--checkpoint-dir", str(ckpt))
    out = wait_for(proc, "[train] step 1")  # past step 100: the first checkpoint is written
    while not tf.train.latest_checkpoint(str(ckpt)):
        out += proc.stdout.readline()
    os.kill(child_pid(proc.pid, "--job ps --index 0"), signal.SIGKILL)
    out += finish(proc)
    assert proc.returncode != 0, out[-4000:]
    assert "ps 0 (pid" in out and "parameter server lost" in out, out[-4000:]
    assert "lost contact with the cluster" in out or "did not stop" in out, out[-4000:]

    latest = tf.train.latest_checkpoint(str(ckpt))
    saved_step = int(latest.rsplit("-", 1)[1])
    size, checksum = checkpoint_tables(latest)
    metrics = tmp_path / "m.json"
    out = finish(start("--steps", str(saved_step), "--checkpoint-dir", str(ckpt), "--metrics-out", str(metrics)))
    restored = json.loads(metrics.read_text())
    assert restored["steps"] == saved_step, out[-3000:]
    assert restored["table_size"] == size > 0  # no key lost
    # The same rows and slots (the sum's rounding depends on its order; test_cluster_restore.py and
    # tests/checkpoint compare exact checksums).
    assert restored["table_value_sum"] == pytest.approx(checksum, rel=1e-9)
