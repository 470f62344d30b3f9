"""TF_CONFIG: the cluster and this task's role, as every TensorFlow cluster launcher sets them.

TF_CONFIG is TensorFlow's convention (read by `TFConfigClusterResolver`, hence by
ParameterServerStrategy and MultiWorkerMirroredStrategy); Kubernetes launchers, Vertex AI,
SageMaker and Ray set it:

    {"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
     "task": {"type": "worker", "index": 1}}

Two job shapes are recognised: a parameter-server job (chief + workers + ps) and a
synchronous job (workers only, worker 0 acting as chief, or chief + workers), as
MultiWorkerMirroredStrategy reads it. An evaluator task may be named with or without an
entry in the cluster; it is never part of the training cluster.

`resolve_task` merges TF_CONFIG with explicitly given arguments: an argument given wins
where TF_CONFIG says nothing, a TF_CONFIG that contradicts one is refused (a launcher and a
command line that disagree are a misconfigured job, not a choice to make silently).

This module imports neither TensorFlow nor the rest of ttf, so a launcher script can run it
directly (`python ttf/launch/tf_config.py --shell`) to learn its role in a fraction of a
second.
"""
import dataclasses
import json
import os
import shlex
import sys

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
# Names older launchers used for TensorFlow's task types, named in the error as the fix.
_RENAMED = {"master": "chief"}

# The names of resolve_task's arguments; a caller that spells them otherwise (a command line)
# passes its own names so errors speak its language.
ARGUMENT_NAMES = {"ps_hosts": "ps_hosts=", "worker_hosts": "worker_hosts=", "chief_host": "chief_host=",
                  "task_type": "task_type=", "task_index": "task_index="}


class TFConfigError(ValueError):
    """TF_CONFIG is not JSON, not TensorFlow's shape, or disagrees with the given arguments."""


def _address(value, where):
    if not isinstance(value, str):
        raise TFConfigError(f"TF_CONFIG {where} must be a \"host:port\" string, got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TFConfigError(f"TF_CONFIG {where} must be host:port with a port 1..65535, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class TFConfig:
    """TF_CONFIG, validated.

    cluster: {task type: (host:port, ...)} for the types present ("chief", "worker", "ps",
        "evaluator"); task_type / task_index: this task.
    """

    cluster: dict
    task_type: str
    task_index: int

    @property
    def parameter_server_job(self):
        return "ps" in self.cluster

    @property
    def shape(self):
        """'parameter-server' or 'synchronous'."""
        return "parameter-server" if self.parameter_server_job else "synchronous"

    @property
    def address(self):
        """This task's host:port, or None for an evaluator outside the cluster."""
        tasks = self.cluster.get(self.task_type, ())
        return tasks[self.task_index] if self.task_index < len(tasks) else None

    @property
    def is_chief(self):
        """The task that coordinates: the chief, or worker 0 of a cluster without one."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    def hosts(self, task_type):
        """The comma-joined host:port list of `task_type` ("" when absent)."""
        return ",".join(self.cluster.get(task_type, ()))

    def to_json(self):
        return json.dumps({"cluster": {k: list(v) for k, v in self.cluster.items()},
                           "task": {"type": self.task_type, "index": self.task_index}})


def parse_tf_config(text):
    """TF_CONFIG's JSON text -> TFConfig; raises TFConfigError naming what is wrong and how to fix it."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise TFConfigError(f"TF_CONFIG is not JSON ({err}); it must be "
                            '{"cluster": {"worker": ["host:port", ...], ...}, "task": {"type": ..., "index": ...}}') from None
    if not isinstance(config, dict):
        raise TFConfigError(f"TF_CONFIG must be a JSON object with \"cluster\" and \"task\", got {type(config).__name__}")
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer != "grpc":
        raise TFConfigError(f"TF_CONFIG rpc_layer {rpc_layer!r}: ttf's jobs run over TensorFlow's gRPC only; "
                            "drop rpc_layer or set it to \"grpc\"")
    cluster_in, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster_in, dict) or not cluster_in:
        raise TFConfigError(f"TF_CONFIG needs a non-empty \"cluster\" object (task type -> list of host:port), "
                            f"got {cluster_in!r}")
    if not isinstance(task, dict) or "type" not in task:
        raise TFConfigError(f"TF_CONFIG needs a \"task\" object with \"type\" and \"index\", got {task!r}")

    def known_type(name, where):
        if name in TASK_TYPES:
            return name
        fix = f"; {name!r} is the old name of {_RENAMED[name]!r}: rename it" if name in _RENAMED else ""
        raise TFConfigError(f"TF_CONFIG {where} names the unknown task type {name!r}; TensorFlow's task types "
                            f"are {', '.join(TASK_TYPES)}{fix}")

    cluster, seen = {}, {}
    for task_type, addresses in cluster_in.items():
        known_type(task_type, "cluster")
        if not isinstance(addresses, list) or not addresses:
            raise TFConfigError(f"TF_CONFIG cluster {task_type!r} must be a non-empty list of \"host:port\" "
                                f"(index i is task i), got {addresses!r}")
        for index, address in enumerate(addresses):
            _address(address, f"cluster {task_type}[{index}]")
            if address in seen:
                raise TFConfigError(f"TF_CONFIG gives {address} to both {seen[address]} and {task_type} {index}: "
                                    "every task needs an address of its own")
            seen[address] = f"{task_type} {index}"
        cluster[task_type] = tuple(addresses)

    task_type = known_type(task["type"], "task")
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise TFConfigError(f"TF_CONFIG task index must be an integer >= 0, got {index!r}")
    count = len(cluster.get(task_type, ()))
    if task_type != "evaluator" and index >= count:
        raise TFConfigError(f"TF_CONFIG names task {task_type} {index}, but its cluster has "
                            f"{count} {task_type} task(s)" + ("" if count else f": add \"{task_type}\" to the cluster"))
    if len(cluster.get("chief", ())) > 1:
        raise TFConfigError(f"TF_CONFIG cluster has {len(cluster['chief'])} chief tasks; a job has at most one")
    if "worker" not in cluster:
        raise TFConfigError("TF_CONFIG cluster has no \"worker\" tasks; a job needs at least one worker "
                            "(a parameter-server job: chief, worker and ps; a synchronous job: worker, optionally chief)")
    if "ps" in cluster and "chief" not in cluster:
        raise TFConfigError("TF_CONFIG cluster has ps tasks but no \"chief\"; a parameter-server job needs one "
                            "chief to coordinate its workers")
    return TFConfig(cluster, task_type, index)


