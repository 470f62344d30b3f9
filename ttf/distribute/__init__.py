"""The job runtime (`Job`, ttf/distribute/job/) over its topologies (`OneProcess`,
`ParameterServers`, `HorovodRanks`, `SyncWorkers`, ttf/distribute/topology/), and the cluster
and collectives they run on.

`Job` trains any Keras model with ttf tables on a topology: `OneProcess`, `ParameterServers`
(ParameterServerStrategy), `SyncWorkers` (TensorFlow's collectives) or `HorovodRanks`.
`Cluster` is the one cluster type every topology and server takes, made from flags, TF_CONFIG
(as Kubernetes launchers, Vertex AI, SageMaker and Ray set it) or a tf.distribute
ClusterResolver; a bad one is a `ClusterError` line naming the fix. `make_coordinator`
connects a parameter-server chief. `error_summary` turns a TensorFlow error into the one line a
job log needs. `StepAttempts` tells a job when the coordinator ran a lost worker's step again
(exactly-once streams). The collectives of a synchronous job are in ttf.distribute.collectives
(`TFCollectives`; docs/sync.md); the launchers (servers, hvdrun, the private network) in ttf.launch.
"""
from ttf._errors import error_summary
from ttf.distribute._cluster import TASK_TYPES, Cluster, ClusterError, free_ports
from ttf.distribute._resolver import make_coordinator
from ttf.distribute.collectives import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                        LostWorkerError, TFCollectives)
from ttf.distribute._errors import BadInputError, JobError, LostParameterServerError, LostRankError, SaveFailedError
from ttf.distribute.topology import HorovodRanks, OneProcess, ParameterServers, StepAttempts, SyncWorkers, Topology
from ttf.distribute.job import Job, JobConfig, PublishConfig, StopOnSignal, sigmoid_cross_entropy, tier_progress

# Earlier names (users' scripts): the one cluster type and its constructors.
ClusterConfig = TFConfig = TaskRole = Cluster
TFConfigError = ClusterError
parse_tf_config, tf_config_from_env, resolve_task = Cluster.from_tf_config, Cluster.from_env, Cluster.from_flags

__all__ = ["BadInputError", "COLLECTIVE_TIMEOUT_SECONDS", "Cluster", "ClusterConfig", "ClusterError",
           "CollectiveMisuseError", "Collectives", "HorovodRanks", "Job", "JobConfig", "JobError",
           "LostParameterServerError", "LostRankError", "LostWorkerError",
           "OneProcess", "ParameterServers", "PublishConfig", "SaveFailedError", "StepAttempts", "StopOnSignal",
           "TASK_TYPES", "Topology", "TFCollectives", "TFConfig", "TFConfigError", "TaskRole", "error_summary", "free_ports",
           "make_coordinator", "parse_tf_config", "resolve_task", "sigmoid_cross_entropy", "SyncWorkers", "tf_config_from_env",
           "tier_progress"]
