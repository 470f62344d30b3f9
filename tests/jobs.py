"""Helpers for tests that run training jobs in subprocesses (train.py, start_all.sh, horovodrun,
a user's script): the processes below a launcher, a stream job's journal, waiting on a job,
stopping it with SIGTERM."""
import os
import re
import signal
import time


def descendants(pid):
    """Every process below `pid` (this job's ranks, not another job's)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended meanwhile
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def ranks_of(proc):
    """The pids of the train.py processes below a launcher (horovodrun, start_all.sh), or [proc.pid]
    for a plain process."""
    if os.path.basename(proc.args[0]) not in ("horovodrun", "start_all.sh"):
        return [proc.pid]
    ranks = []
    for pid in descendants(proc.pid):
        try:
            name = open(f"/proc/{pid}/comm", encoding="utf-8").read()
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if name.startswith("python") and any(arg.endswith(b"train.py") for arg in command):
            ranks.append(pid)
    return ranks


def journal(tmp_path, run):
    """Run `run`'s stream journal (train.py --stream-journal tmp_path/journal{run}): [(step, [example id])]."""
    path = tmp_path / f"journal{run}"
    steps = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        step, *ids = line.split()
        steps.append((int(step), [int(i) for i in ids]))
    return steps


def wait_for(condition, what, proc=None, log=None, seconds=240):
    """Polls `condition` until true; fails with the job's log tail if it ends or time runs out."""
    deadline = time.monotonic() + seconds
    tail = lambda: f":\n{log.read_text()[-4000:]}" if log else ""  # noqa: E731
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job ended ({proc.returncode}) before {what}{tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}{tail()}")
        time.sleep(0.2)


def resumed_step(log):
    """The step of the checkpoint a train.py run resumed from (its "resumed from ... at step S" line)."""
    found = re.search(r"resumed from \S+ at step (\d+)", log.read_text())
    return int(found.group(1)) if found else None


def stop(proc, log, signal_one_rank=True):
    """SIGTERM to one rank (the ranks agree to stop at their next step) or to every process;
    the job must publish, checkpoint and exit 0."""
    targets = ranks_of(proc)
    for rank in targets[:1] if signal_one_rank else targets:
        os.kill(rank, signal.SIGTERM)
    assert proc.wait(180) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert re.search(r"\[train\] stopped by .+? after step \d+ \(\d+ examples trained\); checkpoint \S+ "
                     r"holds the model and the stream position; exiting 0", text), text[-4000:]
    return text
