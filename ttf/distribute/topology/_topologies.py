"""Where a job runs: one process, a parameter-server cluster, or ranks of a synchronous job.
Each topology implements both faces of ttf/distribute/topology/_face.py: `Topology` (scope,
rank, num_ranks, is_chief) and `JobMechanics`: the input shares and which one this process
reads, how the model is placed (`prepare`), how the processes agree and gather (a no-op where
one process runs the job), how each shard's rows are saved, exported and published (each
process its own rows; the chief never holds another's), and the step runner (`step_runner`:
each step here, or scheduled on a parameter-server job's workers).

    OneProcess()                       everything here
    ParameterServers(cluster)          this process is the chief of a PS job
    HorovodRanks(compression="none")   this process is one rank (imports horovod)
    SyncWorkers(cluster, compression="none")
                                       one worker of a synchronous job on TensorFlow's collectives

They are siblings over the defaults of `_Steps`: `OneProcess` and `ParameterServers` share
the mechanics of a job run by one process (`_OneLoop`), the ranks theirs over a Collectives
backend (`SynchronousRanks`); none is a special case of another.

A cluster is a `ttf.distribute.Cluster` (from flags or TF_CONFIG), a tf.distribute
ClusterResolver, or None: TF_CONFIG.
"""
import numpy as np
import tensorflow as tf

from ttf.data import open_stream as _open_stream
from ttf.data import stream_batches as _stream_batches
from ttf.distribute import _errors, _ranks, _table_sharding
from ttf.distribute._cluster import cluster_of
from ttf.distribute._resolver import make_coordinator
from ttf.distribute.collectives import LostWorkerError, TFCollectives
from ttf.distribute.collectives._wire import wire_dtype
from ttf.distribute.collectives.sync import all_workers, mean_over_examples, rank_slice
from ttf.distribute.topology._face import Topology
from ttf.distribute.topology._steps import CoordinatedSteps, LocalSteps
from ttf.embedding import table_summary as _table_summary
from ttf.embedding import tables_in
from ttf.serving import Publisher, export_for_serving


class _Steps(Topology):
    """What every topology has unless it says otherwise: it reads the input share of its
    rank and runs each step itself; no strategy, no parameter servers."""

    max_steps_per_call = 1 << 30
    num_shares = 1
    strategy = coordinator = None
    shard_devices = None
    table_note = ""  # what a progress line's table counts cover

    @property
    def share(self):
        """The input share this process reads (its rank)."""
        return self.rank

    def step_runner(self, job):
        return LocalSteps(job)


class _OneLoop(_Steps):
    """The mechanics of a job that one process runs (one process, or a parameter-server
    job's chief): every agreement and gather is the identity; the tables' shards save,
    export and publish where they live."""

    def prepare(self, model, optimizer):
        """Places `model`'s tables and returns the optimizer to train with (before the model's
        variables exist)."""
        del model
        return optimizer

    def broadcast_model(self, model):
        """Makes every process start from the chief's dense weights."""

    def all_have(self, flag):
        """True while `flag` holds on every process (e.g. every input share still has a batch)."""
        return flag

    def agree(self, value, what="agree"):
        """The chief's `value` on every process (a decision one clock takes)."""
        del what
        return value

    def gather_rows(self, array, name):
        """NumPy rows of every process, concatenated in rank order."""
        del name
        return array

    def sum_counts(self, counts):
        """{name: number} summed over the processes (each counted its own table shards)."""
        return counts

    def check_same_config(self, config, what):
        """Raises ValueError when the processes were started with different `config`."""

    def mean_loss(self):
        """`losses -> mean over every process's examples` for the training step, or None for a
        plain mean (one process)."""
        return None

    def finite_across(self):
        """`flag -> flag on every process` for the NaN guard, or None (one process)."""
        return None

    def lost(self, error):
        """The job's typed error for a TensorFlow error that means another process was lost,
        or None (one process: nothing to lose; the error is raised as it is)."""
        del error
        return None

    def open_stream(self, spec, **kwargs):
        """This process's share of a stream (ttf.data.open_stream's kwargs)."""
        return _open_stream(spec, **kwargs)

    def stream_batches(self, stream, batch_size, stop, max_steps):
        return _stream_batches(stream, batch_size, stop, max_steps=max_steps)

    def stream_progress(self, stream):
        """(the stream's progress dict, the newest event time trained) over every share."""
        return stream.update_progress(), stream.last_event_time

    def sync_positions(self, position, stream=None):
        """Every share's input (and stream) position into the chief's copy before it saves."""

    def save(self, manager, step):
        """Saves a checkpoint, each process writing its own rows (not again at a saved step)."""
        if manager.last_step != step:
            manager.save(step)

    def export_for_serving(self, model, base, row_dtype):
        return export_for_serving(model, base, row_dtype=row_dtype)

    def publisher(self, model, base, **kwargs):
        return Publisher(model, base, **kwargs)

    def table_summary(self, model):
        """(ids, checksum, value sum) over every shard of `model`'s ttf tables, computed where
        each shard lives: only numbers travel."""
        return _table_summary(*tables_in(model))

    def slice_batches(self, dataset, batch_size):
        """This process's part of each global batch of `dataset` (evaluation)."""
        del batch_size
        return dataset

    def eval_batch_size(self, batch_size):
        """Rows of an evaluation batch: few large calls (in a cluster each is a round of RPCs)."""
        return max(batch_size, 4096)


