"""The collectives a synchronous job needs, one small class per backend with the same methods.

`Collectives` is the interface; `TFCollectives` runs it on TensorFlow's own collective ops
(CollectiveAllToAllV2, CollectiveReduceV2, CollectiveGatherV2, CollectiveBcastSend/RecvV2)
over gRPC, its cluster set up by MultiWorkerMirroredStrategy; `HorovodCollectives`
(ttf.distribute.collectives.horovod) runs it on Horovod. Table sharding, the dense allreduce and
broadcast_variables are written once over it (ttf/distribute/_table_sharding.py).

Every method is called on every worker, in the same order (a collective). Tensor methods
work eagerly and inside a tf.function (a Keras train step); the *_object methods are eager.
"""
import contextlib
import itertools
import pickle
import re
import socket
import sys
import threading
import time

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as _eager_context  # no public API aborts collectives

from ttf.distribute._cluster import cluster_of
from ttf.distribute._resolver import cluster_resolver

# Seconds a TF collective may wait for the other workers before it fails (an eager op gets it as
# its timeout_seconds; traced ones are timed by TFCollectives' watchdog thread). A worker that
# died is usually noticed sooner: the coordination service MultiWorkerMirroredStrategy starts
# reports a task whose heartbeats stopped (about 10 s on loopback) and aborts every collective.
# Raise it when a worker legitimately works alone longer (a large save) before joining the next
# collective: guard(what, timeout=...) does, for the collectives called eagerly inside it.
COLLECTIVE_TIMEOUT_SECONDS = 45.0

