"""Cluster description and chief-side connection for ParameterServerStrategy."""
import dataclasses
import socket

import tensorflow as tf


def _hosts(value):
    if isinstance(value, str):
        value = [h for h in value.split(",") if h]
    hosts = tuple(value)
    for host in hosts:
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"a task address must be host:port, got {host!r}")
    return hosts


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """ps_hosts / worker_hosts: "h:p,h:p" strings or lists; chief_host: "h:p"."""

    ps_hosts: tuple
    worker_hosts: tuple
    chief_host: str

    def __post_init__(self):
        object.__setattr__(self, "ps_hosts", _hosts(self.ps_hosts))
        object.__setattr__(self, "worker_hosts", _hosts(self.worker_hosts))
        _hosts([self.chief_host])
        if not self.ps_hosts or not self.worker_hosts:
            raise ValueError("a parameter-server job needs at least one ps and one worker")

    def cluster_spec(self):
        return tf.train.ClusterSpec({"chief": [self.chief_host], "worker": list(self.worker_hosts),
                                     "ps": list(self.ps_hosts)})

    def ps_devices(self):
        return [f"/job:ps/replica:0/task:{i}" for i in range(len(self.ps_hosts))]

    def shape(self):
        return {"ps": len(self.ps_hosts), "workers": len(self.worker_hosts)}


def make_coordinator(config):
    """Connects this process as the chief: returns (strategy, coordinator)."""
    from ttf._ops import ops

    ops()  # ttf's op definitions must be known here to build graphs that run on the servers
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        config.cluster_spec(), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator


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
