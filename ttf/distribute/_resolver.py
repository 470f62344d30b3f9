"""A Cluster as TensorFlow takes it (a ClusterSpec, a ClusterResolver), and the parameter-server
chief's connection to its cluster."""
import tensorflow as tf

from ttf._ops import ops


def cluster_resolver(cluster, task_type=None, task_id=None):
    """The tf.distribute ClusterResolver of `cluster` (a ttf.distribute.Cluster), as this task
    (default: the cluster's own task)."""
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.spec()), task_type=task_type or cluster.task_type,
        task_id=cluster.task_index if task_id is None else task_id, rpc_layer="grpc")


def make_coordinator(cluster):
    """Connects this process as the chief of a parameter-server `cluster`: returns (strategy, coordinator)."""
    ops()  # ttf's op definitions must be known here to build graphs that run on the servers
    strategy = tf.distribute.experimental.ParameterServerStrategy(cluster_resolver(cluster, "chief", 0))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator
