"""Starts one ps or worker task of a parameter-server job and serves until killed.

    python -m ttf.launch.server --job ps --index 0 \\
        --ps-hosts 10.0.0.1:2222 --worker-hosts 10.0.0.2:2222,10.0.0.3:2222 --chief-host 10.0.0.4:2222
    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m ttf.launch.server

With TF_CONFIG set, the cluster and this task come from it (TensorFlow's convention, as
Kubernetes launchers set it); flags given as well must agree with it.

ttf's op library is loaded before the server starts, so the table kernels are registered in
this process. Prints one "ready" line once it listens, naming where: TensorFlow binds every
server to 0.0.0.0:<port> (every address), unauthenticated; see SECURITY.md.
"""
import argparse
import importlib
import sys

import ttf  # noqa: F401  (Keras 2 before TensorFlow is used)
import tensorflow as tf

from ttf._ops import ops
from ttf.distribute._cluster import Cluster, ClusterError

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=["ps", "worker"], help="this task's job (default: TF_CONFIG's task type)")
    parser.add_argument("--index", type=int, help="this task's index within its job (default: TF_CONFIG's)")
    parser.add_argument("--ps-hosts", help="comma-separated host:port of every ps task (default: TF_CONFIG's)")
    parser.add_argument("--worker-hosts", help="comma-separated host:port of every worker task (default: TF_CONFIG's)")
    parser.add_argument("--chief-host", help="host:port of the chief (default: TF_CONFIG's)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="also import MODULE before starting, so its ops run here too "
                             "(e.g. tensorflow_recommenders_addons.dynamic_embedding for TFRA jobs); repeatable")
    args = parser.parse_args(argv)
    try:
        cluster = Cluster.from_launcher_flags(args, "--job")
    except ClusterError as err:
        parser.error(str(err))
    if cluster.source == "arguments" and not (cluster.task_type and cluster.ps_hosts and cluster.worker_hosts
                                              and cluster.chief_host):
        parser.error("give --job, --index, --ps-hosts, --worker-hosts and --chief-host, or set TF_CONFIG")
    if cluster.task_type not in ("ps", "worker"):
        parser.error(f"this module starts a ps or worker task; TF_CONFIG names a {cluster.task_type} task")
    if not cluster.parameter_server_job:
        parser.error("TF_CONFIG names a synchronous job (workers, no ps tasks): its workers train, they serve no chief")
    job, index = cluster.task_type, cluster.task_index
    tasks = cluster.ps_hosts if job == "ps" else cluster.worker_hosts
    if not 0 <= index < len(tasks):
        parser.error(f"--index {index} is outside the {len(tasks)} {job} task(s)")
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as err:
            parser.error(f"--import {module}: {err}")
    serve(cluster, args.imports).join()
    return 0


def serve(cluster, imported=()):
    """Starts this task's server of a parameter-server `cluster` (a ttf.distribute.Cluster whose task
    is a ps or worker), ttf's ops loaded first; prints where it listens; returns the started server.
    `imported`: the modules also imported for their ops (named in the ready line)."""
    ops()
    job, index = cluster.task_type, cluster.task_index
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster.spec()), job_name=job, task_index=index,
                                  protocol="grpc", start=True)
    loaded = ", ".join(["ttf ops", *imported])
    address = cluster.address
    # TensorFlow binds every server to 0.0.0.0: say so, the address in the cluster is only a name.
    print(f"[{job}:{index}] {cluster.describe()}", flush=True)
    print(f"[{job}:{index}] ready at {address} ({loaded} loaded); listening on 0.0.0.0:{address.rpartition(':')[2]} "
          "(every address of this network namespace; TensorFlow gRPC, no authentication)", flush=True)
    return server


if __name__ == "__main__":
    sys.exit(main())
