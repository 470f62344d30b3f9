"""The pipelined synchronous step (JobConfig(pipeline=True)): batch N+1's ids are routed to
their owners while batch N trains, as TorchRec's TrainPipelineSparseDist runs the next
batch's input_dist beside this batch's compute.

What runs ahead, and what cannot: the table exchange has three stages
(ttf/distribute/_table_sharding.py): route_ids (each table's ids de-duplicated, one small
gather of every worker's counts, one alltoall of the ids to their owners, the owner's own
de-duplication), fetch_rows (the owners read the rows, one alltoall brings them back) and the
row gradients' alltoall in the backward pass. route_ids reads no table and no variable: it
depends on the batch's ids only, so batch N+1's runs inside batch N's tf.function call,
traced first so that its two collectives start when the call does and overlap batch N's
lookup, dense compute and gradient exchange. The rows are not fetched ahead: batch N+1's
lookups must see batch N's update (the same rows updated in the same order as without the
pipeline), and re-fetching the rows batch N touched would cost the alltoall it saves. So the
pipelined job computes exactly what the un-pipelined one does, in the same order.

The only state the pipeline holds is the next batch's routing, in this process's memory. It
is never checkpointed: the input position records trained batches only, so a job stopped or
killed mid-pipeline resumes at the first untrained batch and routes it again (nothing
trained twice, nothing skipped).
"""
import tensorflow as tf

from ttf.distribute._table_sharding import Grouping
from ttf.embedding import tables_in


def check_can_pipeline(topology):
    """Raises ValueError, in one line, unless `topology`'s tables exchange ids across ranks."""
    if not getattr(topology, "synchronous", False):
        raise ValueError(f"JobConfig(pipeline=True) overlaps the table exchange of a synchronous job (SyncWorkers, "
                         f"HorovodRanks); a {topology.name} job has none: drop pipeline (--pipeline)")


def pipelined_step(train_step, model, forward, topology):
    """The PipelinedStep of a Job's `train_step` (a ttf.precision PrecisionTrainStep) of
    `model`, run through `forward` (the model or a wrapper), on `topology`. A functional
    model's ids come from its Grouping's sub-model; any other model's from a recording pass of
    `forward`'s call. Raises ValueError, in one line, when there is nothing to pipeline."""
    check_can_pipeline(topology)
    layers = tables_in(model)
    if not layers:
        raise ValueError(f"JobConfig(pipeline=True) overlaps the exchange of ttf tables; {model.name} has none: "
                         "drop pipeline (--pipeline)")
    sharding = layers[0].sharding
    if sharding.grouping is None:  # not functional: its calls' ids are recorded from forward's own call
        sharding.grouping = Grouping.recorded(forward, sharding)
    sharding.grouping.install()  # calls given a routing now exchange once, with it
    return PipelinedStep(train_step, sharding, sharding.grouping)


class PipelinedStep:
    """Runs a PrecisionTrainStep one batch ahead in its ids. Use it as the step's iterator
    and the step at once:

        batches = step.start(iterator, agree)   # reads one batch ahead
        for batch in batches:
            result = step(batch[0], batch[1])  # trains batch N, routes batch N+1's ids

    agree: the topology (its all_have) when the ranks' shares may end apart: every rank then
    decides with the others whether a next batch exists, so that all run the same trace, and
    all stop when one runs out (as the un-pipelined loop does). None: the input never ends
    early on one rank only.
    """

    def __init__(self, train_step, sharding, grouping):
        self.train_step = train_step
        self._sharding, self._grouping = sharding, grouping
        self._iterator = self._agree = self._next = self._routed = None
        self._traced = False
        self._route = tf.function(self._route_ids, reduce_retracing=True)
        self._step = tf.function(self._pipelined, reduce_retracing=True)

    # -- the batches, one ahead

    def start(self, iterator, agree=None):
        """Starts a pass over `iterator` (forgetting any routing of an earlier one); returns self."""
        self._iterator, self._agree, self._routed = iterator, agree, None
        self._next = self._take()
        return self

    def __iter__(self):
        return self

    def __next__(self):
        batch = self._next
        if batch is None:
            raise StopIteration
        self._next = self._take()  # read now: the step routes its ids while this batch trains
        return batch

    def _take(self):
        batch = next(self._iterator, None)
        if self._agree is not None and not self._agree.all_have(batch is not None):
            return None
        return batch

    # -- the step

    def __call__(self, features, labels):
        """Trains the batch `__next__` returned last; routes the next batch's ids meanwhile."""
        self.train_step.prepare()
        ahead = None if self._next is None else self._next[0]
        with self.train_step.non_finite_errors():
            if self._routed is None:  # the first batch of a pass: its ids were routed by no earlier step
                self._routed = self._route(features)
            if ahead is not None and not self._traced:  # one trace for every batch's routing (sizes vary)
                self._step.get_concrete_function(_any_size(features, 1), _any_size(labels, 1),
                                                 _any_size(self._routed), _any_size(ahead, 1))
                self._traced = True
            result, self._routed = self._step(features, labels, self._routed, ahead)
        return result

    def _route_ids(self, features):
        return self._grouping.route_ids(features, training=True)

    def _pipelined(self, features, labels, routed, ahead):
        # Traced first: TFCollectives orders its collectives' start and finish counters as
        # traced, so traced after batch N's, the next batch's two would wait for batch N's last.
        routed_next = None if ahead is None else self._route_ids(ahead)
        outer, self._sharding.prefetched = self._sharding.prefetched, routed
        try:
            result = self.train_step.traced_step(features, labels)
        finally:
            self._sharding.prefetched = outer
        return result, routed_next


def _any_size(structure, dims=None):
    """TensorSpecs of `structure` with their first `dims` dimensions unknown (None: all)."""
    def spec(value):
        shape = value.shape.as_list()
        cut = len(shape) if dims is None else min(dims, len(shape))
        shape = [None] * cut + shape[cut:]
        if isinstance(value, tf.RaggedTensor):
            return tf.RaggedTensorSpec(shape, value.dtype, value.ragged_rank, value.row_splits.dtype)
        return tf.TensorSpec(shape, value.dtype)
    return tf.nest.map_structure(spec, structure)


__all__ = ["PipelinedStep", "check_can_pipeline", "pipelined_step"]
