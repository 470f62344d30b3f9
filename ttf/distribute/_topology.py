"""Where a job runs: one process, a parameter-server cluster, or Horovod ranks.

`ttf.distribute.Job` is written once over this small interface; a topology says what differs:
how many input shares there are and which one this process reads, how the model and its
optimizer are placed (`scope`, `prepare`), how the processes agree and gather (a no-op in
one process), and how each shard's rows are saved, exported and published (each process its
own rows; the chief never holds another's).

    OneProcess()                       everything here
    ParameterServers(cluster)          this process is the chief of a PS job (ClusterConfig)
    HorovodRanks(compression="none")   this process is one rank (imports horovod)

A parameter-server job's steps run on its workers: `coordinated` is True and `Job` drives
them through `coordinator`; the other topologies run each step in this process.
"""
import contextlib

import numpy as np
import tensorflow as tf

from ttf.distribute import _errors

from ttf.data import open_stream as _open_stream
from ttf.data import stream_batches as _stream_batches
from ttf.embedding import table_summary as _table_summary
from ttf.embedding import tables_in


class OneProcess:
    """The whole job in this process: every collective is the identity."""

    name = "single"
    coordinated = False
    rank, size, num_shares = 0, 1, 1
    strategy = coordinator = None
    shard_devices = None

    @property
    def is_chief(self):
        return self.rank == 0

    @property
    def share(self):
        """The input share this process reads (its rank)."""
        return self.rank

    def scope(self):
        """Build the model and optimizer inside it (a strategy's scope in a cluster)."""
        return contextlib.nullcontext()

    def shape(self):
        """The topology as the job's metrics report it."""
        return "single"

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
        """Saves a checkpoint, each process writing its own rows."""
        manager.save(step)

    def export_for_serving(self, model, base, row_dtype):
        from ttf.serving import export_for_serving  # noqa: PLC0415 (serving imports distribute's peers)

        return export_for_serving(model, base, row_dtype=row_dtype)

    def publisher(self, model, base, **kwargs):
        from ttf.serving import Publisher  # noqa: PLC0415

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


class ParameterServers(OneProcess):
    """This process is the chief of a parameter-server job: it connects to the cluster
    (`ttf.distribute.ClusterConfig`) with ParameterServerStrategy and schedules the steps on
    the workers; ttf tables are sharded over the parameter servers, whose tasks each save,
    export and publish their own shard. Each worker reads its own input share."""

    name = "ps"
    coordinated = True

    def __init__(self, cluster):
        from ttf.distribute._cluster import make_coordinator  # noqa: PLC0415

        self.cluster = cluster
        self.num_shares = len(cluster.worker_hosts)
        self.strategy, self.coordinator = make_coordinator(cluster)
        self.shard_devices = cluster.ps_devices()

    def scope(self):
        return self.strategy.scope()

    def lost(self, error):
        if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)):
            return _errors.lost_parameter_server(error, self.cluster.ps_hosts)
        return None

    def shape(self):
        return self.cluster.shape()


class HorovodRanks(OneProcess):
    """This process is one rank of a Horovod job: ttf tables sharded over the ranks
    (ttf.distribute.horovod), dense gradients allreduced; each rank reads its own input share
    and writes its own rows. compression: "none", "fp16" or "bf16" on the wire."""

    name = "horovod"
    runtime = "Horovod"

    def __init__(self, compression="none"):
        try:
            import ttf.distribute.horovod as tdh  # noqa: PLC0415 (imports horovod, with a clear error)
        except ImportError as err:
            raise ImportError(str(err).replace("\n", " ")) from err
        tdh.hvd.init()
        self.tdh, self.hvd = tdh, tdh.hvd
        self.rank, self.size = tdh.hvd.rank(), tdh.hvd.size()
        self.num_shares = self.size
        self.compression = compression

    def shape(self):
        return {"horovod_ranks": self.size, "compression": self.compression}

    def prepare(self, model, optimizer):
        if tables_in(model):
            self.tdh.shard_tables(model, self.compression)
            return self.tdh.DistributedOptimizer(optimizer, self.compression)
        # A model without ttf tables: horovod's own optimizer (fp16 or none on the wire).
        compression = self.hvd.Compression.fp16 if self.compression == "fp16" else self.hvd.Compression.none
        return self.hvd.DistributedOptimizer(optimizer, compression=compression)

    def broadcast_model(self, model):
        self.tdh.broadcast_variables(model.variables)

    def lost(self, error):  # any failed collective: a peer stopped or the network failed
        return _errors.lost_rank(error, self.rank, self.runtime)

    def all_have(self, flag):
        return bool(self.tdh.all_ranks(tf.constant(flag), name="ttf_have_batch").numpy())

    def agree(self, value, what="agree"):
        return self.tdh.agree(value, what)

    def gather_rows(self, array, name):
        return self.tdh.gather_rows(np.asarray(array), name)

    def sum_counts(self, counts):
        per_rank = self.hvd.allgather_object(counts)
        return {name: sum(c[name] for c in per_rank) for name in counts}

    def check_same_config(self, config, what):
        self.tdh.check_same_config(config, what=what)

    def mean_loss(self):
        return lambda losses: self.tdh.mean_over_examples(losses, name="ttf_loss")

    def finite_across(self):
        return self.tdh.all_ranks

    def open_stream(self, spec, **kwargs):
        return self.tdh.open_stream(spec, **kwargs)

    def stream_batches(self, stream, batch_size, stop, max_steps):
        return self.tdh.stream_batches(stream, batch_size, stop, max_steps=max_steps)

    def stream_progress(self, stream):
        return self.tdh.stream_progress(stream)

    def sync_positions(self, position, stream=None):
        self.tdh.gather_input_position(position)
        if stream is not None:  # every rank's share of the stream into rank 0's checkpoint
            self.tdh.gather_stream_position(stream)

    def save(self, manager, step):
        # None when rank 0 has saved this step already (only its manager knows).
        saved = self.hvd.broadcast_object(manager.last_step == step if self.rank == 0 else None,
                                          name="ttf_save_done")
        if not saved:
            self.tdh.save_checkpoint(manager, step)

    def export_for_serving(self, model, base, row_dtype):
        return self.tdh.export_for_serving(model, base, row_dtype=row_dtype)

    def publisher(self, model, base, **kwargs):
        return self.tdh.Publisher(model, base, **kwargs)

    def table_summary(self, model):
        return _table_summary(*self.hvd.allgather_object(super().table_summary(model)))

    def slice_batches(self, dataset, batch_size):
        return self.tdh.rank_slice(dataset, batch_size)

    def eval_batch_size(self, batch_size):
        return batch_size * self.size

    def wire_bytes(self):
        """Bytes this rank sent to the others (its wire precision), 0 before any step."""
        return self.tdh.wire_bytes() if self.tdh._wire_bytes else 0  # pylint: disable=protected-access