def tf_config_from_env(environ=None):
    """The TFConfig of $TF_CONFIG, or None when it is unset or empty."""
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    return parse_tf_config(text) if text.strip() else None


@dataclasses.dataclass(frozen=True)
class TaskRole:
    """One task's place in a job, from TF_CONFIG and/or explicit arguments.

    ps_hosts / worker_hosts: comma-joined host:port ("" when the job has none);
    chief_host: host:port or ""; task_type / task_index: this task (task_type None when
    neither TF_CONFIG nor an argument named it); source: "TF_CONFIG", "arguments" or
    "TF_CONFIG and arguments".
    """

    ps_hosts: str
    worker_hosts: str
    chief_host: str
    task_type: str = None
    task_index: int = 0
    source: str = "arguments"

    @property
    def parameter_server_job(self):
        return bool(self.ps_hosts)

    @property
    def address(self):
        hosts = {"ps": self.ps_hosts, "worker": self.worker_hosts, "chief": self.chief_host}.get(self.task_type, "")
        hosts = hosts.split(",") if hosts else []
        return hosts[self.task_index] if self.task_index < len(hosts) else None

    def cluster_config(self):
        """The `ttf.distribute.ClusterConfig` of this parameter-server job (for `ParameterServers`);
        raises TFConfigError for a synchronous job."""
        if not (self.ps_hosts and self.worker_hosts and self.chief_host):
            raise TFConfigError(f"a parameter-server job needs ps, worker and chief tasks; {self.source} gives "
                                f"ps [{self.ps_hosts}], worker [{self.worker_hosts}], chief [{self.chief_host}]")
        from ttf.distribute._cluster import ClusterConfig  # noqa: PLC0415  (imports TensorFlow: not at module load)

        return ClusterConfig(self.ps_hosts, self.worker_hosts, self.chief_host)

    def describe(self):
        """One line: this task's role, its job and where it listens (TensorFlow binds 0.0.0.0)."""
        if self.parameter_server_job:
            job = (f"a parameter-server job ({len(self.ps_hosts.split(','))} ps, "
                   f"{len(self.worker_hosts.split(','))} worker(s), chief {self.chief_host})")
        else:
            job = (f"a synchronous job ({len(self.worker_hosts.split(','))} worker(s)"
                   + (f", chief {self.chief_host})" if self.chief_host else ", worker 0 acting as chief)"))
        # Inside the private network namespace ttf's launcher makes (TTF_NETWORK=private), every
        # address is loopback: no process outside the job reaches it.
        reach = ("every address of this job's private network namespace: loopback only"
                 if os.environ.get("TTF_NETWORK") == "private" else "every address of this network namespace")
        where = (f"listens on 0.0.0.0:{self.address.rpartition(':')[2]} (cluster address {self.address}; {reach}, "
                 "TensorFlow gRPC, no authentication)" if self.address
                 else "listens on nothing (not a member of the training cluster)")
        return f"role {self.task_type} {self.task_index} of {job}, from {self.source}: {where}"


