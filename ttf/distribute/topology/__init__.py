"""Where a job runs, and how its steps run there.

`Topology` is the public face (scope, rank, num_ranks, is_chief); `JobMechanics` the protocol
`ttf.distribute.Job` uses (_face.py). The topologies (_topologies.py) are siblings:
`OneProcess` and `ParameterServers` (a job one process runs), `HorovodRanks` and `SyncWorkers`
(ranks of a synchronous job, whose mechanics are ttf/distribute/_ranks.py's). Each picks a
step runner (_steps.py): each step in this process, or scheduled on a parameter-server job's
workers, whose re-run steps `StepAttempts` (_attempts.py) counts.
"""
from ttf.distribute.topology._attempts import StepAttempts
from ttf.distribute.topology._face import JobMechanics, Topology
from ttf.distribute.topology._topologies import (JOB_COLLECTIVE_TIMEOUT_SECONDS, HorovodRanks, OneProcess,
                                                 ParameterServers, SynchronousRanks, SyncWorkers)

__all__ = ["HorovodRanks", "JOB_COLLECTIVE_TIMEOUT_SECONDS", "JobMechanics", "OneProcess", "ParameterServers",
           "StepAttempts", "SyncWorkers", "SynchronousRanks", "Topology"]
