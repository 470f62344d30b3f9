"""How a job's steps run on a topology: the step runners `Job`'s two loops drive.

`LocalSteps`: each step in this process (one process; each rank of a synchronous job, the
ranks in step), the training step being ttf.precision's PrecisionTrainStep (precision and
the NaN guard decided on the device).

`CoordinatedSteps`: a parameter-server job's chief schedules the steps on its workers, the
same PrecisionTrainStep made over the strategy: each worker's step decides its precision and
its skip on the device, against counters and a switch that live on a parameter server.

A runner gives the loops (ttf/distribute/job/_loops.py) the same few calls: `start_fit` /
`warm_up` / `next_call` / `run` for batches, `rounds` for a stream, and the counters.
"""
import dataclasses

import tensorflow as tf

from ttf.distribute.topology._attempts import StepAttempts
from ttf.distribute.topology._pipeline import check_can_pipeline, pipelined_step
from ttf.precision import make_train_step


@dataclasses.dataclass
class Round:
    """The stream batches of one round, trained; `restarts` = (step starts, batches) when
    the coordinator ran a lost worker's step again (the round may have trained a batch twice).
    """
    batches: list
    loss: object
    restarts: tuple = None


class _StepCounters:
    """The counters a runner's PrecisionTrainStep (`self.train_step`) keeps on the device."""

    train_step = None
    _low_before = 0

    def restored(self):
        """After the restore: this run's counters start here."""
        self._low_before = int(self.train_step.low_precision_steps.numpy())

    def skipped_steps(self):
        return int(self.train_step.skipped_steps.numpy()) if self.train_step else 0

    def low_steps(self):
        """Steps this run ran with the dense part in bf16."""
        return int(self.train_step.low_precision_steps.numpy()) - self._low_before if self.train_step else 0


class LocalSteps(_StepCounters):
    """Every step in this process (see the module doc)."""

    input_here = True  # the batches are read (and their bad lines counted) in this process
    rate_unit = "steps/s"

    def __init__(self, job):
        self.job = job
        self.train_step = self.pipeline = None  # pipeline: the pipelined step (JobConfig.pipeline)
        self._iterator = self._record = self._step = None
        self._finite = True
        self._trace_any_size = False

    def build(self, parts):
        """Makes the training step and adds what it checkpoints to `parts`."""
        job = self.job
        self.train_step = make_train_step(job.forward, job.step_loss(), job.optimizer, job.precision,
                                          max_non_finite_steps=job.config.max_non_finite_steps,
                                          finite_across=job.topology.finite_across())
        parts["train_step"] = self.train_step
        if job.config.pipeline and job.stream is None:
            self.pipeline = pipelined_step(self.train_step, job.model, job.forward, job.topology)
        elif job.config.pipeline:
            job.log("pipeline=True: a stream's steps are not pipelined (each batch is read when the previous one "
                    "is done)")

    # ---- batches ----

    def start_fit(self, dataset, finite):
        """`dataset(share)`: this process's share. finite: the shares may end (on several
        ranks every rank stops when one runs out)."""
        job = self.job
        self._iterator = iter(dataset(job.topology.share))
        self._step = self.train_step
        if self.pipeline is not None:  # reads one batch ahead: its ids travel while this batch trains
            ranks_agree = finite and job.topology.num_ranks > 1
            self._iterator = self._step = self.pipeline.start(self._iterator, job.topology if ranks_agree else None)
        self._record = tf.function(job.position.record)
        self._finite = finite
        # Ranks trace the step once for batches of any size, as a pipelined step does: TensorFlow
        # optimises a trace for one static batch size apart from one for any size, and the CLI's
        # DeepFM then trained apart from its pipelined run in the last bits within 40 steps.
        self._trace_any_size = self.pipeline is None and job.topology.num_ranks > 1

    def warm_up(self, target):
        """Steps to run before the timing starts (they run in the loop)."""
        del target
        return max(5, self.job.config.steps_per_call)

    def next_call(self, step, target):
        """Steps of the next call: steps_per_call (no host read per step: the step decides
        its precision on the device)."""
        per_call = self.job.config.steps_per_call
        return per_call if target is None else min(per_call, target - step)

    def run(self, steps):
        """Runs up to `steps` steps: (steps run, the last loss, whether the data ended)."""
        job = self.job
        if steps > 1:
            result = self.train_step.run(self._iterator, steps, after_batch=job.position.record)
            ran = int(result["steps"])
            return ran, result["loss"], ran < steps
        batch = next(self._iterator, None)
        # Every rank stops when one runs out (a pipelined step's iterator agrees on it itself).
        if self._finite and self.pipeline is None and not job.topology.all_have(batch is not None):
            return 0, None, True
        if batch is None:
            return 0, None, True
        labels = batch[1]
        if self._trace_any_size:
            self.train_step.trace_for_any_batch_size(batch[0], labels)
            self._trace_any_size = False
        result = self._step(batch[0], labels)
        if len(batch) > 2:  # a Reader's batch: where its share continues
            self._record(batch[2], tf.size(labels))
        return 1, result["loss"], False

    # ---- a stream ----

    def rounds(self, stream, stop, left):
        """One Round per stream batch of this process (ranks: every rank a batch, in step)."""
        job = self.job
        # One trace for every batch size a stream brings (ranks on different traces would hang).
        empty = stream.empty_batch()
        self.train_step.trace_for_any_batch_size(empty.features, empty.labels)
        for batch in job.topology.stream_batches(stream, job.config.batch_size, stop, left):
            yield Round([batch], self.train_step(batch.features, batch.labels)["loss"])


class CoordinatedSteps(_StepCounters):
    """A parameter-server job's steps, scheduled by its chief on the workers (see the module doc)."""

    input_here = False  # each worker reads (and parses) its own share
    rate_unit = "global steps/s"

    def __init__(self, job):
        self.job = job
        topology = job.topology
        self.strategy, self.coordinator, self.workers = topology.strategy, topology.coordinator, topology.num_shares
        self._fns, self._finished, self._iterator = {}, set(), None

    def build(self, parts):
        """Makes the training step under the strategy's scope (its counters on a ps)."""
        job = self.job
        if job.config.pipeline:
            check_can_pipeline(job.topology)  # one line: a parameter-server job has no table exchange to overlap
        self.train_step = make_train_step(job.forward, job.step_loss(), job.optimizer, job.precision,
                                          max_non_finite_steps=job.config.max_non_finite_steps, strategy=self.strategy)
        self.train_step.prepare()  # the optimizer's slots, before any worker traces the step
        parts["train_step"] = self.train_step

    # ---- batches ----

    def start_fit(self, dataset, finite):
        """Each worker reads its own share; its index picks it inside the dataset."""
        del finite  # the job ends when every worker's share has ended
        strategy, workers = self.strategy, self.workers

        def dataset_fn(context):
            # Not context.input_pipeline_id: ParameterServerStrategy gives every worker 0. This
            # function is traced once for every worker: the worker's index is a tensor, known
            # where the dataset is made, and picks its share.
            del context
            worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
            return tf.data.Dataset.choose_from_datasets([dataset(share) for share in range(workers)],
                                                        tf.data.Dataset.from_tensors(worker).repeat(),
                                                        stop_on_empty_dataset=True)

        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn))
        self._iterator = iter(per_worker)

    def _worker_steps(self, steps):
        if steps in self._fns:
            return self._fns[steps]
        job = self.job

        @tf.function
        def worker_steps(it):  # steps_per_call steps per closure: one round trip for K steps
            losses, ran = [], []
            for _ in range(steps):
                # A worker whose share ran out (epochs) trains nothing: ran is False.
                batch = it.get_next_as_optional()

                def train():
                    features, labels, position = batch.get_value()
                    result = self.train_step.traced_step(features, labels)
                    with tf.control_dependencies([result["skipped"]]):  # the batch counts as read once its step ran
                        recorded = job.position.record(position, tf.size(labels))
                    with tf.control_dependencies([recorded]):
                        return tf.identity(result["loss"]), tf.constant(True)

                loss, has = tf.cond(batch.has_value(), train, lambda: (tf.constant(float("nan")), tf.constant(False)))
                losses.append(loss)
                ran.append(has)
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            return tf.stack(losses), tf.stack(ran), worker

        self._fns[steps] = worker_steps
        return worker_steps

    def _schedule(self, steps):
        """Runs `steps` global steps; the losses of the steps that found a batch, in schedule order."""
        results, per_call = [], self.job.config.steps_per_call
        with self.train_step.non_finite_errors():  # a worker's runaway check: one line
            while steps > 0:
                k = min(per_call, steps)
                results.append(self.coordinator.schedule(self._worker_steps(k), args=(self._iterator,)))
                steps -= k
            self.coordinator.join()
            fetched = [result.fetch() for result in results]  # numpy arrays
        # epochs: workers whose share ran out. The job ends when every worker's has: a round whose
        # closures all found no batch may have run on the finished workers only.
        self._finished.update(int(worker) for _, has, worker in fetched if not has.all())
        return [float(loss) for losses, has, _ in fetched for loss, h in zip(losses, has) if h]

    def warm_up(self, target):
        """Runs 2 steps per worker untimed (tracing, every worker's first step); 0 left."""
        start = self.job.step()
        warmup = min(2 * self.workers, max(target - start, 0)) if target is not None else 2 * self.workers
        if warmup:
            self._schedule(warmup)
        return 0

    def next_call(self, step, target):
        """A round of up to log_every steps, cut at the next multiple of checkpoint_every so
        that checkpoints land on those multiples on every topology."""
        config, job = self.job.config, self.job
        chunk = config.log_every if target is None else min(config.log_every, target - step)
        return min(chunk, _to_next_checkpoint(job, step))

    def run(self, steps):
        first_step = self.job.step()
        losses = self._schedule(steps)
        if not losses:  # this round's closures all ran on finished workers, or every share ended
            return 0, None, len(self._finished) == self.workers
        # The global step, not the losses: a lost worker's closure that is run again may have
        # applied its step on the ps before the worker died, so the step moved once more.
        return self.job.step() - first_step, losses[-1], False

    # ---- a stream ----

    def rounds(self, stream, stop, left):
        """The chief reads the stream and hands each worker one batch per round as the
        arguments of its step (a bounded transfer); a Round once the round's steps are done.
        A Python Kafka consumer cannot run inside a worker's graph; the folder source reads
        here too, so both sources have one path."""
        del left  # counted from the job's step: a rollback moves it back
        job, config = self.job, self.job.config
        with job.topology.scope():  # on a ps: counts update starts, to see a lost worker's step run again
            attempts = StepAttempts()

        @tf.function(reduce_retracing=True)  # batches of any size
        def step_fn(features, labels):
            labels = attempts.mark(labels)  # every update depends on the labels: counted before it
            return tf.identity(self.train_step.traced_step(features, labels)["loss"])

        started_before = attempts.read()
        while not stop.requested and (config.steps is None or job.step() < config.steps):
            step = job.step()
            # One batch per worker; a round never waits for more than the first batch and one poll.
            room = self.workers if config.steps is None else min(self.workers, config.steps - step)
            room = min(room, _to_next_checkpoint(job, step))
            batches = [stream.next_batch(config.batch_size)]
            if batches[0] is None:  # stopped
                return
            while len(batches) < room and not stop.requested:
                more = stream.next_batch(config.batch_size, block=False)
                if more is None:
                    break
                batches.append(more)
            with self.train_step.non_finite_errors():
                results = [self.coordinator.schedule(step_fn, args=(b.features, b.labels)) for b in batches]
                self.coordinator.join()
                losses = [float(r.fetch()) for r in results]
            now_started = attempts.read()
            started, started_before = now_started - started_before, now_started
            yield Round(batches, losses[-1], restarts=None if started == len(batches) else (started, len(batches)))


def _to_next_checkpoint(job, step):
    """Steps to the next multiple of checkpoint_every (a coordinated job's rounds are cut there)."""
    every = job.config.checkpoint_every
    return every - step % every if job.manager is not None else 1 << 62
