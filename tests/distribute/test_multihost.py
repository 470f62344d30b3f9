"""Two hosts on one machine (network namespaces joined by a veth link): the parameter server
on one, the workers and the chief on the other, training and checkpointing over that link,
every task started from TF_CONFIG alone (start_all.sh's multi-host flags are the same code path
after the merge, and docker/cluster.sh starts its containers with them)."""
import json
import os
import shutil
import socket
import subprocess
import uuid

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = os.path.join(ROOT, "start_all.sh")
pytestmark = pytest.mark.slow


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    tag = uuid.uuid4().hex[:6]
    host_a, host_b = f"ttfa{tag}", f"ttfb{tag}"
    try:
        sh("ip", "netns", "add", host_a)
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        pytest.skip(f"network namespaces are not permitted here ({err})")
    try:
        sh("ip", "netns", "add", host_b)
        sh("ip", "link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        sh("ip", "link", "set", f"va{tag}", "netns", host_a)
        sh("ip", "link", "set", f"vb{tag}", "netns", host_b)
        for host, dev, addr in ((host_a, f"va{tag}", "10.231.7.1/24"), (host_b, f"vb{tag}", "10.231.7.2/24")):
            sh("ip", "-n", host, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", host, "link", "set", dev, "up")
            sh("ip", "-n", host, "link", "set", "lo", "up")
            # As on a real host, this host's name resolves to its own address (ip netns exec
            # mounts /etc/netns/<ns>/hosts over /etc/hosts): Horovod's Gloo needs it.
            os.makedirs(f"/etc/netns/{host}", exist_ok=True)
            with open(f"/etc/netns/{host}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n{addr.split('/')[0]} {socket.gethostname()}\n")
        yield host_a, host_b
    finally:
        for host in (host_a, host_b):
            subprocess.run(["ip", "netns", "pids", host], capture_output=True)
            pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", host], capture_output=True)
            shutil.rmtree(f"/etc/netns/{host}", ignore_errors=True)


def test_ps_on_one_host_workers_and_chief_on_another_each_from_tf_config_alone(two_hosts, tmp_path):
    """Every task gets its role and the cluster from TF_CONFIG only (no --role, no hosts flags), as a
    Kubernetes launcher starts them; each says its role and where it listens."""
    host_a, host_b = two_hosts
    cluster = {"chief": ["10.231.7.2:22223"], "worker": ["10.231.7.2:22221", "10.231.7.2:22222"],
               "ps": ["10.231.7.1:22220"]}
    common = ["--tiacc", "--fm", "--batch-size", "64"]

    def env(task_type, index):
        return {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}

    def role(host, task_type, index):
        return subprocess.Popen(["ip", "netns", "exec", host, START, *common], cwd=ROOT, env=env(task_type, index),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    servers = [role(host_a, "ps", 0), role(host_b, "worker", 0), role(host_b, "worker", 1)]
    try:
        metrics = tmp_path / "m.json"
        chief = subprocess.run(["ip", "netns", "exec", host_b, START, *common, "--steps", "60",
                                "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-out", str(metrics)],
                               cwd=ROOT, env=env("chief", 0), capture_output=True, text=True, timeout=600)
        assert chief.returncode == 0, chief.stdout[-3000:] + chief.stderr[-3000:]
        assert ("[train] role chief 0 of a parameter-server job (1 ps, 2 worker(s), chief 10.231.7.2:22223), "
                "from TF_CONFIG and arguments: listens on 0.0.0.0:22223") in chief.stdout, chief.stdout[-3000:]
        result = json.loads(metrics.read_text())
        assert result["steps"] == 60 and result["cluster"] == {"ps": 1, "workers": 2} and result["table_size"] > 0
        assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("ckpt-60")
    finally:
        for server in servers:
            server.kill()
    outputs = [server.communicate()[0] for server in servers]
    for (task_type, index, port), out in zip([("ps", 0, 22220), ("worker", 0, 22221), ("worker", 1, 22222)], outputs):
        assert f"[start_all] role {task_type} {index} of a parameter-server job" in out, out[-3000:]
        assert f"from TF_CONFIG: listens on 0.0.0.0:{port}" in out, out[-3000:]


def test_horovod_ranks_on_two_hosts_without_ssh(two_hosts, tmp_path):
    """One Horovod rank per host, Gloo rendezvous by environment (start_all.sh --hvd-hosts):
    the tables sharded over the two hosts, rank 0's checkpoint holding every id."""
    pytest.importorskip("horovod.tensorflow", reason="horovod not installed: ./scripts/setup_horovod.sh")
    host_a, host_b = two_hosts
    hosts = ["--hvd-hosts", "10.231.7.1:1,10.231.7.2:1", "--hvd-rendezvous", "10.231.7.1:29555"]
    common = ["--hvd", "--tiacc", "--fm", "--batch-size", "64", "--steps", "30", *hosts]

    def host(netns, index, *args):
        return subprocess.Popen(["ip", "netns", "exec", netns, START, *common, "--hvd-host-index", str(index), *args],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    metrics = tmp_path / "m.json"
    first = host(host_a, 0, "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-out", str(metrics))
    second = host(host_b, 1, "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-out", str(metrics))
    try:
        out_a, _ = first.communicate(timeout=900)
        out_b, _ = second.communicate(timeout=120)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first.returncode == 0 and second.returncode == 0, out_a[-3000:] + out_b[-3000:]
    assert "[train] done: 30 steps" in out_a and "(2 Horovod ranks)" in out_a, out_a[-3000:]
    result = json.loads(metrics.read_text())
    assert result["cluster"]["horovod_ranks"] == 2 and result["table_size"] > 0
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt"))
    keys = [n for n in reader.get_variable_to_shape_map() if n.endswith("/keys")]
    assert sum(len(reader.get_tensor(k)) for k in keys) == result["table_size"]
