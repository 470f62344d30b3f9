"""The training loops of `Job`: each step in this process (one process, each rank of a
synchronous job), or scheduled on a parameter-server job's workers by its chief. Batch
training (`fit_*`) and stream training (`follow_*`). Each returns (steps timed, seconds);
`fit_*` also the step where the data ran out before JobConfig.steps (or None)."""
import time

import tensorflow as tf

from ttf import summary as _summary
from ttf.distribute._stop import StopOnSignal


def _progress_line(job, step, loss, steps_per_sec, skipped):
    ranks = f" ({job.topology.size} ranks)" if job.topology.synchronous else ""
    job.log(f"step {step}: loss {loss:.4f}, {steps_per_sec:.1f} steps/s"
            + (f", {skipped} skipped as non-finite" if skipped else "") + job.skipped_text() + job.table_progress()
            + ranks)


def _ran_out(job, step, target):
    """The step where the data ended before `target` (saying so in one line), else None."""
    if target is None or step >= target:
        return None
    job.log(f"warning: the data ran out at step {step} before steps={target}: give more data (or repeat() it), "
            "or fewer steps")
    return step


def fit_local(job, dataset, finite=True):
    """Every step in this process (Horovod: every rank, its share, the ranks in step).
    finite: the shares may end (on several ranks: every rank stops when one runs out).
    Returns (steps timed, seconds, the step where the data ran out before config.steps or None)."""
    config, topology = job.config, job.topology
    target = config.steps
    step = job.step()
    if target is not None and step >= target:
        job.log(f"already at step {step} >= steps {target}; nothing to train")
        return 0, 0.0, None
    per_call = config.steps_per_call
    warmup, timed_start, run = max(5, per_call), None, 0
    last_log, last_log_step = time.perf_counter(), step
    iterator = iter(dataset(topology.share))
    step_fn = job.train_step
    if job.pipeline is not None:  # reads one batch ahead: its ids travel while this batch trains
        iterator = step_fn = job.pipeline.start(iterator, topology if finite and topology.size > 1 else None)
    record = tf.function(job.position.record)
    while target is None or step < target:
        # No host read per step: the step decides its precision on the device.
        calls = per_call if target is None else min(per_call, target - step)
        if calls == 1:
            batch = next(iterator, None)
            if finite and topology.size > 1 and job.pipeline is None:  # every rank stops when one runs out
                if not topology.all_have(batch is not None):
                    break
            if batch is None:
                break
            features, labels = batch[0], batch[1]
            result, ran = step_fn(features, labels), 1
            if len(batch) > 2:  # a Reader's batch: where its share continues
                record(batch[2], tf.size(labels))
        else:
            result = job.train_step.run(iterator, calls, after_batch=job.position.record)
            ran = int(result["steps"])
            if ran == 0:
                break
        before, run, step = step, run + ran, step + ran
        if timed_start is None and run >= warmup:
            result["loss"].numpy()
            timed_start, timed_from = time.perf_counter(), run
            job.timed_cpu = -time.process_time()
        if step // config.log_every > before // config.log_every:
            loss = float(result["loss"])
            now = time.perf_counter()
            _progress_line(job, step, loss, (step - last_log_step) / (now - last_log), job.skipped_steps())
            job.write_summary(step, loss, (step - last_log_step) / (now - last_log))
            last_log, last_log_step = now, step
        job._maybe_checkpoint(step, every_chunk=per_call > 1)  # pylint: disable=protected-access
        job.maybe_publish()
        if ran < calls:  # the data ran out
            break
    ran_out = _ran_out(job, step, target)
    if timed_start is None:  # shorter than the warm-up: time everything
        return run, max(time.perf_counter() - last_log, 1e-9), ran_out
    job.timed_cpu += time.process_time()
    return run - timed_from, time.perf_counter() - timed_start, ran_out


def fit_coordinated(job, dataset):
    """A parameter-server job: the chief schedules `steps_per_call` steps per closure on any
    free worker; each worker reads its own share (its index picks it inside the dataset)."""
    config, topology = job.config, job.topology
    strategy, coordinator = topology.strategy, topology.coordinator
    workers = topology.num_shares

    def dataset_fn(context):
        # Not context.input_pipeline_id: ParameterServerStrategy gives every worker 0. This
        # function is traced once for every worker: the worker's index is a tensor, known
        # where the dataset is made, and picks its share.
        del context
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
        return tf.data.Dataset.choose_from_datasets([dataset(share) for share in range(workers)],
                                                    tf.data.Dataset.from_tensors(worker).repeat(),
                                                    stop_on_empty_dataset=True)

    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)
    variables, guard = job.forward.trainable_variables, job.guard

    def worker_steps_for(dtype, steps):
        @tf.function
        def worker_steps(it):  # steps_per_call steps per closure: one round trip for K steps
            losses, skipped, ran = [], [], []
            for _ in range(steps):
                # A worker whose share ran out (epochs) trains nothing: ran is False.
                batch = it.get_next_as_optional()

                def train():
                    features, labels, position = batch.get_value()
                    loss, grads = strategy.run(job.replica_grads, args=(dtype, features, labels))
                    # One decision over every gradient before any shard applies (NaN/Inf: skipped whole).
                    skip = guard.apply_gradients(job.optimizer, loss, zip(grads, variables), strategy)
                    with tf.control_dependencies([skip]):  # the batch counts as read once its step ran
                        recorded = job.position.record(position, tf.size(labels))
                    with tf.control_dependencies([recorded]):
                        return tf.identity(loss), tf.identity(skip), tf.constant(True)

                loss, skip, has = tf.cond(batch.has_value(), train,
                                          lambda: (tf.constant(float("nan")), tf.constant(False), tf.constant(False)))
                losses.append(loss)
                skipped.append(skip)
                ran.append(has)
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            return tf.stack(losses), tf.stack(skipped), tf.stack(ran), worker
        return worker_steps

    worker_fns = {}
    # epochs: workers whose share ran out. The job ends when every worker's has: a chunk whose
    # closures all found no batch may have run on the finished workers only (any free worker
    # takes a closure), while another still has batches.
    finished = set()

    def run(low, steps):
        """Runs `steps` global steps in the precision `low` picks; returns (losses, skipped) of
        the steps that found a batch, in schedule order, after the guard has seen them (it
        raises on a runaway)."""
        first_step, results = job.step(), []
        while steps > 0:
            k = min(config.steps_per_call, steps)
            if (low, k) not in worker_fns:
                worker_fns[low, k] = worker_steps_for(tf.bfloat16 if low else tf.float32, k)
            results.append(coordinator.schedule(worker_fns[low, k], args=(iterator,)))
            steps -= k
        coordinator.join()
        fetched = [result.fetch() for result in results]  # numpy arrays
        finished.update(int(worker) for _, _, has, worker in fetched if not has.all())
        ran = [(float(loss), bool(skip)) for losses, skips, has, _ in fetched
               for loss, skip, h in zip(losses, skips, has) if h]
        losses, skipped = [loss for loss, _ in ran], [skip for _, skip in ran]
        guard.observe(skipped, first_step)
        return losses, skipped

    target = config.steps
    start_step = job.step()
    warmup = min(2 * workers, max(target - start_step, 0)) if target is not None else 2 * workers
    low = job.use_bf16(None)
    if warmup:
        run(low, warmup)
    job._low_steps += warmup * int(low)  # pylint: disable=protected-access
    timed_start, timed_from = time.perf_counter(), job.step()
    last_log = time.perf_counter()
    while target is None or job.step() < target:
        chunk = config.log_every if target is None else min(config.log_every, target - job.step())
        chunk = min(chunk, _to_next_checkpoint(job))
        losses, skipped = run(low, chunk)
        if not losses:
            if len(finished) == workers:  # epochs: every worker's share ran out
                break
            continue  # this chunk's closures all ran on finished workers
        job._low_steps += len(losses) * int(low)  # pylint: disable=protected-access
        for loss, skip in zip(losses, skipped):  # the switch sees every loss; its last call sets the next chunk's
            low = job.use_bf16(float("nan") if skip else loss)  # a skipped step holds float32
        now = time.perf_counter()
        job.log(f"step {job.step()}: loss {losses[-1]:.4f}, {chunk / (now - last_log):.1f} global steps/s"
                + (f", {sum(skipped)} skipped as non-finite" if any(skipped) else "") + job.skipped_text()
                + job.table_progress())
        job.write_summary(job.step(), losses[-1], chunk / (now - last_log))
        last_log = now
        job._maybe_checkpoint(job.step(), every_chunk=True)  # pylint: disable=protected-access
        job.maybe_publish()
    return job.step() - timed_from, time.perf_counter() - timed_start, _ran_out(job, job.step(), target)


