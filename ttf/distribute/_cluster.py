"""The one cluster type: a job's tasks and this process's place in them.

`Cluster` is what every topology (`ParameterServers`, `SyncWorkers`), `TFCollectives` and the
servers (`python -m ttf.launch.server`) take, as every tf.distribute strategy takes a
ClusterResolver. It is made from TF_CONFIG (TensorFlow's convention, which Kubernetes launchers,
Vertex AI, SageMaker and Ray set), from flags, or from a tf.distribute ClusterResolver:

    Cluster(ps_hosts, worker_hosts, chief_host)                  a parameter-server job (the chief's view)
    Cluster(worker_hosts="w0:2222,w1:2222", task_type="worker", task_index=1)   a synchronous job
    Cluster.from_tf_config(text) / Cluster.from_env()            TF_CONFIG's JSON
    Cluster.from_flags(Cluster.from_env(), worker_hosts=..., ...) flags, TF_CONFIG filling in the rest
    Cluster.from_resolver(resolver)                              any tf.distribute ClusterResolver

    {"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
     "task": {"type": "worker", "index": 1}}

Two job shapes are recognised: a parameter-server job (chief + workers + ps) and a synchronous
job (workers only, worker 0 acting as chief, or chief + workers), as MultiWorkerMirroredStrategy
reads it. An evaluator task may be named with or without an entry in the cluster; it is never
part of the training cluster. A bad TF_CONFIG, or flags that contradict it, is one ClusterError
line naming the cause and the fix.

This module imports neither TensorFlow nor the rest of ttf, so a launcher runs it without
loading TensorFlow (ttf/launch/tf_config.py: a fraction of a second).
"""
import dataclasses
import json
import os
import socket

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
SHAPES = ("parameter-server", "synchronous")
# Names older launchers used for TensorFlow's task types, named in the error as the fix.
_RENAMED = {"master": "chief"}
# How from_flags' arguments are named in its errors; a command line passes its own flags' names.
ARGUMENT_NAMES = {"ps_hosts": "ps_hosts=", "worker_hosts": "worker_hosts=", "chief_host": "chief_host=",
                  "task_type": "task_type=", "task_index": "task_index="}


class ClusterError(ValueError):
    """TF_CONFIG is not JSON or not TensorFlow's shape, flags contradict it, or a task address is bad."""


