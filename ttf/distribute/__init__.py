"""Parameter-server clusters on TensorFlow's own runtime.

`ClusterConfig` describes the job (chief, workers, parameter servers as host:port);
`python -m ttf.distribute.server` starts one ps or worker task (ttf's ops loaded first, so
its kernels run there); `make_coordinator` connects the chief with ParameterServerStrategy
and a ClusterCoordinator. ttf tables are sharded over `config.ps_devices()`.
`error_summary` turns a TensorFlow error into the one line a job log needs. `StepAttempts`
tells a job when the coordinator ran a lost worker's step again (exactly-once streams).
`TFCollectives` is the collectives of a synchronous job on TensorFlow's own collective ops
(docs/sync.md); ttf.distribute.sync shards tables over it.
"""
from ttf._errors import error_summary
from ttf.distribute._cluster import ClusterConfig, free_ports, make_coordinator
from ttf.distribute._collectives import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                         LostWorkerError, TFCollectives)
from ttf.distribute._attempts import StepAttempts
from ttf.distribute._stop import StopOnSignal

__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "CollectiveMisuseError", "Collectives", "LostWorkerError", "TFCollectives",
           "ClusterConfig", "StepAttempts", "StopOnSignal", "error_summary", "free_ports", "make_coordinator"]