def _to_next_checkpoint(job):
    """Steps to the next multiple of checkpoint_every: a coordinated job schedules its steps in
    chunks, cut there so that checkpoints land on those multiples on every topology."""
    every = job.config.checkpoint_every
    return every - job.step() % every if job.manager is not None else 1 << 62


def _open_journal(job):
    # Horovod: rank 0 writes every rank's ids of a step (gathered).
    return open(job.config.journal, "a", encoding="utf-8") if job.config.journal and job.topology.is_chief else None


def _stream_progress_line(job, step, loss):
    progress, event_time = job.topology.stream_progress(job.stream)
    evicted = ""
    if job.event_ttl is not None:  # event-time TTL: note the tables' steps at the newest event time, evict
        if event_time is not None:
            job.event_ttl.observe(event_time)
        job.event_ttl.evict()
        evicted = f", {job.event_ttl.evicted} evicted by ttl_seconds"
    lag = f"lag {progress['lag_seconds']:.1f} s"
    if progress["lag_messages"] >= 0:
        lag += f", {progress['lag_messages']} messages"
    if progress["lag_bytes"] >= 0:
        lag += f", {progress['lag_bytes']} bytes"
    publisher = job.publisher
    published = f", published base {publisher.version} sequence {publisher.sequence}" if publisher else ""
    job.log(f"step {step}: loss {loss:.4f}, {progress['examples_per_sec']:.1f} examples/s, {lag}, "
            f"{progress['examples']} examples trained{published}{evicted}" + job.skipped_text() + job.table_progress())
    job.write_summary(step, loss, extra={_summary.EXAMPLES_PER_SEC: progress["examples_per_sec"],
                                         "stream/lag_seconds": progress["lag_seconds"],
                                         "stream/lag_messages": progress["lag_messages"]})


def follow_local(job):
    """One step per stream batch until stopped (or steps); the batch's position is committed
    after its update. Horovod: every rank reads its share; the ranks step together."""
    config, topology, stream = job.config, job.topology, job.stream
    step = start = job.step()
    started = last_log = time.perf_counter()
    journal = _open_journal(job)
    left = None if config.steps is None else max(0, config.steps - step)
    stream.update_progress()
    # One trace for every batch size a stream brings (Horovod: ranks on different traces would hang).
    empty = stream.empty_batch()
    job.train_step.trace_for_any_batch_size(empty.features, empty.labels)
    with StopOnSignal(stream) as stop:
        job.stop = stop
        for batch in topology.stream_batches(stream, config.batch_size, stop, left):
            result = job.train_step(batch.features, batch.labels)
            stream.commit(batch)
            step += 1
            if config.journal:
                ids = topology.gather_rows(batch.example_ids, "ttf_journal")
                if journal:
                    journal.write(f"{step} " + " ".join(map(str, ids.tolist())) + "\n")
                    journal.flush()  # in the page cache before any later checkpoint: a kill -9 keeps it
            now = time.perf_counter()
            due = step % config.log_every == 0 or now - last_log > 30
            if topology.agree(due, "progress line"):  # the chief's clock decides
                _stream_progress_line(job, step, float(result["loss"]))
                last_log = now
            job._maybe_checkpoint(step)  # pylint: disable=protected-access
            job.maybe_publish()
    if journal:
        journal.close()
    return step - start, time.perf_counter() - started