def _hosts(value):
    """"h:p,h:p", a list or None -> a tuple of host:port."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [h for h in value.split(",") if h]
    hosts = tuple(value)
    for host in hosts:
        name, _, port = str(host).rpartition(":")
        if not name or not port.isdigit():
            raise ClusterError(f"a task address must be host:port, got {host!r}")
    return hosts


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A job's tasks (host:port each) and this process's task.

    Attributes:
      ps_hosts, worker_hosts: tuples of host:port ("h:p,h:p" strings or lists are accepted).
      chief_host: host:port or "" (none). evaluator_host: host:port or "".
      task_type: this process's task type ("chief", "worker", "ps", "evaluator"), or None when
        nothing named it (a parameter-server chief's script may leave it out).
      task_index: this process's index within its task type.
      source: where it came from: "arguments", "TF_CONFIG", "TF_CONFIG and arguments" or
        "a ClusterResolver".
    """

    ps_hosts: tuple = ()
    worker_hosts: tuple = ()
    chief_host: str = ""
    task_type: str = None
    task_index: int = 0
    source: str = "arguments"
    evaluator_host: str = ""

    def __post_init__(self):
        object.__setattr__(self, "ps_hosts", _hosts(self.ps_hosts))
        object.__setattr__(self, "worker_hosts", _hosts(self.worker_hosts))
        for name in ("chief_host", "evaluator_host"):
            value = getattr(self, name) or ""
            _hosts([value] if value else [])
            object.__setattr__(self, name, value)
        if self.task_type is not None and self.task_type not in TASK_TYPES:
            raise ClusterError(f"task_type must be one of {', '.join(TASK_TYPES)}, got {self.task_type!r}")
        if isinstance(self.task_index, bool) or not isinstance(self.task_index, int) or self.task_index < 0:
            raise ClusterError(f"task_index must be an integer >= 0, got {self.task_index!r}")

    # -- made from TF_CONFIG, flags or a ClusterResolver

    @classmethod
    def from_tf_config(cls, text):
        """TF_CONFIG's JSON text -> Cluster; ClusterError naming what is wrong and how to fix it."""
        return _parse_tf_config(cls, text)

    @classmethod
    def from_env(cls, environ=None):
        """The Cluster of $TF_CONFIG, or None when it is unset or empty."""
        text = (os.environ if environ is None else environ).get("TF_CONFIG", "")
        return cls.from_tf_config(text) if text.strip() else None

    @classmethod
    def from_resolver(cls, resolver):
        """The Cluster of a tf.distribute ClusterResolver (TFConfigClusterResolver,
        SimpleClusterResolver, SlurmClusterResolver, ...)."""
        spec = resolver.cluster_spec().as_dict()
        rpc_layer = getattr(resolver, "rpc_layer", None) or "grpc"
        if rpc_layer != "grpc":
            raise ClusterError(f"the ClusterResolver's rpc_layer is {rpc_layer!r}: ttf's jobs run over TensorFlow's "
                               "gRPC only; make it with rpc_layer=\"grpc\"")
        unknown = sorted(set(spec) - set(TASK_TYPES))
        if unknown:
            raise ClusterError(f"the ClusterResolver names the unknown task type {unknown[0]!r}; TensorFlow's task "
                               f"types are {', '.join(TASK_TYPES)}")
        tasks = {name: [spec[name][i] for i in sorted(spec[name])] if isinstance(spec[name], dict) else spec[name]
                 for name in spec}
        return cls(tasks.get("ps", ()), tasks.get("worker", ()), _one(tasks, "chief"), resolver.task_type,
                   int(resolver.task_id or 0), "a ClusterResolver", _one(tasks, "evaluator"))

    @classmethod
    def from_launcher_flags(cls, args, role_flag):
        """TF_CONFIG merged with a launcher's flags: argparse `args` with ps_hosts, worker_hosts,
        chief_host, index, and the task type under `role_flag` ("--job", "--role"); errors name the flags."""
        role = role_flag.lstrip("-").replace("-", "_")
        names = {"ps_hosts": "--ps-hosts", "worker_hosts": "--worker-hosts", "chief_host": "--chief-host",
                 "task_type": role_flag, "task_index": "--index"}
        return cls.from_flags(cls.from_env(), ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
                              chief_host=args.chief_host, task_type=getattr(args, role), task_index=args.index,
                              names=names)

    @classmethod
    def from_flags(cls, tf_config=None, *, ps_hosts=None, worker_hosts=None, chief_host=None, task_type=None,
                   task_index=None, task_types=TASK_TYPES, shapes=SHAPES, names=None):
        """Merges TF_CONFIG (a Cluster from `from_env()`, or None) with flags into a Cluster.

        Args:
          ps_hosts, worker_hosts: "host:port,host:port" or None (not given).
          chief_host: "host:port" or None. task_type: one of TASK_TYPES or None. task_index: int or None.
          task_types: the task types the caller runs; shapes: the job shapes it runs ("parameter-server",
            "synchronous"). A TF_CONFIG naming another is refused.
          names: {argument: how the caller spells it}, for error messages (default ARGUMENT_NAMES).
        Returns:
          Cluster. Every flag given is kept; TF_CONFIG fills the rest.
        Raises:
          ClusterError: a flag disagrees with TF_CONFIG (the message names both values), or TF_CONFIG
            names a task type or job shape the caller does not run.

        Example:
          >>> config = Cluster.from_tf_config('{"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], '
          ...                                 '"ps": ["p:2222"]}, "task": {"type": "ps", "index": 0}}')
          >>> cluster = Cluster.from_flags(config, worker_hosts="w:2222")
          >>> cluster.task_type, cluster.address, cluster.source
          ('ps', 'p:2222', 'TF_CONFIG and arguments')
        """
        names = {**ARGUMENT_NAMES, **(names or {})}
        given = {"ps_hosts": ps_hosts, "worker_hosts": worker_hosts, "chief_host": chief_host,
                 "task_type": task_type, "task_index": task_index}
        if tf_config is None:
            return cls(ps_hosts, worker_hosts, chief_host or "", task_type, 0 if task_index is None else task_index)
        _check_runs(tf_config, task_types, shapes)
        from_config = {"ps_hosts": tf_config.hosts("ps"), "worker_hosts": tf_config.hosts("worker"),
                       "chief_host": tf_config.chief_host, "task_type": tf_config.task_type,
                       "task_index": tf_config.task_index}
        for name, value in given.items():
            if value is None or value == "":
                continue
            normal = ",".join(h for h in value.split(",") if h) if name.endswith("hosts") else value
            if normal != from_config[name]:
                said = from_config[name] if from_config[name] != "" else "nothing"
                raise ClusterError(f"TF_CONFIG and {names[name]} disagree: {names[name]} {value}, TF_CONFIG "
                                   f"{said}. Give one of them, or make them agree")
        merged = {name: (given[name] if given[name] not in (None, "") else from_config[name]) for name in given}
        source = "TF_CONFIG and arguments" if any(v not in (None, "") for v in given.values()) else "TF_CONFIG"
        return dataclasses.replace(tf_config, **merged, source=source)

    # -- what it says

    @property
    def cluster(self):
        """{task type: (host:port, ...)} for the task types present."""
        tasks = {"chief": (self.chief_host,) if self.chief_host else (), "worker": self.worker_hosts,
                 "ps": self.ps_hosts, "evaluator": (self.evaluator_host,) if self.evaluator_host else ()}
        return {name: hosts for name, hosts in tasks.items() if hosts}

    def spec(self):
        """{task type: [host:port, ...]} of the training tasks: tf.train.ClusterSpec's input."""
        return {name: list(hosts) for name, hosts in self.cluster.items() if name != "evaluator"}

    def hosts(self, task_type):
        """The comma-joined host:port list of `task_type` ("" when absent)."""
        return ",".join(self.cluster.get(task_type, ()))

    @property
    def parameter_server_job(self):
        return bool(self.ps_hosts)

    @property
    def shape(self):
        """'parameter-server' or 'synchronous'."""
        return "parameter-server" if self.parameter_server_job else "synchronous"

    @property
    def address(self):
        """This task's host:port, or None (an evaluator outside the cluster, or no task named)."""
        tasks = self.cluster.get(self.task_type, ())
        return tasks[self.task_index] if self.task_index < len(tasks) else None

    @property
    def is_chief(self):
        """The task that coordinates: the chief, or worker 0 of a cluster without one."""
        if self.chief_host:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    def ranks(self):
        """The hosts of a synchronous job in rank order: the chief (if any), then the workers."""
        return ((self.chief_host,) if self.chief_host else ()) + self.worker_hosts

    @property
    def rank(self):
        """This task's rank in a synchronous job (the chief is rank 0); ClusterError when this task
        is none of its chief and workers."""
        chief = 1 if self.chief_host else 0
        if self.task_type == "chief" and chief:
            return 0
        if self.task_type == "worker" and self.task_index < len(self.worker_hosts):
            return chief + self.task_index
        raise ClusterError(f"this task ({self.task_type} {self.task_index}) is not a chief or worker of the cluster "
                           f"{self.spec()}: name it (task_type=\"worker\", task_index=i, or TF_CONFIG's task)")

    def ps_devices(self):
        return [f"/job:ps/replica:0/task:{i}" for i in range(len(self.ps_hosts))]

    def job_shape(self):
        """The topology as a job's metrics report it."""
        return {"ps": len(self.ps_hosts), "workers": len(self.worker_hosts)}

    def require_parameter_servers(self, what="a parameter-server job"):
        """Raises ClusterError unless this is a parameter-server job (ps, workers and a chief)."""
        if not (self.ps_hosts and self.worker_hosts and self.chief_host):
            raise ClusterError(f"{what} needs ps, worker and chief tasks; {self.source} gives ps [{self.hosts('ps')}], "
                               f"worker [{self.hosts('worker')}], chief [{self.chief_host}]")

    def describe(self):
        """One line: this task's role, its job and where it listens (TensorFlow binds 0.0.0.0)."""
        if self.parameter_server_job:
            job = (f"a parameter-server job ({len(self.ps_hosts)} ps, {len(self.worker_hosts)} worker(s), "
                   f"chief {self.chief_host})")
        else:
            job = (f"a synchronous job ({len(self.worker_hosts)} worker(s)"
                   + (f", chief {self.chief_host})" if self.chief_host else ", worker 0 acting as chief)"))
        # Inside the private network namespace ttf's launcher makes (TTF_NETWORK=private), every
        # address is loopback: no process outside the job reaches it.
        reach = ("every address of this job's private network namespace: loopback only"
                 if os.environ.get("TTF_NETWORK") == "private" else "every address of this network namespace")
        where = (f"listens on 0.0.0.0:{self.address.rpartition(':')[2]} (cluster address {self.address}; {reach}, "
                 "TensorFlow gRPC, no authentication)" if self.address
                 else "listens on nothing (not a member of the training cluster)")
        return f"role {self.task_type} {self.task_index} of {job}, from {self.source}: {where}"

    def to_json(self):
        """This cluster as TF_CONFIG's JSON."""
        return json.dumps({"cluster": {k: list(v) for k, v in self.cluster.items()},
                           "task": {"type": self.task_type, "index": self.task_index}})


