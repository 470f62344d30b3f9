"""Starts one ps or worker task of a parameter-server job and serves until killed.

    python -m ttf.distribute.server --job ps --index 0 \\
        --ps-hosts 10.0.0.1:2222 --worker-hosts 10.0.0.2:2222,10.0.0.3:2222 --chief-host 10.0.0.4:2222

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
from ttf.distribute._cluster import ClusterConfig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True, choices=["ps", "worker"], help="this task's job")
    parser.add_argument("--index", type=int, required=True, help="this task's index within its job")
    parser.add_argument("--ps-hosts", required=True, help="comma-separated host:port of every ps task")
    parser.add_argument("--worker-hosts", required=True, help="comma-separated host:port of every worker task")
    parser.add_argument("--chief-host", required=True, help="host:port of the chief")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="also import MODULE before starting, so its ops run here too "
                             "(e.g. tensorflow_recommenders_addons.dynamic_embedding for TFRA jobs); repeatable")
    args = parser.parse_args(argv)
    try:
        config = ClusterConfig(args.ps_hosts, args.worker_hosts, args.chief_host)
    except ValueError as err:
        parser.error(str(err))
    tasks = config.ps_hosts if args.job == "ps" else config.worker_hosts
    if not 0 <= args.index < len(tasks):
        parser.error(f"--index {args.index} is outside the {len(tasks)} {args.job} task(s)")
    ops()
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as err:
            parser.error(f"--import {module}: {err}")
    server = tf.distribute.Server(config.cluster_spec(), job_name=args.job, task_index=args.index,
                                  protocol="grpc", start=True)
    loaded = ", ".join(["ttf ops"] + args.imports)
    port = tasks[args.index].rpartition(":")[2]
    # TensorFlow binds every server to 0.0.0.0: say so, the address in the cluster is only a name.
    print(f"[{args.job}:{args.index}] ready at {tasks[args.index]} ({loaded} loaded); listening on 0.0.0.0:{port} "
          "(every address of this network namespace; TensorFlow gRPC, no authentication)", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
