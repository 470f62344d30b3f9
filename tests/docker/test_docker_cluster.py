"""A parameter-server job in containers (docker/cluster.sh): one container per task (1 ps,
2 workers, the chief) on a container network, with start_all.sh's multi-host flags and
checkpoints on a named volume. It trains and reports, finishing after a worker container is
killed; a killed ps container stops it, and a restart from the volume's checkpoint has every key.
The Horovod shape (cluster.sh --hvd): one rank per container, tables sharded over them."""
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import tensorflow as tf
from container_engine import DOCKER, ROOT, engine, engine_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("containers")]  # one image, one build: one process
JOB_FLAGS = ["--tiacc", "--fm", "--batch-size", "64"]

# The checkpoint reader of the local-cluster tests: (ids, checksum of values) over every shard.
_spec = importlib.util.spec_from_file_location("_cluster_tests", os.path.join(ROOT, "tests", "distribute", "test_cluster.py"))
_cluster_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cluster_tests)
checkpoint_tables = _cluster_tests.checkpoint_tables


@pytest.fixture
def job(image):
    """A unique job name; its containers, network and volume are removed afterwards."""
    name = f"ttft-{uuid.uuid4().hex[:6]}"
    yield name
    engine("rm", "-f", *[f"{name}-{task}" for task in ("ps0", "worker0", "worker1", "chief", "rank0", "rank1")],
           check=False)
    engine("network", "rm", f"{name}-net", check=False)
    engine("volume", "rm", "-f", f"{name}-ckpt", check=False)


def volume_dir(job):
    return engine("volume", "inspect", "-f", "{{.Mountpoint}}", f"{job}-ckpt").strip()


def start(job, *args):
    return subprocess.Popen([os.path.join(DOCKER, "cluster.sh"), "--name", job, *JOB_FLAGS, *args], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=engine_env())


def wait_for(proc, pattern, timeout=600):
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if pattern in line:
            return "".join(lines)
    raise AssertionError(f"'{pattern}' not seen; output:\n{''.join(lines)[-4000:]}")


def finish(proc, timeout=900):
    out, _ = proc.communicate(timeout=timeout)
    return out


def test_cluster_trains_reports_and_finishes_after_a_worker_container_is_killed(job):
    # One job for both (container start-up is most of the time): it trains, a worker container
    # is killed mid-job, the chief finishes on the other and reports steps/sec and AUC.
    proc = start(job, "--steps", "400", "--metrics-out", "/ckpt/m.json")
    out = wait_for(proc, "[train] step")
    engine("kill", f"{job}-worker1")
    out += finish(proc)
    assert proc.returncode == 0, out[-5000:]
    assert f"[cluster] job {job}: 1 ps + 2 worker(s) + chief on network {job}-net" in out
    assert f"worker 1 (container {job}-worker1) stopped: killed by signal 9" in out, out[-4000:]
    assert "the chief goes on with the remaining workers" in out
    assert "[train] done: 400 steps," in out and "global steps/sec, AUC" in out, out[-3000:]
    result = json.loads(open(os.path.join(volume_dir(job), "m.json")).read())
    assert result["steps"] == 400 and result["cluster"] == {"ps": 1, "workers": 2} and result["table_size"] > 0
    assert result["global_steps_per_sec"] > 0 and 0 <= result["auc"] <= 1
    assert tf.train.latest_checkpoint(volume_dir(job)).endswith("ckpt-400")  # on the volume
    assert engine("ps", "-a", "--filter", f"name={job}-", "--format", "{{.Names}}").strip() == ""  # removed


def test_killing_the_ps_container_and_restarting_from_the_volume_loses_no_keys(job):
    proc = start(job, "--steps", "5000")
    out = wait_for(proc, "[train] step 1")  # past step 100: the first checkpoint is written
    ckpt = volume_dir(job)
    while not tf.train.latest_checkpoint(ckpt):
        line = proc.stdout.readline()
        assert line, f"the job ended before its first checkpoint:\n{out[-4000:]}"
        out += line
    engine("kill", f"{job}-ps0")
    out += finish(proc)
    assert proc.returncode != 0, out[-4000:]
    assert f"ps 0 (container {job}-ps0) stopped: killed by signal 9" in out and "parameter server lost" in out, out[-4000:]

    latest = tf.train.latest_checkpoint(ckpt)
    saved_step = int(latest.rsplit("-", 1)[1])
    size, checksum = checkpoint_tables(latest)
    proc = start(job, "--steps", str(saved_step), "--metrics-out", "/ckpt/m.json")
    out = finish(proc)
    assert proc.returncode == 0 and f"resumed from /ckpt/ckpt-{saved_step}" in out, out[-4000:]
    restored = json.loads(open(os.path.join(ckpt, "m.json")).read())
    assert restored["steps"] == saved_step
    assert restored["table_size"] == size > 0  # no key lost
    assert restored["table_value_sum"] == pytest.approx(checksum, rel=1e-9)  # the same rows and slots


def test_horovod_job_with_one_rank_per_container(job):
    unsupported = os.path.join(sys.prefix, ".ttf-horovod-unsupported")  # the image has this venv's TensorFlow
    if os.path.exists(unsupported):
        pytest.skip(open(unsupported).read().strip())
    proc = start(job, "--hvd", "--workers", "2", "--steps", "60", "--metrics-out", "/ckpt/m.json")
    out = finish(proc)
    assert proc.returncode == 0, out[-5000:]
    assert f"[cluster] Horovod job {job}: 2 rank(s), one per container, on network {job}-net" in out
    assert "[train] done: 60 steps" in out and "(2 Horovod ranks)" in out, out[-3000:]
    result = json.loads(open(os.path.join(volume_dir(job), "m.json")).read())
    assert result["cluster"]["horovod_ranks"] == 2 and result["table_size"] > 0 and 0 <= result["auc"] <= 1
    # Rank 0's checkpoint on the volume holds every id of both ranks, once.
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(volume_dir(job)))
    keys = [reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n.endswith("/keys")]
    assert sum(len(k) for k in keys) == result["table_size"]
    assert engine("ps", "-a", "--filter", f"name={job}-", "--format", "{{.Names}}").strip() == ""  # removed