def follow_coordinated(job):
    """A parameter-server job on a stream: the chief reads the stream and hands each worker one
    batch per round as the arguments of its step (a bounded transfer: one batch); after the
    round's steps are done it commits their positions in order, and only then may checkpoint.
    A Python Kafka consumer cannot run inside a worker's graph; the folder source reads here
    too, so both sources have one path."""
    config, topology, stream = job.config, job.topology, job.stream
    strategy, coordinator = topology.strategy, topology.coordinator
    workers = topology.num_shares
    variables, guard = job.forward.trainable_variables, job.guard
    step_fns = {}
    attempts = job.step_attempts()

    def step_fn(dtype):  # one function per precision; batches of any size (reduce_retracing)
        if dtype not in step_fns:
            @tf.function(reduce_retracing=True)
            def worker_step(features, labels):
                loss, grads = strategy.run(job.replica_grads, args=(dtype, features, labels))
                loss = attempts.mark(loss)  # the guard's update depends on the loss: counted before it
                skip = guard.apply_gradients(job.optimizer, loss, zip(grads, variables), strategy)
                return tf.identity(loss), tf.identity(skip)
            step_fns[dtype] = worker_step
        return step_fns[dtype]

    step = start = job.step()
    started = last_log = time.perf_counter()
    journal = _open_journal(job)
    loss, low = float("nan"), job.use_bf16(None)
    stream.update_progress()
    started_before = attempts.read()
    with StopOnSignal(stream) as stop:
        job.stop = stop
        while not stop.requested and (config.steps is None or step < config.steps):
            # One batch per worker; a round never waits for more than the first batch and one poll.
            room = workers if config.steps is None else min(workers, config.steps - step)
            room = min(room, _to_next_checkpoint(job))
            batches = [stream.next_batch(config.batch_size)]
            if batches[0] is None:  # stopped
                break
            while len(batches) < room and not stop.requested:
                more = stream.next_batch(config.batch_size, block=False)
                if more is None:
                    break
                batches.append(more)
            dtype = tf.bfloat16 if low else tf.float32
            results = [coordinator.schedule(step_fn(dtype), args=(b.features, b.labels)) for b in batches]
            coordinator.join()
            fetched = [r.fetch() for r in results]
            now_started = attempts.read()
            started_round, started_before = now_started - started_before, now_started
            if started_round != len(batches) and roll_back(job, started_round, len(batches)):
                step = job.step()  # the round's batches are read again from the restored position
                continue
            guard.observe([skip for _, skip in fetched], step)
            for batch in batches:  # after every step of the round: in stream order
                stream.commit(batch)
                step += 1
                if journal:
                    journal.write(f"{step} " + " ".join(map(str, batch.example_ids.tolist())) + "\n")
                    journal.flush()
            for value, skip in fetched:
                loss = float(value)
                low = job.use_bf16(float("nan") if skip else loss)
            job._low_steps += len(batches) * int(dtype == tf.bfloat16)  # pylint: disable=protected-access
            now = time.perf_counter()
            if step // config.log_every > (step - len(batches)) // config.log_every or now - last_log > 30:
                _stream_progress_line(job, step, loss)
                last_log = now
            job._maybe_checkpoint(step, every_chunk=True)  # pylint: disable=protected-access
            job.maybe_publish()
    if journal:
        journal.close()
    return step - start, time.perf_counter() - started


def roll_back(job, started, steps):
    """A round whose steps started `started` times for `steps` batches: the coordinator ran a
    lost worker's step again, so a batch may be trained twice. Restores the last checkpoint
    (model, stream position, TTL notes) and rewinds the stream to it; publishing starts a new
    base (the follower must not keep rows of the rolled-back steps). Returns False (and warns)
    when there is no checkpoint to go back to: the round then counts as trained."""
    manager = job.manager
    if manager is None or manager.restore_latest() is None:
        job.log(f"warning: {started} step starts for {steps} steps this round: a worker was lost and its step run "
                "again, so its batch may be trained twice; give checkpoint_dir for exactly once (the job then rolls "
                "back to its last checkpoint)")
        return False
    job.stream.rewind()
    if job.publisher is not None:
        job.publisher.publish_base()
    job.log(f"a worker was lost: {started} step starts for {steps} steps this round (its step was run again, which "
            f"may train a batch twice); rolled back to {manager.latest} at step {job.step()}, reading the stream "
            f"again from {job.stream.describe()}")
    return True
