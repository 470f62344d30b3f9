"""TF_CONFIG -> the cluster and this task's role (ttf.distribute.Cluster, ttf/launch/tf_config.py): TensorFlow's own
reading of the same JSON (TFConfigClusterResolver) is the reference; every bad TF_CONFIG is refused
with one line naming what is wrong, and explicit arguments win but may not contradict it."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from ttf.distribute import Cluster, ClusterError

parse_tf_config, resolve_task = Cluster.from_tf_config, Cluster.from_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PS_CLUSTER = {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}
SYNC_CLUSTER = {"worker": ["w0:2222", "w1:2222", "w2:2222"]}


def tf_config(cluster, task_type, index, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


@pytest.mark.parametrize("cluster,task_type,index", [
    (PS_CLUSTER, "chief", 0), (PS_CLUSTER, "worker", 1), (PS_CLUSTER, "ps", 0),
    (SYNC_CLUSTER, "worker", 2), ({"chief": ["c0:1"], "worker": ["w0:1", "w1:1"]}, "chief", 0),
])
def test_the_cluster_and_task_are_what_tensorflows_resolver_reads(monkeypatch, cluster, task_type, index):
    text = tf_config(cluster, task_type, index, environment="cloud")  # Vertex AI adds keys of its own
    monkeypatch.setenv("TF_CONFIG", text)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = Cluster.from_env()
    assert {k: list(v) for k, v in config.cluster.items()} == resolver.cluster_spec().as_dict()
    assert (config.task_type, config.task_index) == (resolver.task_type, resolver.task_id)
    assert config.address == cluster[task_type][index]
    assert config.parameter_server_job == ("ps" in cluster)


def test_the_chief_of_a_synchronous_job_is_worker_0_unless_a_chief_is_named():
    assert parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 0)).is_chief
    assert not parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 1)).is_chief
    with_chief = {"chief": ["c0:1"], "worker": ["w0:1"]}
    assert parse_tf_config(tf_config(with_chief, "chief", 0)).is_chief
    assert not parse_tf_config(tf_config(with_chief, "worker", 0)).is_chief
    assert parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 0)).shape == "synchronous"
    assert parse_tf_config(tf_config(PS_CLUSTER, "ps", 0)).shape == "parameter-server"


def test_an_evaluator_may_stand_outside_the_cluster_and_listens_nowhere():
    config = parse_tf_config(tf_config(PS_CLUSTER, "evaluator", 0))
    assert config.address is None and not config.is_chief
    role = resolve_task(config)
    assert role.task_type == "evaluator" and "listens on nothing" in role.describe()


@pytest.mark.parametrize("text,message", [
    ("{cluster: 1}", "TF_CONFIG is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    (tf_config(PS_CLUSTER, "master", 0), "unknown task type 'master'.*old name of 'chief'"),
    (tf_config({**PS_CLUSTER, "trainer": ["t:1"]}, "chief", 0), "TF_CONFIG cluster names the unknown task type 'trainer'"),
    (tf_config(PS_CLUSTER, "worker", 2), "names task worker 2, but its cluster has 2 worker task"),
    (tf_config(PS_CLUSTER, "worker", -1), "index must be an integer >= 0"),
    (tf_config({"worker": ["w0"]}, "worker", 0), r"cluster worker\[0\] must be host:port"),
    (tf_config({"worker": ["w0:99999"]}, "worker", 0), "port 1..65535"),
    (tf_config({"worker": "w0:1,w1:1"}, "worker", 0), "must be a non-empty list"),
    (tf_config({"worker": ["w0:1", "w0:1"]}, "worker", 0), "gives w0:1 to both worker 0 and worker 1"),
    (tf_config({"ps": ["p:1"], "worker": ["w:1"]}, "ps", 0), "ps tasks but no \"chief\""),
    (tf_config({"chief": ["c:1"]}, "chief", 0), "no \"worker\" tasks"),
    (tf_config({"chief": ["c:1", "d:1"], "worker": ["w:1"]}, "chief", 0), "2 chief tasks"),
    (tf_config(SYNC_CLUSTER, "worker", 0, rpc_layer="grpc+verbs"), "gRPC only"),
    (json.dumps({"cluster": SYNC_CLUSTER}), "needs a \"task\" object"),
])
def test_a_bad_tf_config_is_refused_naming_the_cause(text, message):
    with pytest.raises(ClusterError, match=message) as err:
        parse_tf_config(text)
    assert "\n" not in str(err.value)


def test_arguments_fill_in_and_win_but_may_not_contradict_tf_config():
    config = parse_tf_config(tf_config(PS_CLUSTER, "worker", 1))
    role = resolve_task(config)
    assert (role.ps_hosts, role.worker_hosts, role.chief_host) == (("p0:2222",), ("w0:2222", "w1:2222"), "c0:2222")
    assert (role.task_type, role.task_index, role.source) == ("worker", 1, "TF_CONFIG")
    agreeing = resolve_task(config, ps_hosts="p0:2222", task_type="worker", task_index=1)
    assert agreeing == dataclasses.replace(role, source="TF_CONFIG and arguments")
    with pytest.raises(ClusterError, match="TF_CONFIG and ps_hosts= disagree: ps_hosts= p9:1, TF_CONFIG p0:2222"):
        resolve_task(config, ps_hosts="p9:1")
    with pytest.raises(ClusterError, match="TF_CONFIG and --index disagree: --index 0, TF_CONFIG 1"):
        resolve_task(config, task_index=0, names={"task_index": "--index"})
    sync = parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 0))
    with pytest.raises(ClusterError, match="chief_host= c:1, TF_CONFIG nothing"):
        resolve_task(sync, chief_host="c:1")
    chief_only = dict(task_type="chief", task_types=("chief",), shapes=("parameter-server",))
    assert resolve_task(parse_tf_config(tf_config(PS_CLUSTER, "chief", 0)), **chief_only).chief_host == "c0:2222"
    with pytest.raises(ClusterError, match="names task worker 1; this process runs chief tasks "
                                            r"\(a parameter-server job's ps and worker tasks run python -m"):
        resolve_task(config, **chief_only)
    with pytest.raises(ClusterError, match=r"describes a synchronous job \(worker tasks\); this process runs "
                                            "parameter-server jobs"):
        resolve_task(sync, **chief_only)
    alone = resolve_task(None, ps_hosts="p:1", worker_hosts="w:1", chief_host="c:1", task_type="chief")
    assert alone.source == "arguments" and alone.address == "c:1" and alone.parameter_server_job


def test_every_role_describes_itself_in_one_line_with_its_listening_port():
    role = resolve_task(parse_tf_config(tf_config(PS_CLUSTER, "ps", 0)))
    line = role.describe()
    assert line.startswith("role ps 0 of a parameter-server job (1 ps, 2 worker(s), chief c0:2222), from TF_CONFIG")
    assert "listens on 0.0.0.0:2222 (cluster address p0:2222" in line
    sync = resolve_task(parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 1))).describe()
    assert "synchronous job (3 worker(s), worker 0 acting as chief)" in sync


def test_the_launcher_entry_prints_shell_assignments_and_refuses_in_one_line():
    """start_all.sh runs the module as a script (no TensorFlow import): the assignments it evals."""
    script = os.path.join(ROOT, "ttf", "launch", "tf_config.py")

    def run(text, *args):
        return subprocess.run([sys.executable, script, "--shell", *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "TF_CONFIG": text})

    ok = run(tf_config(PS_CLUSTER, "worker", 1))
    assert ok.returncode == 0, ok.stderr
    values = dict(line.split("=", 1) for line in ok.stdout.splitlines())
    assert values["role"] == "worker" and values["index"] == "1" and values["ps_hosts"] == "p0:2222"
    assert values["worker_hosts"] == "w0:2222,w1:2222" and values["job_shape"] == "parameter-server"
    bad = run(tf_config(PS_CLUSTER, "worker", 1), "--role", "ps")
    assert bad.returncode == 2 and bad.stderr.strip() == "TF_CONFIG and --role disagree: --role ps, TF_CONFIG worker. " \
                                                          "Give one of them, or make them agree"
    not_json = run("{")
    assert not_json.returncode == 2 and not_json.stderr.startswith("TF_CONFIG is not JSON")
    assert len(not_json.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text,args,message", [
    ("{", [], "start_all: TF_CONFIG is not JSON"),
    (tf_config(PS_CLUSTER, "worker", 1), ["--role", "ps"], "start_all: TF_CONFIG and --role disagree: --role ps, TF_CONFIG worker."),
    (tf_config(PS_CLUSTER, "worker", 1), ["--index", "0"], "start_all: TF_CONFIG and --index disagree: --index 0, TF_CONFIG 1."),
    (tf_config(PS_CLUSTER, "trainer", 0), [], "start_all: TF_CONFIG task names the unknown task type 'trainer'"),
    (tf_config(PS_CLUSTER, "evaluator", 0), [], "start_all: TF_CONFIG names an evaluator task"),
])
def test_start_all_refuses_a_bad_tf_config_in_one_line_with_exit_2(text, args, message):
    """Before any set-up or training: the launcher reads TF_CONFIG first."""
    proc = subprocess.run(["bash", os.path.join(ROOT, "start_all.sh"), "--tiacc", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TF_CONFIG": text})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(message) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_start_all_local_job_flags_win_over_tf_config():
    """--single, --hvd, --ps, --workers start a local job: TF_CONFIG (even a bad one) is ignored, and said so.
    (--single with --hvd stops at the usage check that follows, before any set-up.)"""
    proc = subprocess.run(["bash", os.path.join(ROOT, "start_all.sh"), "--single", "--hvd"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "TF_CONFIG": "{"})
    assert "TF_CONFIG is set, but --hvd starts a local job: TF_CONFIG is ignored (explicit flags win)" in proc.stdout
    assert proc.returncode == 2 and "TF_CONFIG" not in proc.stderr and "--hvd runs" in proc.stderr, proc.stderr


def test_one_cluster_from_tf_config_flags_or_a_resolver():
    """What every topology takes: the same Cluster from TF_CONFIG, from flags, or from TensorFlow's
    ClusterResolver of that TF_CONFIG; a synchronous cluster is refused as a parameter-server job."""
    from_config = parse_tf_config(tf_config(PS_CLUSTER, "chief", 0))
    assert from_config.ps_hosts == ("p0:2222",) and from_config.worker_hosts == ("w0:2222", "w1:2222")
    assert from_config.spec() == PS_CLUSTER and from_config.job_shape() == {"ps": 1, "workers": 2}
    from_flags = Cluster("p0:2222", "w0:2222,w1:2222", "c0:2222", "chief")
    assert dataclasses.replace(from_flags, source="TF_CONFIG") == from_config
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(PS_CLUSTER), task_type="chief", task_id=0, rpc_layer="grpc")
    assert dataclasses.replace(Cluster.from_resolver(resolver), source="TF_CONFIG") == from_config
    from_config.require_parameter_servers()
    with pytest.raises(ClusterError, match="a parameter-server job needs ps, worker and chief tasks; TF_CONFIG gives ps"):
        parse_tf_config(tf_config(SYNC_CLUSTER, "worker", 0)).require_parameter_servers()
    with pytest.raises(ClusterError, match="a task address must be host:port, got 'w0'"):
        Cluster(worker_hosts="w0", task_type="worker")
    assert Cluster(worker_hosts="a:1,b:1", task_type="worker", task_index=1).rank == 1
    assert parse_tf_config(tf_config({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "worker", 1)).rank == 2


@pytest.mark.parametrize("argv, config, message", [
    (["--sync"], None, "--sync shards ttf tables over TensorFlow's collectives: give --tiacc"),
    (["--sync", "--tiacc"], None, "--sync needs --worker-hosts and --task-index (or TF_CONFIG"),
    (["--sync", "--tiacc", "--worker-hosts", "a:1,b:1", "--task-index", "2"], None, "outside the 2 workers"),
    (["--sync", "--tiacc", "--worker-hosts", "a:1,b:1", "--task-index", "0", "--steps-per-call", "4"], None,
     "--sync runs one step per call"),
    (["--sync", "--tiacc", "--task-index", "0"], ("worker", 1), "TF_CONFIG and --task-index disagree"),
    (["--tiacc"], ("worker", 1), "(add --sync --tiacc for a synchronous job)"),
    (["--tiacc", "--wire-compression", "fp16"], None, "--wire-compression needs --sync or --horovod"),
])
def test_train_py_sync_flags_refuse_in_one_line(monkeypatch, capsys, argv, config, message):
    from models import train

    if config:
        monkeypatch.setenv("TF_CONFIG", tf_config(SYNC_CLUSTER, *config))
    else:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_train_py_sync_takes_its_rank_from_the_flags_or_tf_config(monkeypatch):
    from models import train

    monkeypatch.delenv("TF_CONFIG", raising=False)
    args = train.parse_args(["--sync", "--tiacc", "--worker-hosts", "a:1,b:1,c:1", "--task-index", "2"])
    assert (args.sync_hosts, args.sync_index) == (["a:1", "b:1", "c:1"], 2)
    # TF_CONFIG with a chief: the chief is rank 0, worker i rank i + 1
    monkeypatch.setenv("TF_CONFIG", tf_config({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "worker", 1))
    args = train.parse_args(["--sync", "--tiacc"])
    assert (args.sync_hosts, args.sync_index) == (["c:1", "a:1", "b:1"], 2)
    assert "synchronous job" in args.task_role