def _one(tasks, task_type):
    hosts = list(tasks.get(task_type, ()))
    if len(hosts) > 1:
        raise ClusterError(f"the cluster has {len(hosts)} {task_type} tasks; a job has at most one")
    return hosts[0] if hosts else ""


def _check_runs(tf_config, task_types, shapes):
    """Refuses a TF_CONFIG whose job shape or task type this process does not run."""
    if tf_config.shape not in shapes:
        raise ClusterError(f"TF_CONFIG describes a {tf_config.shape} job ({', '.join(sorted(tf_config.cluster))} "
                           f"tasks); this process runs {' or '.join(shapes)} jobs")
    if tf_config.task_type not in task_types:
        hint = (" (a parameter-server job's ps and worker tasks run python -m ttf.launch.server)"
                if tf_config.parameter_server_job and tf_config.task_type in ("ps", "worker") else "")
        raise ClusterError(f"TF_CONFIG names task {tf_config.task_type} {tf_config.task_index}; this process runs "
                           f"{' or '.join(task_types)} tasks{hint}")


def _address(value, where):
    if not isinstance(value, str):
        raise ClusterError(f"TF_CONFIG {where} must be a \"host:port\" string, got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"TF_CONFIG {where} must be host:port with a port 1..65535, got {value!r}")
    return value


def _known_type(name, where):
    if name in TASK_TYPES:
        return name
    fix = f"; {name!r} is the old name of {_RENAMED[name]!r}: rename it" if name in _RENAMED else ""
    raise ClusterError(f"TF_CONFIG {where} names the unknown task type {name!r}; TensorFlow's task types "
                       f"are {', '.join(TASK_TYPES)}{fix}")


def _load(text):
    """TF_CONFIG's JSON -> (its cluster object, its task object), checked for TensorFlow's shape."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"TF_CONFIG is not JSON ({err}); it must be "
                           '{"cluster": {"worker": ["host:port", ...], ...}, "task": {"type": ..., "index": ...}}') from None
    if not isinstance(config, dict):
        raise ClusterError(f"TF_CONFIG must be a JSON object with \"cluster\" and \"task\", got {type(config).__name__}")
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer != "grpc":
        raise ClusterError(f"TF_CONFIG rpc_layer {rpc_layer!r}: ttf's jobs run over TensorFlow's gRPC only; "
                           "drop rpc_layer or set it to \"grpc\"")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"TF_CONFIG needs a non-empty \"cluster\" object (task type -> list of host:port), "
                           f"got {cluster!r}")
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterError(f"TF_CONFIG needs a \"task\" object with \"type\" and \"index\", got {task!r}")
    return cluster, task


def _tasks(cluster_in):
    """TF_CONFIG's cluster object -> {task type: (host:port, ...)}, every address checked and distinct."""
    tasks, seen = {}, {}
    for task_type, addresses in cluster_in.items():
        _known_type(task_type, "cluster")
        if not isinstance(addresses, list) or not addresses:
            raise ClusterError(f"TF_CONFIG cluster {task_type!r} must be a non-empty list of \"host:port\" "
                               f"(index i is task i), got {addresses!r}")
        for index, address in enumerate(addresses):
            _address(address, f"cluster {task_type}[{index}]")
            if address in seen:
                raise ClusterError(f"TF_CONFIG gives {address} to both {seen[address]} and {task_type} {index}: "
                                   "every task needs an address of its own")
            seen[address] = f"{task_type} {index}"
        tasks[task_type] = tuple(addresses)
    return tasks


def _parse_tf_config(cls, text):
    cluster_in, task = _load(text)
    tasks = _tasks(cluster_in)
    task_type = _known_type(task["type"], "task")
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ClusterError(f"TF_CONFIG task index must be an integer >= 0, got {index!r}")
    count = len(tasks.get(task_type, ()))
    if task_type != "evaluator" and index >= count:
        raise ClusterError(f"TF_CONFIG names task {task_type} {index}, but its cluster has "
                           f"{count} {task_type} task(s)" + ("" if count else f": add \"{task_type}\" to the cluster"))
    for single in ("chief", "evaluator"):
        if len(tasks.get(single, ())) > 1:
            raise ClusterError(f"TF_CONFIG cluster has {len(tasks[single])} {single} tasks; a job has at most one")
    if "worker" not in tasks:
        raise ClusterError("TF_CONFIG cluster has no \"worker\" tasks; a job needs at least one worker "
                           "(a parameter-server job: chief, worker and ps; a synchronous job: worker, optionally chief)")
    if "ps" in tasks and "chief" not in tasks:
        raise ClusterError("TF_CONFIG cluster has ps tasks but no \"chief\"; a parameter-server job needs one "
                           "chief to coordinate its workers")
    return cls(tasks.get("ps", ()), tasks["worker"], tasks.get("chief", ("",))[0], task_type, index, "TF_CONFIG",
               tasks.get("evaluator", ("",))[0])


def free_ports(count, host="127.0.0.1"):
    """`count` distinct TCP ports free on `host` right now."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind((host, 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def cluster_of(value, what):
    """A Cluster from a Cluster, a tf.distribute ClusterResolver, or None ($TF_CONFIG); `what`
    (the caller) is named when none is given."""
    if isinstance(value, Cluster):
        return value
    if value is not None and hasattr(value, "cluster_spec"):
        return Cluster.from_resolver(value)
    if value is not None:
        raise ClusterError(f"{what} takes a ttf.distribute.Cluster or a tf.distribute ClusterResolver, "
                           f"got {type(value).__name__}")
    cluster = Cluster.from_env()
    if cluster is None:
        raise ClusterError(f"{what} needs a cluster: pass a ttf.distribute.Cluster (from flags, e.g. "
                           "Cluster(worker_hosts=\"h:p,h:p\", task_type=\"worker\", task_index=i)), a tf.distribute "
                           "ClusterResolver, or set TF_CONFIG")
    return cluster