def resolve_task(tf_config=None, *, ps_hosts=None, worker_hosts=None, chief_host=None, task_type=None,
                 task_index=None, task_types=TASK_TYPES, shapes=("parameter-server", "synchronous"), names=None):
    """Merges TF_CONFIG with explicit arguments into a TaskRole.

    Args:
      tf_config: a TFConfig (e.g. from `tf_config_from_env()`), or None: the arguments alone.
      ps_hosts, worker_hosts: "host:port,host:port" or None (not given).
      chief_host: "host:port" or None. task_type: one of TASK_TYPES or None. task_index: int or None.
      task_types: the task types the caller runs; shapes: the job shapes it runs ("parameter-server",
        "synchronous"). A TF_CONFIG naming another is refused.
      names: {argument: how the caller spells it}, for error messages (default ARGUMENT_NAMES).
    Returns:
      TaskRole. Every argument given is kept; TF_CONFIG fills the rest.
    Raises:
      TFConfigError: a given argument disagrees with TF_CONFIG (the message names both values), or
        TF_CONFIG names a task type or job shape the caller does not run.

    Example:
      >>> config = parse_tf_config('{"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], "ps": ["p:2222"]}, '
      ...                          '"task": {"type": "ps", "index": 0}}')
      >>> role = resolve_task(config, worker_hosts="w:2222")
      >>> role.task_type, role.address, role.source
      ('ps', 'p:2222', 'TF_CONFIG and arguments')
    """
    names = {**ARGUMENT_NAMES, **(names or {})}
    if tf_config is not None and tf_config.shape not in shapes:
        raise TFConfigError(f"TF_CONFIG describes a {tf_config.shape} job ({', '.join(sorted(tf_config.cluster))} "
                            f"tasks); this process runs {' or '.join(shapes)} jobs")
    if tf_config is not None and tf_config.task_type not in task_types:
        hint = (" (a parameter-server job's ps and worker tasks run python -m ttf.launch.server)"
                if tf_config.parameter_server_job and tf_config.task_type in ("ps", "worker") else "")
        raise TFConfigError(f"TF_CONFIG names task {tf_config.task_type} {tf_config.task_index}; this process runs "
                            f"{' or '.join(task_types)} tasks{hint}")
    given = {"ps_hosts": ps_hosts, "worker_hosts": worker_hosts, "chief_host": chief_host,
             "task_type": task_type, "task_index": task_index}
    if tf_config is None:
        return TaskRole(ps_hosts or "", worker_hosts or "", chief_host or "", task_type,
                        0 if task_index is None else task_index, "arguments")
    from_config = {"ps_hosts": tf_config.hosts("ps"), "worker_hosts": tf_config.hosts("worker"),
                   "chief_host": tf_config.hosts("chief"), "task_type": tf_config.task_type,
                   "task_index": tf_config.task_index}
    for name, value in given.items():
        if value is None or value == "":
            continue
        normal = ",".join(h for h in value.split(",") if h) if name.endswith("hosts") else value
        if normal != from_config[name]:
            said = from_config[name] if from_config[name] != "" else "nothing"
            raise TFConfigError(f"TF_CONFIG and {names[name]} disagree: {names[name]} {value}, TF_CONFIG "
                                f"{said}. Give one of them, or make them agree")
    merged = {name: (given[name] if given[name] not in (None, "") else from_config[name]) for name in given}
    source = "TF_CONFIG and arguments" if any(v not in (None, "") for v in given.values()) else "TF_CONFIG"
    return TaskRole(**merged, source=source)


def _shell_main(argv):
    """`python _tf_config.py --shell [--ps-hosts H] [--worker-hosts H] [--chief-host H] [--role R] [--index I]`:
    prints shell assignments of the merged role (for start_all.sh); exit 2 with one line on error."""
    import argparse

    parser = argparse.ArgumentParser(description="Prints this task's role from $TF_CONFIG as shell assignments.")
    parser.add_argument("--shell", action="store_true", required=True)
    for flag in ("--ps-hosts", "--worker-hosts", "--chief-host", "--role"):
        parser.add_argument(flag, default=None)
    parser.add_argument("--index", type=int, default=None)
    args = parser.parse_args(argv)
    names = {"ps_hosts": "--ps-hosts", "worker_hosts": "--worker-hosts", "chief_host": "--chief-host",
             "task_type": "--role", "task_index": "--index"}
    try:
        role = resolve_task(tf_config_from_env(), ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
                            chief_host=args.chief_host, task_type=args.role, task_index=args.index, names=names)
    except TFConfigError as err:
        print(err, file=sys.stderr)
        return 2
    values = {"role": role.task_type or "", "index": role.task_index, "ps_hosts": role.ps_hosts,
              "worker_hosts": role.worker_hosts, "chief_host": role.chief_host,
              "job_shape": "parameter-server" if role.parameter_server_job else "synchronous",
              "role_line": role.describe()}
    for name, value in values.items():
        print(f"{name}={shlex.quote(str(value))}")
    return 0


if __name__ == "__main__":
    sys.exit(_shell_main(sys.argv[1:]))
