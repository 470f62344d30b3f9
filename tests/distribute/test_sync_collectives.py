"""TFCollectives, the collectives of a synchronous job on TensorFlow's own collective ops:
every method on 2 real workers on loopback (sync_collectives.py checks each against NumPy),
and its argument errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ttf.distribute import Cluster, TFCollectives, free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run_workers(script, out, *args, count=2, env=None, timeout=600):
    """Starts `count` workers of `script` on loopback; returns their Popen objects."""
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(count))
    return [subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "distribute", script),
                              f"{out}.{i}.json", hosts, str(i), *args], cwd=ROOT, env=env or ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(count)]


def finish(procs, timeout=600):
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


@pytest.mark.slow
def test_every_method_on_two_workers(tmp_path):
    procs = run_workers("sync_collectives.py", tmp_path / "out")
    outputs = finish(procs)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-4000:]
    for rank in (0, 1):
        checks = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert checks["rank"] == rank and checks["size"] == 2
        assert all(checks[k] is True for k in ("alltoall", "allgather", "sixteen_bit", "allreduce", "broadcast",
                                               "objects", "mean_over_examples")), checks
        # The counted alltoalls: padded blocks and the count exchange on the wire, the rows as payload.
        assert checks["wire_bytes"] >= checks["payload_bytes"] > 0, checks
        # 200 traced steps of 3 collectives each leave the thread count where it was (TensorFlow's own
        # per-op timeout kept a thread alive 60 s per collective: +600 here).
        assert checks["threads_after"] - checks["threads_before"] < 30, checks
    # Worker 1 stayed alive without joining: worker 0's traced collective failed in about timeout_seconds (6).
    stuck = json.loads((tmp_path / "out.0.json").read_text())
    assert stuck["stuck"].startswith("DeadlineExceededError") and "waited 6s" in stuck["stuck"], stuck
    assert 5 < stuck["stuck_seconds"] < 20, stuck


def test_a_cluster_is_required(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TFCollectives needs a cluster: pass a ttf.distribute.Cluster"):
        TFCollectives()


def test_a_task_index_outside_the_workers_is_refused():
    with pytest.raises(ValueError, match=r"this task \(worker 2\) is not a chief or worker of the cluster"):
        TFCollectives(Cluster(worker_hosts="127.0.0.1:1,127.0.0.1:2", task_type="worker", task_index=2))
    with pytest.raises(ValueError, match="a task address must be host:port"):
        TFCollectives(Cluster(worker_hosts="127.0.0.1", task_type="worker", task_index=0))


@pytest.mark.slow
@pytest.mark.parametrize("keras", ["2", "3"])
def test_a_functional_model_exchanges_all_its_tables_at_once(keras, tmp_path):
    """Two ttf tables of a functional model (Keras 2 and Keras 3) share one exchange per call
    (ids, rows and gradients in one alltoall each), and sharding keeps the predictions."""
    env = dict(ENV, TF_USE_LEGACY_KERAS="1") if keras == "2" else {k: v for k, v in ENV.items()
                                                                  if k != "TF_USE_LEGACY_KERAS"}
    [proc] = run_workers("sync_grouped.py", tmp_path / "out", count=1, env=env)
    [output] = finish([proc])
    assert proc.returncode == 0, output[-4000:]
    result = json.loads((tmp_path / "out.0.json").read_text())
    assert result["exchanges"] == [["fields", "users"]], result["exchanges"]
    assert result["after"] == result["before"]
    # An eager call after a serving export: the grouped call still exchanges (the trained rows,
    # not the export's trace of the model), and the served model predicts the same.
    assert result["after_export"] == result["trained"] != result["after"]
    np.testing.assert_allclose(np.reshape(result["served"], -1), np.reshape(result["trained"], -1), rtol=1e-6, atol=1e-6)