# Our own group key, apart from the ones MultiWorkerMirroredStrategy numbers from 1 for its own collectives.
_GROUP_KEY = 0x7474
_FIRST_INSTANCE_KEY = 1 << 20
# The dtypes each TF collective moves (its op's type constraint); others are bit-cast to one.
_ALLTOALL_DTYPES = (tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_GATHER_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_REDUCE_OPS = {"sum": ("Add", "Id"), "mean": ("Add", "Div"), "min": ("Min", "Id"), "max": ("Max", "Id")}


class CollectiveMisuseError(RuntimeError):
    """A collective was called on some workers only (or the workers disagree on what they
    restored): raised on every worker instead of hanging."""


class LostWorkerError(RuntimeError):
    """A collective failed because a worker was lost (killed, crashed, unreachable) or timed
    out waiting for one: raised on every surviving worker instead of a hang. `lost` holds the
    lost workers' ranks when known, else is empty."""

    def __init__(self, message, lost=()):
        super().__init__(message)
        self.lost = tuple(lost)


class Collectives:
    """The interface. Attributes: rank (this worker, 0-based), size (workers).

    Tensor methods (eager or traced):
      alltoall(tensor, splits, name, all_splits=None) -> (received, received_splits):
        tensor [N, ...] holds the rows for worker 0, then worker 1, ... (splits[w] rows each,
        int32 [size]); returns the rows every worker sent here, in worker order, and how many
        came from each. all_splits: optional int32 [size, size] (row s = worker s's splits),
        when the caller knows every worker's splits (a backend that pads needs them; without
        them it exchanges them first).
      alltoall_even(tensor, name): tensor [size * c, ...]: rows [w*c, (w+1)*c) go to worker w.
      allreduce(tensor, op, name): op "sum", "mean", "min" or "max", element-wise over workers.
      allgather(tensor, name, same_shape=False): every worker's tensor concatenated on dim 0
        (its sizes may differ; same_shape=True: they do not, which saves a backend a round).
      broadcast(tensor, root, name): root's tensor (same shape and dtype everywhere).
      count=True (alltoall*, allreduce, allgather) adds what the call sends to wire_bytes().
    Eager methods:
      allgather_object(obj, name) -> [every worker's obj]; broadcast_object(obj, root, name).
      guard(what, timeout=None): a context manager that turns a lost worker into
        LostWorkerError naming it (and lets eager collectives inside wait `timeout`).
      wire_bytes(): bytes this worker sent on counted calls (as moved: padding included);
      payload_bytes(): the rows those calls had to move (without padding or count exchanges).
    """

    rank = 0
    size = 1
    pads_alltoall = False  # True: alltoall has fixed sizes and wants all_splits (saves it a count exchange)
    workers_name = "workers"  # how errors name the processes
    export_hint = "Export or save it eagerly, on every worker."

    def __init__(self):
        self._counters = []  # [wire, payload] int64 variables, made on first use

    # -- byte counters

    def _counter_variables(self):
        if not self._counters:
            with tf.init_scope():
                self._counters.extend(tf.Variable(0, dtype=tf.int64, trainable=False, name=f"ttf_{what}_bytes")
                                      for what in ("wire", "payload"))
        return self._counters

    def wire_bytes(self):
        return int(self._counter_variables()[0].numpy())

    def payload_bytes(self):
        return int(self._counter_variables()[1].numpy())

    def _counted(self, outputs, wire, payload=None):
        """`outputs` (a tensor or a tuple) once wire/payload bytes are added to the counters."""
        wire_var, payload_var = self._counter_variables()
        updates = [wire_var.assign_add(tf.cast(wire, tf.int64)),
                   payload_var.assign_add(tf.cast(wire if payload is None else payload, tf.int64))]
        with tf.control_dependencies(updates):
            return tf.nest.map_structure(tf.identity, outputs)

    # -- shared by the backends

    def allgather_object(self, obj, name="ttf_object"):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        blobs = self._allgather_bytes(data, name)
        return [pickle.loads(blob) for blob in blobs]

    def broadcast_object(self, obj, root=0, name="ttf_object"):
        data = pickle.dumps(obj) if self.rank == root else b""
        length = int(self.broadcast(tf.constant([len(data)], tf.int64), root, f"{name}_length").numpy()[0])
        words = np.zeros(-(-length // 4), np.int32)  # bytes travel as int32 words (TF collectives take no uint8)
        if self.rank == root:
            words.view(np.uint8)[:length] = np.frombuffer(data, np.uint8)
        words = self.broadcast(tf.constant(words), root, f"{name}_data").numpy()
        return pickle.loads(words.view(np.uint8)[:length].tobytes())

    def _allgather_bytes(self, data, name):
        lengths = self.allgather(tf.constant([data.size], tf.int64), f"{name}_length").numpy()
        words = np.zeros(-(-int(lengths.max()) // 4), np.int32)
        words.view(np.uint8)[:data.size] = data
        gathered = self.allgather(tf.constant(words[None]), f"{name}_data").numpy()
        return [gathered[w].view(np.uint8)[:lengths[w]].tobytes() for w in range(self.size)]

    @contextlib.contextmanager
    def guard(self, what, timeout=None):
        del what, timeout
        yield


class TFCollectives(Collectives):
    """Collectives on TensorFlow's collective ops over gRPC; one process per worker.

    The cluster (`cluster`: a ttf.distribute.Cluster, a tf.distribute ClusterResolver, or None:
    TF_CONFIG) has tasks of type "worker", plus an optional "chief" that is rank 0. Creating it
    starts this worker's gRPC server and waits for every worker
    (tf.distribute.MultiWorkerMirroredStrategy does both, and the coordination service that
    watches the workers' heartbeats). Create it first, before any model or table: TensorFlow
    renames this process's devices when collectives are enabled.

    Each collective op gets a fresh instance key at every call (a value captured at call
    time inside a tf.function, as MultiWorkerMirroredStrategy does): TensorFlow fixes an
    instance's shape on its first run, and ours change every step. Every worker must call
    the same traced functions in the same order, one step per call (Keras'
    steps_per_execution=1, the default).

    Args:
      cluster: a ttf.distribute.Cluster, a tf.distribute ClusterResolver, or None (TF_CONFIG).
      timeout_seconds: how long a collective waits for the others (COLLECTIVE_TIMEOUT_SECONDS).

    Raises:
      ClusterError (a ValueError): no cluster (none given and no TF_CONFIG), or this task is none
        of its chief and workers.
    """

    def __init__(self, cluster=None, timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS):
        super().__init__()
        cluster = cluster_of(cluster, "TFCollectives")
        self.cluster, self.rank = cluster, cluster.rank
        self.resolver = cluster_resolver(cluster)
        self.tasks = [("chief", 0)] * bool(cluster.chief_host) + [("worker", i) for i in range(len(cluster.worker_hosts))]
        self.hosts = list(cluster.ranks())
        self.size = len(self.tasks)
        self.pads_alltoall = True
        self.timeout_seconds = float(timeout_seconds)
        # The strategy starts the gRPC server, enables collective ops in this process's
        # context and the coordination service; ttf calls the collective ops itself, so each
        # worker keeps its own model and tables (ttf tables are per-process resources, never
        # MirroredVariables).
        try:
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=self.resolver)
        except RuntimeError as error:
            if "at program startup" not in str(error):
                raise
            raise ValueError("make the synchronous topology (SyncWorkers, or TFCollectives) first, before any "
                             "TensorFlow variable, op or model of this process: TensorFlow enables its collectives "
                             "only at start-up; then build the model inside topology.scope()") from None
        self._instance_keys = itertools.count(_FIRST_INSTANCE_KEY)
        self._eager_timeout = None
        self._progress = []  # [started, finished] counts of traced collectives, read by the watchdog

    # -- instance keys and timeouts

    def _instance_key(self):
        """A new instance key per run: inside a function being traced, a value the function
        reads at each call (the outermost function's, so nested functions and control flow
        share it); eagerly, the next number."""
        graph = tf.compat.v1.get_default_graph()
        while getattr(graph, "is_control_flow_graph", False):
            graph = graph.outer_graph
        if not tf.executing_eagerly() and getattr(graph, "building_function", False):
            with graph.as_default():
                return graph.capture_call_time_value(self._instance_key, tf.TensorSpec([], tf.int32))
        return tf.constant(next(self._instance_keys), tf.int32)

    def _timeout(self):
        return self._eager_timeout if (self._eager_timeout and tf.executing_eagerly()) else self.timeout_seconds

    def _collective(self, op, **args):
        """Runs raw collective `op` with `args`, this group and a fresh instance key. Eagerly, the op
        itself waits at most the timeout. Traced (every step), it gets no timeout and runs between
        two counts that the watchdog reads: TensorFlow times an op with a timeout by a thread of its
        own that sleeps that long, and a traced step's several collectives at a few steps a second
        kept thousands of such threads alive until pthread_create failed and killed the worker (a
        1,500-step job died at step 950)."""
        common = dict(group_size=self.size, group_key=_GROUP_KEY, instance_key=self._instance_key())
        if tf.executing_eagerly():
            return op(timeout_seconds=self._timeout(), **common, **args)
        started, finished = self._watched()
        with tf.control_dependencies([started.assign_add(1)]):
            out = op(timeout_seconds=0.0, **common, **args)
        with tf.control_dependencies([out]):
            done = finished.assign_add(1)
        with tf.control_dependencies([done]):
            return tf.identity(out)

    def _watched(self):
        if not self._progress:
            with tf.init_scope():
                self._progress.extend(tf.Variable(0, dtype=tf.int64, trainable=False, name=f"ttf_collectives_{what}")
                                      for what in ("started", "finished"))
            threading.Thread(target=self._watchdog, name="ttf_collective_watchdog", daemon=True).start()
        return self._progress

    def _watchdog(self):
        """Aborts this process's collectives once a traced one has waited timeout_seconds with no
        collective starting or finishing meanwhile: the op then fails (DeadlineExceeded) and the
        job stops with LostWorkerError, as when an eager collective times out."""
        started, finished = self._progress
        seen, since = None, time.monotonic()
        try:
            while True:
                time.sleep(min(1.0, self.timeout_seconds / 4))
                now = (int(started.numpy()), int(finished.numpy()))
                if now != seen or now[0] == now[1]:
                    seen, since = now, time.monotonic()
                elif time.monotonic() - since >= self.timeout_seconds:
                    _eager_context.context().abort_collective_ops(
                        tf.errors.DEADLINE_EXCEEDED, f"ttf: a collective on worker {self.rank} waited "
                        f"{self.timeout_seconds:g}s (timeout_seconds) for the other workers")
                    return
        except Exception as err:  # noqa: BLE001  (at interpreter exit the variables are gone: say nothing then)
            if not sys.is_finalizing():
                print(f"ttf (worker {self.rank}): the collective watchdog stopped ({type(err).__name__}: {err}); "
                      "traced collectives are no longer timed, a stalled worker can hang this one",
                      file=sys.stderr, flush=True)

    # -- tensor collectives

    def alltoall(self, tensor, splits, name="ttf_alltoall", all_splits=None, count=False):
        """Variable splits on a fixed-size op: every worker pads each destination's block to
        the largest block any worker sends (all_splits, exchanged first when not given)."""
        del name
        tensor = tf.convert_to_tensor(tensor)
        splits = tf.cast(splits, tf.int32)
        if all_splits is None:  # every worker's splits (one small gather) give every worker the same padding
            all_splits = self.allgather(splits[None], same_shape=True, count=count)
        all_splits = tf.cast(all_splits, tf.int32)
        # At least one row: TensorFlow's all-to-all of an empty tensor crashes the process (SIGSEGV, TF 2.16-2.21).
        chunk = tf.maximum(tf.reduce_max(all_splits), 1)
        row_shape = tf.shape(tensor)[1:]
        # Rows -> [size, chunk, ...] by one gather (a row copy each; a scatter_nd here cost about 8% of a
        # worker's step): slot i of block w takes row starts[w] + i, or past splits[w] any row (row 0: the
        # receiver drops padding), or zeros when this worker sends nothing at all.
        slot = tf.range(chunk)[None, :]
        source = tf.where(slot < splits[:, None], tf.cumsum(splits, exclusive=True)[:, None] + slot, 0)
        padded = tf.cond(tf.shape(tensor)[0] > 0, lambda: tf.gather(tensor, tf.reshape(source, [-1])),
                         lambda: tf.zeros(tf.concat([[self.size * chunk], row_shape], 0), tensor.dtype))
        received = self._alltoall_rows(tf.reshape(padded, tf.concat([[self.size, chunk], row_shape], 0)))
        received_splits = all_splits[:, self.rank]  # block s came from worker s: its first received_splits[s] rows
        # Received row j is row j - starts[s] of block s, s the block j falls in: slot j + s * chunk - starts[s].
        ends = tf.cumsum(received_splits)
        j = tf.range(ends[-1])
        block = tf.searchsorted(ends[None, :], j[None, :], side="right")[0]
        offset = tf.range(self.size) * chunk - (ends - received_splits)
        received = tf.gather(tf.reshape(received, tf.concat([[-1], row_shape], 0)), j + tf.gather(offset, block))
        if count:
            row_bytes = tf.cast(tf.reduce_prod(row_shape), tf.int64) * tensor.dtype.size
            sent = tf.cast(tf.reduce_sum(splits) - splits[self.rank], tf.int64)
            received = self._counted(received, (self.size - 1) * tf.cast(chunk, tf.int64) * row_bytes,
                                     sent * row_bytes)
        return received, received_splits

    def alltoall_even(self, tensor, name="ttf_alltoall", count=False):
        del name
        tensor = tf.convert_to_tensor(tensor)
        rows = tf.shape(tensor)[0] // self.size
        received = tf.reshape(self._alltoall_rows(tf.reshape(tensor, tf.concat([[self.size, rows], tf.shape(tensor)[1:]], 0))),
                              tf.shape(tensor))
        if count:
            received = self._counted(received, tf.cast(tf.size(tensor) // self.size * (self.size - 1), tf.int64)
                                     * tensor.dtype.size)
        return received

    def _alltoall_rows(self, blocks):
        """[size, ...] -> [size, ...]: block w to worker w, block s from worker s."""
        blocks, restore = _movable(blocks, _ALLTOALL_DTYPES)
        shape = tf.shape(blocks)
        flat = tf.reshape(blocks, [self.size, -1])  # the op sends input[w] to worker w
        out = self._collective(tf.raw_ops.CollectiveAllToAllV2, input=flat, ordering_token=[])
        return restore(tf.reshape(out, shape))

    def allreduce(self, tensor, op="sum", name="ttf_allreduce", count=False):
        del name
        if op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        merge, final = _REDUCE_OPS[op]
        tensor = tf.convert_to_tensor(tensor)
        out = self._collective(tf.raw_ops.CollectiveReduceV2, input=tensor, ordering_token=[], merge_op=merge,
                               final_op=final)
        if count:  # a ring allreduce sends 2 (n - 1) / n of the buffer
            out = self._counted(out, tf.cast(2 * (self.size - 1) * tf.size(tensor, tf.int64) * tensor.dtype.size
                                             // self.size, tf.int64))
        return out

    def allgather(self, tensor, name="ttf_allgather", count=False, same_shape=False):
        """Sizes on dim 0 may differ: they are gathered first, each tensor padded to the largest
        (same_shape=True: the caller knows every worker's tensor has this shape)."""
        del name
        tensor = tf.convert_to_tensor(tensor)
        if same_shape:
            out = self._gather(tensor)
            if count:
                out = self._counted(out, (self.size - 1) * tf.size(tensor, tf.int64) * tensor.dtype.size)
            return out
        n = tf.shape(tensor, out_type=tf.int64)[:1]
        sizes = self._gather(n)
        most = tf.maximum(tf.reduce_max(sizes), 1)  # an empty gather crashes TensorFlow, as an empty all-to-all does
        padded = tf.pad(tensor, tf.concat([[[0, most - n[0]]], tf.zeros([tf.rank(tensor) - 1, 2], tf.int64)], 0))
        gathered = self._gather(padded)
        gathered = tf.reshape(gathered, tf.concat([[self.size, most], tf.shape(gathered, out_type=tf.int64)[1:]], 0))
        out = tf.boolean_mask(gathered, tf.range(most)[None, :] < sizes[:, None])
        if count:  # a ring gather forwards every other worker's block once
            piece = tf.size(padded, tf.int64) * tensor.dtype.size
            out = self._counted(out, (self.size - 1) * piece, (self.size - 1) * tf.size(tensor, tf.int64) * tensor.dtype.size)
        return out

    def _gather(self, tensor):
        tensor, restore = _movable(tensor, _GATHER_DTYPES)
        return restore(self._collective(tf.raw_ops.CollectiveGatherV2, input=tensor, ordering_token=[]))

    def broadcast(self, tensor, root=0, name="ttf_broadcast"):
        del name
        tensor = tf.convert_to_tensor(tensor)
        moved, restore = _movable(tensor, _ALLTOALL_DTYPES)
        if self.rank == root:
            out = self._collective(tf.raw_ops.CollectiveBcastSendV2, input=moved)
        else:
            out = self._collective(tf.raw_ops.CollectiveBcastRecvV2, shape=tf.shape(moved), T=moved.dtype)
        return restore(out)

    def broadcast_variables(self, variables, root=0):
        """Assigns worker `root`'s value to each variable (one broadcast per variable: done once)."""
        for variable in variables:
            variable.assign(self.broadcast(tf.convert_to_tensor(variable), root))

    # -- errors

    @contextlib.contextmanager
    def guard(self, what, timeout=None):
        """Runs collectives for `what`; a failed one becomes LostWorkerError naming the lost
        worker (from TensorFlow's coordination service, else by probing every worker's
        address), the cause and what to do. `timeout`: seconds the eager collectives inside
        may wait (default timeout_seconds); traced ones keep the timeout they were traced with."""
        outer, self._eager_timeout = self._eager_timeout, timeout
        try:
            yield
        except tf.errors.OpError as err:
            raise self.lost_worker_error(what, err) from err
        finally:
            self._eager_timeout = outer

    def lost_worker_error(self, what, err):
        """The LostWorkerError for a TensorFlow error `err` raised by a collective (any other
        error is returned unchanged)."""
        message = str(err)
        if not _is_collective_failure(err):
            return err
        # The coordination service lists the tasks whose heartbeats stopped; else ask the network.
        listed = message.split("unhealthy", 1)[1] if "unhealthy" in message else ""
        lost = sorted({self.tasks.index((job, int(task))) for job, task in _TASK.findall(listed)
                       if (job, int(task)) in self.tasks} - {self.rank})
        if not lost:
            lost = [w for w in range(self.size) if w != self.rank and not _reachable(self.hosts[w])]
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        first = next((line for line in lines if _TELLING.search(line)), lines[-1] if lines else type(err).__name__)
        if lost:
            who = ", ".join(f"worker {w} ({self.hosts[w]})" for w in lost)
            cause = f"lost {who}"
        elif isinstance(err, tf.errors.DeadlineExceededError):
            cause = f"timed out after waiting {self._timeout():g}s for the other workers (every worker is reachable)"
        else:
            cause = "a collective failed"
        return LostWorkerError(
            f"ttf (worker {self.rank}): {what} stopped: {cause}. TensorFlow said: {first[:300]} The other workers "
            "stop too; restart the job from its last checkpoint (a worker that is alive but slower than "
            "timeout_seconds needs a larger timeout_seconds)", lost)


_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")
_TELLING = re.compile(r"unhealthy|connection|deadline|timed out|timeout|unavailable|aborted", re.IGNORECASE)


def _is_collective_failure(err):
    message = str(err)
    return (isinstance(err, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                             tf.errors.CancelledError, tf.errors.InternalError))
            or "Collective ops is aborted" in message or "unhealthy" in message)


def _reachable(host, seconds=1.0):
    name, _, port = host.rpartition(":")
    try:
        with socket.create_connection((name, int(port)), timeout=seconds):
            return True
    except OSError:
        return False


def _movable(tensor, dtypes):
    """(tensor as a dtype the collective takes, the function that undoes it): 16-bit types
    it does not take travel bit-cast as float16, bool as int32; pure data movement."""
    if tensor.dtype in dtypes:
        return tensor, lambda out: out
    dtype = tensor.dtype
    if dtype.size == 2:
        return tf.bitcast(tensor, tf.float16), lambda out: tf.bitcast(out, dtype)
    if dtype == tf.bool:
        return tf.cast(tensor, tf.int32), lambda out: tf.cast(out, tf.bool)
    raise TypeError(f"ttf's TF collectives cannot move {dtype.name} tensors: cast to float32, int32 or int64")
