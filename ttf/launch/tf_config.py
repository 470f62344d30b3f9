"""The TF_CONFIG command: prints this task's role, merged from $TF_CONFIG and flags, as shell
assignments (start_all.sh evals them); a bad TF_CONFIG, or flags that contradict it, exits 2
with one line naming the cause and the fix.

    python ttf/launch/tf_config.py --shell [--ps-hosts H] [--worker-hosts H] [--chief-host H] [--role R] [--index I]

Run it by path, not with `python -m`: it loads ttf/distribute/_cluster.py alone (the standard
library only), while importing the ttf package would load TensorFlow (seconds) before every job.
"""
import argparse
import os
import shlex
import sys

if __package__:  # imported as ttf.launch.tf_config
    from ttf.distribute._cluster import Cluster, ClusterError
else:  # run by path: the cluster module alone, without the ttf package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distribute"))
    from _cluster import Cluster, ClusterError  # pylint: disable=import-error


def main(argv=None):
    parser = argparse.ArgumentParser(description="Prints this task's role from $TF_CONFIG as shell assignments.")
    parser.add_argument("--shell", action="store_true", required=True)
    for flag in ("--ps-hosts", "--worker-hosts", "--chief-host", "--role"):
        parser.add_argument(flag, default=None)
    parser.add_argument("--index", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        role = Cluster.from_launcher_flags(args, "--role")
    except ClusterError as err:
        print(err, file=sys.stderr)
        return 2
    values = {"role": role.task_type or "", "index": role.task_index, "ps_hosts": role.hosts("ps"),
              "worker_hosts": role.hosts("worker"), "chief_host": role.chief_host, "job_shape": role.shape,
              "role_line": role.describe()}
    for name, value in values.items():
        print(f"{name}={shlex.quote(str(value))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
