"""The training loops of `Job`: one per input kind, batches (`fit`) and a stream (`follow`),
each over the step runner its topology chose (ttf/distribute/_steps.py: each step in this
process, or scheduled on a parameter-server job's workers). After each call of the runner,
the same hooks run in order: progress line and summaries, checkpoint, publish (`AFTER_STEPS`);
a stream round the coordinator ran twice is rolled back first (`roll_back`).

`fit` returns (steps timed, seconds, the step where the data ran out before JobConfig.steps
or None); `follow` returns (steps, seconds)."""
import time

from ttf.distribute.job._stop import StopOnSignal
from ttf.summary import _scalars as _summary


class _Pace:
    """When the progress line is due, and the rate since the last one. `line(job, step, loss,
    steps_per_sec)` writes it; a stream's line is also due after 30 s, by the chief's clock."""

    def __init__(self, step, line, by_clock):
        self.line, self.by_clock = line, by_clock
        self.last, self.last_step = time.perf_counter(), step

    def due(self, job, step, before):
        due = step // job.config.log_every > before // job.config.log_every
        if not self.by_clock:
            return due
        return job.topology.agree(due or time.perf_counter() - self.last > 30, "progress line")


def _progress(job, pace, step, before, loss):
    if not pace.due(job, step, before):
        return
    now = time.perf_counter()
    pace.line(job, step, float(loss), (step - pace.last_step) / max(now - pace.last, 1e-9))
    pace.last, pace.last_step = now, step


def _checkpoint(job, pace, step, before, loss):
    del pace, loss
    job.maybe_checkpoint(step, before)


def _publish(job, pace, step, before, loss):
    del pace, step, before, loss
    job.maybe_publish()


AFTER_STEPS = (_progress, _checkpoint, _publish)


def _after_steps(job, pace, step, before, loss):
    for hook in AFTER_STEPS:
        hook(job, pace, step, before, loss)


def _fit_line(job, step, loss, steps_per_sec):
    skipped, skipped_input = job.skipped_steps(), job.skipped_input()  # (input: collectives on ranks, once)
    ranks = f" ({job.topology.num_ranks} ranks)" if job.topology.num_ranks > 1 else ""
    job.log(f"step {step}: loss {loss:.4f}, {steps_per_sec:.1f} {job.runner.rate_unit}"
            + (f", {skipped} skipped as non-finite" if skipped else "") + job.skipped_text(skipped_input)
            + job.table_progress() + ranks)
    job.write_summary(step, loss, steps_per_sec, skipped=skipped_input)


def _ran_out(job, step, target):
    """The step where the data ended before `target` (saying so in one line), else None."""
    if target is None or step >= target:
        return None
    job.log(f"warning: the data ran out at step {step} before steps={target}: give more data (or repeat() it), "
            "or fewer steps")
    return step


def fit(job, dataset, finite=True):
    """Trains on `dataset(share)` to config.steps (or until the shares end). finite: the shares
    may end (a Reader's shares with steps never do)."""
    config, runner = job.config, job.runner
    target = config.steps
    step = job.step()
    if target is not None and step >= target:
        job.log(f"already at step {step} >= steps {target}; nothing to train")
        return 0, 0.0, None
    runner.start_fit(dataset, finite)
    warmup = runner.warm_up(target)
    step = job.step()
    started = time.perf_counter()
    pace = _Pace(step, _fit_line, by_clock=False)
    run, timed_start, timed_from = 0, None, 0
    while target is None or step < target:
        if timed_start is None and run >= warmup:
            timed_start, timed_from = time.perf_counter(), run
            job.timed_cpu = -time.process_time()
        ran, loss, ended = runner.run(runner.next_call(step, target))
        if ran == 0:
            if ended:
                break
            continue
        before, run, step = step, run + ran, step + ran
        if timed_start is None and run >= warmup:
            float(loss)  # the warm-up's last step done before the timing starts
        _after_steps(job, pace, step, before, loss)
        if ended:
            break
    ran_out = _ran_out(job, step, target)
    if timed_start is None:  # shorter than the warm-up: time everything
        return run, max(time.perf_counter() - started, 1e-9), ran_out
    job.timed_cpu += time.process_time()
    return run - timed_from, time.perf_counter() - timed_start, ran_out


def _open_journal(job):
    # The chief writes every share's ids of a step (gathered over ranks).
    return open(job.config.journal, "a", encoding="utf-8") if job.config.journal and job.topology.is_chief else None


def _stream_line(job, step, loss, steps_per_sec):
    del steps_per_sec  # a stream's rate is in examples
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
    skipped = job.skipped_input()
    job.log(f"step {step}: loss {loss:.4f}, {progress['examples_per_sec']:.1f} examples/s, {lag}, "
            f"{progress['examples']} examples trained{published}{evicted}" + job.skipped_text(skipped)
            + job.table_progress())
    job.write_summary(step, loss, extra={_summary.EXAMPLES_PER_SEC: progress["examples_per_sec"],
                                         "stream/lag_seconds": progress["lag_seconds"],
                                         "stream/lag_messages": progress["lag_messages"]}, skipped=skipped)


def follow(job):
    """Trains on job.stream until stopped (or config.steps), a round of batches at a time
    (one batch in this process; one per worker of a parameter-server job). Each batch's
    position is committed after its update, in stream order, so every checkpoint pairs the
    model with the stream position it has seen."""
    config, stream = job.config, job.stream
    step = start = job.step()
    started = time.perf_counter()
    pace = _Pace(step, _stream_line, by_clock=True)
    journal = _open_journal(job)
    left = None if config.steps is None else max(0, config.steps - step)
    stream.update_progress()
    with StopOnSignal(stream) as stop:
        job.stop = stop
        for trained in job.runner.rounds(stream, stop, left):
            if trained.restarts and roll_back(job, *trained.restarts):
                step = job.step()  # the round's batches are read again from the restored position
                continue
            before = step
            for batch in trained.batches:  # after every step of the round: in stream order
                stream.commit(batch)
                step += 1
                if config.journal:
                    ids = job.topology.gather_rows(batch.example_ids, "ttf_journal")
                    if journal:
                        journal.write(f"{step} " + " ".join(map(str, ids.tolist())) + "\n")
                        journal.flush()  # in the page cache before any later checkpoint: a kill -9 keeps it
            _after_steps(job, pace, step, before, trained.loss)
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