class OneProcess(_OneLoop):
    """The whole job in this process: every collective is the identity."""


class ParameterServers(_OneLoop):
    """This process is the chief of a parameter-server job: it connects to the cluster
    (a `ttf.distribute.Cluster`, a ClusterResolver, or None: TF_CONFIG) with
    ParameterServerStrategy and schedules the steps on
    the workers; ttf tables are sharded over the parameter servers, whose tasks each save,
    export and publish their own shard. Each worker reads its own input share."""

    name = "ps"

    def __init__(self, cluster=None):
        cluster = cluster_of(cluster, "ParameterServers")
        cluster.require_parameter_servers("ParameterServers")
        self.cluster = cluster
        self.num_shares = len(cluster.worker_hosts)
        self.strategy, self.coordinator = make_coordinator(cluster)
        self.shard_devices = cluster.ps_devices()

    def scope(self):
        return self.strategy.scope()

    def step_runner(self, job):
        return CoordinatedSteps(job)

    def lost(self, error):
        if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)):
            return _errors.lost_parameter_server(error, self.cluster.ps_hosts)
        return None

    def shape(self):
        return self.cluster.job_shape()


# Seconds a SyncWorkers job's collective waits for the other workers (measured: a loaded 2-core
# host took over 45 s to trace the first step on one worker while the other waited).
JOB_COLLECTIVE_TIMEOUT_SECONDS = 600.0


class SynchronousRanks(_Steps):
    """Ranks of a synchronous job over a Collectives backend (ttf/distribute/collectives/_tf.py):
    ttf tables sharded over the ranks, dense gradients averaged, each rank reads its own
    input share and writes its own rows; every mechanic is ttf/distribute/_ranks.py's, written
    once for every backend. Subclasses make the backend (`self.coll`)."""

    synchronous = True
    runtime = "collective"
    table_note = " (this rank's table shards)"

    def __init__(self, coll, compression="none"):
        wire_dtype(compression)  # refuses an unknown compression
        self.coll, self.compression = coll, compression
        self.rank, self.num_ranks = coll.rank, coll.size
        self.num_shares = self.num_ranks

    def prepare(self, model, optimizer):
        _table_sharding.shard_tables(model, self.coll, self.compression)
        return _table_sharding.DistributedOptimizer(optimizer, self.coll, self.compression)

    def broadcast_model(self, model):
        _table_sharding.broadcast_variables(model.variables, self.coll)

    def lost(self, error):  # any failed collective: a peer stopped or the network failed
        return _errors.lost_rank(error, self.rank, self.runtime)

    def all_have(self, flag):
        return bool(all_workers(tf.constant(flag), self.coll, "ttf_have_batch").numpy())

    def agree(self, value, what="agree"):
        return _ranks.agree(self.coll, value, what)

    def gather_rows(self, array, name):
        return _ranks.gather_rows(self.coll, np.asarray(array), name)

    def sum_counts(self, counts):
        return _ranks.summed_counts(self.coll, counts)

    def check_same_config(self, config, what):
        _ranks.check_same_config(self.coll, config, what)

    def mean_loss(self):
        return lambda losses: mean_over_examples(losses, self.coll, name="ttf_loss")

    def finite_across(self):
        return lambda flag: all_workers(flag, self.coll, "ttf_all_ranks")

    def open_stream(self, spec, **kwargs):
        return _ranks.open_stream(self.coll, spec, **kwargs)

    def stream_batches(self, stream, batch_size, stop, max_steps):
        return _ranks.stream_batches(self.coll, stream, batch_size, stop, max_steps=max_steps)

    def stream_progress(self, stream):
        return _ranks.stream_progress(self.coll, stream)

    def sync_positions(self, position, stream=None):
        _ranks.gather_input_position(self.coll, position)
        if stream is not None:  # every rank's share of the stream into rank 0's checkpoint
            _ranks.gather_stream_position(self.coll, stream)

    def save(self, manager, step):
        _ranks.save_checkpoint(self.coll, manager, step)

    def export_for_serving(self, model, base, row_dtype):
        return _ranks.export_for_serving(self.coll, model, base, row_dtype=row_dtype)

    def publisher(self, model, base, **kwargs):
        return Publisher(model, base, shards=_ranks.RankShards(self.coll), **kwargs)

    def table_summary(self, model):
        return _table_summary(*self.coll.allgather_object(_table_summary(*tables_in(model)), "ttf_table_summary"))

    def slice_batches(self, dataset, batch_size):
        return rank_slice(dataset, batch_size, self.coll)

    def eval_batch_size(self, batch_size):
        return batch_size * self.size

    def wire_bytes(self):
        """Bytes this rank sent to the others (its wire precision), 0 before any step."""
        return self.coll.wire_bytes()


