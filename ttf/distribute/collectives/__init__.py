"""The collectives of a synchronous job: one interface, `Collectives`, and its backends.

`TFCollectives` runs it on TensorFlow's own collective ops (MultiWorkerMirroredStrategy's
cluster, any TensorFlow from 2.16); `horovod.HorovodCollectives` on Horovod (imports horovod:
never imported here). `sync` is the user-facing API over any backend: shard a model's tables,
average the dense gradients, slice the global batch. Every mechanic is written once over the
interface (ttf/distribute/_table_sharding.py, ttf/distribute/_ranks.py).
"""
from ttf.distribute.collectives._tf import (COLLECTIVE_TIMEOUT_SECONDS, CollectiveMisuseError, Collectives,
                                            LostWorkerError, TFCollectives)
from ttf.distribute.collectives._wire import COMPRESSIONS

__all__ = ["COLLECTIVE_TIMEOUT_SECONDS", "COMPRESSIONS", "CollectiveMisuseError", "Collectives", "LostWorkerError",
           "TFCollectives"]
