"""Parameter-server clusters on TensorFlow's own runtime.

`ClusterConfig` describes the job (chief, workers, parameter servers as host:port);
`python -m ttf.launch.server` starts one ps or worker task (ttf's ops loaded first, so
its kernels run there); `make_coordinator` connects the chief with ParameterServerStrategy
and a ClusterCoordinator. ttf tables are sharded over `config.ps_devices()`.
`error_summary` turns a TensorFlow error into the one line a job log needs. `StepAttempts`
tells a job when the coordinator ran a lost worker's step again (exactly-once streams).
`tf_config_from_env` / `resolve_task` read TF_CONFIG (the cluster and this task's role, as
Kubernetes launchers, Vertex AI, SageMaker and Ray set it) and merge it with explicit arguments.
`TFCollectives` is the collectives of a synchronous job on TensorFlow's own collective ops
(docs/sync.md); ttf.distribute.collectives.sync shards tables over it, and `SyncWorkers` is the job topology on it.
"""
from ttf._errors import error_summary
from ttf.distribute._cluster import ClusterConfig, free_ports, make_coordinator
from ttf.distribute.collectives._tf import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                         LostWorkerError, TFCollectives)
from ttf.distribute._attempts import StepAttempts
from ttf.distribute._stop import StopOnSignal
from ttf.distribute._config import JobConfig, PublishConfig
from ttf.distribute._errors import BadInputError, JobError, LostParameterServerError, LostRankError, SaveFailedError
from ttf.distribute._topology import HorovodRanks, OneProcess, ParameterServers, SyncWorkers
from ttf.distribute._job import Job, sigmoid_cross_entropy, tier_progress
from ttf.launch.tf_config import (TASK_TYPES, TaskRole, TFConfig, TFConfigError, parse_tf_config, resolve_task,
                                       tf_config_from_env)

__all__ = ["BadInputError", "COLLECTIVE_TIMEOUT_SECONDS", "ClusterConfig", "CollectiveMisuseError", "Collectives",
           "HorovodRanks", "Job", "JobConfig", "JobError", "LostParameterServerError", "LostRankError", "LostWorkerError",
           "OneProcess", "ParameterServers", "PublishConfig", "SaveFailedError", "StepAttempts", "StopOnSignal",
           "TASK_TYPES", "TFCollectives", "TFConfig", "TFConfigError", "TaskRole", "error_summary", "free_ports",
           "make_coordinator", "parse_tf_config", "resolve_task", "sigmoid_cross_entropy", "SyncWorkers", "tf_config_from_env",
           "tier_progress"]