class HorovodRanks(SynchronousRanks):
    """This process is one rank of a Horovod job (imports horovod; Keras 2, TensorFlow 2.16).
    compression: "none", "fp16" or "bf16" on the wire."""

    name = "horovod"
    runtime = "Horovod"

    def __init__(self, compression="none"):
        try:
            import ttf.distribute.horovod as tdh  # noqa: PLC0415 (imports horovod, with a clear error)
        except ImportError as err:
            raise ImportError(str(err).replace("\n", " ")) from err
        tdh.hvd.init()
        self.tdh, self.hvd = tdh, tdh.hvd
        super().__init__(tdh.HorovodCollectives(), compression)

    def shape(self):
        return {"horovod_ranks": self.size, "compression": self.compression}

    def prepare(self, model, optimizer):
        if tables_in(model):
            self.tdh.shard_tables(model, self.coll, self.compression)
            return self.tdh.DistributedOptimizer(optimizer, self.coll, self.compression)
        # A model without ttf tables: horovod's own optimizer (fp16 or none on the wire).
        compression = self.hvd.Compression.fp16 if self.compression == "fp16" else self.hvd.Compression.none
        return self.hvd.DistributedOptimizer(optimizer, compression=compression)


class SyncWorkers(SynchronousRanks):
    """This process is one worker of a synchronous job on TensorFlow's own collectives
    (MultiWorkerMirroredStrategy's gRPC cluster; any TensorFlow from 2.16, Keras 2 or 3).
    cluster: a `ttf.distribute.Cluster` (e.g. Cluster(worker_hosts="h:p,h:p", task_type="worker",
    task_index=i)), a tf.distribute ClusterResolver, or None: TF_CONFIG.
    Create it first, before the model and its tables (TensorFlow renames this process's
    devices when it enables collectives). compression: "none", "fp16" or "bf16" on the wire.
    timeout_seconds: how long a collective waits for the other workers before the job stops
    with LostRankError (default JOB_COLLECTIVE_TIMEOUT_SECONDS: a worker may trace its first
    step or write its checkpoint part alone for minutes on a busy host; a killed worker is
    noticed sooner, by the coordination service's heartbeats)."""

    name = "sync"
    runtime = "TensorFlow"
    max_steps_per_call = 1  # a fresh instance key per collective and call: one step per call

    def __init__(self, cluster=None, compression="none", timeout_seconds=None):
        coll = TFCollectives(cluster, timeout_seconds=timeout_seconds or JOB_COLLECTIVE_TIMEOUT_SECONDS)
        super().__init__(coll, compression)

    def shape(self):
        return {"sync_workers": self.size, "compression": self.compression}

    def lost(self, error):
        found = self.coll.lost_worker_error("training", error)
        if not isinstance(found, LostWorkerError):
            return None  # not a collective's failure: raised as it is
        return _errors.lost_rank(error, self.rank, self.runtime, detail=str(found))
