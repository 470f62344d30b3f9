"""Launchers: what starts the processes of a job, apart from the runtime that trains.

    python -m ttf.launch.server      one ps or worker task of a parameter-server job (flags or TF_CONFIG)
    python -m ttf.launch.hvdrun      this host's ranks of a multi-host Horovod job, without ssh
    python ttf/launch/private_network.py -- COMMAND    COMMAND in a private network namespace
    python ttf/launch/tf_config.py --shell             this task's role from TF_CONFIG, as shell assignments

The last two run by path and use only the standard library (no TensorFlow: a fraction of a second).
"""
