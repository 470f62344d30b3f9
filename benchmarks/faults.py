"""Fault-injection sweep: kill -9, a full disk and I/O errors during training and saves.

Every case must end in one of two ways: the job restores and resumes with 0 keys lost
relative to the last complete checkpoint, or it stops with one clear line. A hang (past
--timeout) or a restore that differs from the last complete checkpoint is a failure.

Kinds of case (--kinds, all by default):
  kill-chief   one process training ttf tables through the public CheckpointManager (a
               full save, then deltas: --full-every), killed with SIGKILL at a random
               moment after its first save began (training or saving);
  kill-save    the same, killed inside a save (a random delay after it starts);
  io-error     one save fails in the middle of writing a file (EFBIG: RLIMIT_FSIZE is
               lowered for that save only); the loop logs it and goes on, as a training
               loop that saves again at the next interval does;
  full-disk    the checkpoint folder on a real small tmpfs (`mount -t tmpfs -o size=...`;
               when this machine refuses the mount, the stand-in is RLIMIT_FSIZE for every
               save from a random one on); the job stops with one line when a save fails;
  kill-ps, kill-worker
               a real parameter-server job (start_all.sh, models/train.py) with a
               checkpoint folder (full and delta saves: --full-every 3), a ps or worker task
               killed with SIGKILL, half the time inside one of the first four saves, half at
               a random moment of training (the case line says where it landed, from
               train.py's "checkpoint at step N: saving (full|delta)" / "saved" lines); a lost
               ps stops the chief with one line, a lost worker lets it finish; then a
               restart resumes from the newest checkpoint;
  kill-rank    the same with a Horovod job (start_all.sh --hvd, 2 ranks), one random rank killed.
  kill-sync    the same with a synchronous job on TensorFlow's collectives (start_all.sh --sync,
               2 workers), one random worker killed; the other must stop within 60 s.

Format-agnostic: the one-process child writes a journal (step, number of keys, float64
checksum of every key's row and slots) just before each save and a `done` line after it;
a fresh process restores with CheckpointManager.restore_latest() and its table must equal
the journal's entry for the step it restored, which must be the last complete save (or
the one in flight when the kill came after its files were complete). The cluster kinds
check, through models/train.py's --metrics-out, that the restart resumed at the newest
checkpoint's step with the table (key count and checksum) the job reported at its end when
it finished (a lost worker), or else the same table in two restores.

Examples:
  python benchmarks/faults.py --cases 3                     # a small sweep: 3 cases per kind
  python benchmarks/faults.py --cases 20 --kinds kill-chief kill-save io-error full-disk
  python benchmarks/faults.py --cases 20 --keys-per-step 20000 --steps 60   # bigger tables
Exit codes: 0 every case passed, 1 some failed (each printed), 2 bad usage.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # procs.py, also when a test loads this file by path
from procs import command_of, descendants  # noqa: E402
KINDS = ("kill-chief", "kill-save", "io-error", "full-disk", "kill-ps", "kill-worker", "kill-rank", "kill-sync")
STOP_SECONDS = 60  # a synchronous job (kill-rank, kill-sync) stops this soon after a worker is lost
ONE_PROCESS = ("kill-chief", "kill-save", "io-error", "full-disk")


# -- the one-process child: trains, journals and saves; or restores and reports -------------------

def _child_model(args):
    import tensorflow as tf
    import ttf

    tf.keras.utils.set_random_seed(args.seed)
    layer = ttf.FusedEmbedding(8, num_fields=4, name="faults_table")
    dense = tf.keras.layers.Dense(1, name="faults_dense")
    optimizer = ttf.optimizers.Adam(0.01)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(layer=layer, dense=dense, optimizer=optimizer, step=step)
    manager = ttf.checkpoint.CheckpointManager(checkpoint, args.checkpoint_dir, full_every=args.full_every,
                                               max_to_keep=2)
    return layer, dense, optimizer, step, manager


def _table_summary(layer):
    """(keys, float64 sum of every key's row and slots in key order): the same for the same table."""
    import numpy as np

    exported = layer.export_table()
    keys, values = exported["keys"].numpy(), exported["values"].numpy()
    return len(keys), float(np.sum(values[np.argsort(keys)], dtype=np.float64))


def _batch(step, keys_per_step):
    """Keys of step `step`: half new ones (the table grows), half from a small hot set."""
    import numpy as np

    rng = np.random.default_rng(step)
    new = step * keys_per_step + np.arange(keys_per_step // 2)
    hot = rng.integers(0, 1000, keys_per_step - len(new))
    keys = np.concatenate([new, hot]).astype(np.int64)
    rng.shuffle(keys)
    return keys.reshape(-1, 4), rng.random((len(keys) // 4, 1)).astype(np.float32)


def child_train(args):
    import tensorflow as tf

    layer, dense, optimizer, step, manager = _child_model(args)
    restored = manager.restore_latest()
    variables = None

    @tf.function
    def train(ids, labels):
        with tf.GradientTape() as tape:
            logits = dense(tf.reshape(layer(ids, training=True), [-1, 32]))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        step.assign_add(1)
        return loss

    ids, labels = _batch(0, args.keys_per_step)
    layer(tf.constant(ids[:1]))  # builds the layer without inserting (inference)
    dense.build((None, 32))
    variables = layer.trainable_variables + dense.trainable_variables
    journal = open(args.journal, "a")
    print(f"[child] start at step {int(step.numpy())} (restored {restored})", flush=True)
    fail_save, failed = args.fail_save, False
    while int(step.numpy()) < args.steps:
        s = int(step.numpy())
        ids, labels = _batch(s + 1, args.keys_per_step)
        train(tf.constant(ids), tf.constant(labels))
        s += 1
        if s % args.save_every:
            continue
        size, checksum = _table_summary(layer)
        journal.write(json.dumps({"begin": s, "keys": size, "checksum": checksum}) + "\n")
        journal.flush()
        os.fsync(journal.fileno())
        print(f"[child] saving step {s}", flush=True)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        inject = fail_save is not None and (s // args.save_every == fail_save or (args.fail_from and failed))
        if inject:  # an I/O error in the middle of this save's files: writes past --fail-bytes fail (EFBIG)
            resource.setrlimit(resource.RLIMIT_FSIZE, (args.fail_bytes, limit[1]))
        try:
            manager.save(s)
        except (OSError, tf.errors.OpError) as err:
            failed = True
            first = re.sub(r"\{\{[^}]*\}\}\s*", "", str(err)).strip().splitlines()[0][:200]
            print(f"[child] save at step {s} failed: {type(err).__name__}: {first}", flush=True)
            if args.stop_on_failed_save:
                print(f"[child] error: the checkpoint at step {s} could not be written ({first}); "
                      f"stopping: free space under {args.checkpoint_dir} and restart to resume", flush=True)
                return 1
            continue
        finally:
            if inject:
                resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        journal.write(json.dumps({"done": s}) + "\n")
        journal.flush()
        os.fsync(journal.fileno())
    print(f"[child] done at step {int(step.numpy())}", flush=True)
    return 0


def child_verify(args):
    layer, _, _, step, manager = _child_model(args)
    restored = manager.restore_latest()
    size, checksum = _table_summary(layer)
    print("[verify] " + json.dumps({"restored": restored, "step": int(step.numpy()), "keys": size, "checksum": checksum}))
    return 0


# -- the sweep ------------------------------------------------------------------------------------

def _python():
    return os.path.join(ROOT, ".venv", "bin", "python") if os.path.exists(os.path.join(ROOT, ".venv")) else sys.executable


def _child(args, mode, ckpt, journal, extra=(), **popen):
    cmd = [_python(), os.path.abspath(__file__), "--child", mode, "--checkpoint-dir", ckpt, "--journal", journal,
           "--steps", str(args.steps), "--save-every", str(args.save_every), "--full-every", str(args.full_every),
           "--keys-per-step", str(args.keys_per_step), *extra]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, **popen)


def _read_journal(path):
    entries, done = {}, []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by the kill
                continue
            if "begin" in record:
                entries[record["begin"]] = record
            else:
                done.append(record["done"])
    return entries, done


def _verify(args, ckpt, journal):
    """(ok, detail): a fresh process restores; its table must be the last complete save's."""
    entries, done = _read_journal(journal)
    proc = _child(args, "verify", ckpt, journal)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return False, "the restore hung"
    if proc.returncode != 0:
        return False, f"the restore failed: {out.strip().splitlines()[-1] if out.strip() else proc.returncode}"
    reports = [line[len("[verify] "):] for line in out.splitlines() if line.startswith("[verify] ")]
    if not reports:
        return False, f"the restore printed no report: {out[-600:]}"
    got = json.loads(reports[-1])
    last_done = done[-1] if done else None
    restored = got["restored"]
    if restored is None:
        return (last_done is None), f"nothing restored (last complete save: {last_done})"
    if last_done is not None and restored < last_done:
        return False, f"restored step {restored}, older than the last complete save {last_done}"
    want = entries.get(restored)
    if want is None:
        return False, f"restored step {restored}, which no save began"
    if (got["keys"], got["checksum"]) != (want["keys"], want["checksum"]):
        return False, (f"restored step {restored}: {got['keys']} keys, checksum {got['checksum']!r}; its save held "
                       f"{want['keys']} keys, checksum {want['checksum']!r} ({want['keys'] - got['keys']} keys lost)")
    return True, f"restored step {restored} (last complete save {last_done}): {got['keys']} keys, identical"


def _wait_line(proc, needle, deadline):
    """Reads proc's output until a line holds `needle` (True) or it ends / the deadline passes."""
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            return False, "".join(lines)
        lines.append(line)
        if needle in line:
            return True, "".join(lines)
    return False, "".join(lines)


def _finish(proc, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0], True


def case_one_process(args, kind, rng, work):
    ckpt, journal = os.path.join(work, "ckpt"), os.path.join(work, "journal")
    os.makedirs(ckpt)
    mounted = False
    extra = []
    if kind == "io-error":
        extra = ["--fail-save", str(rng.randint(1, args.steps // args.save_every - 1)),
                 "--fail-bytes", str(rng.choice([1, 4096, 65536]))]
    elif kind == "full-disk":
        size = args.tmpfs_kb
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", ckpt],
                                 capture_output=True).returncode == 0
        extra = ["--stop-on-failed-save"]
        if not mounted:  # stand-in: every save from a random one on fails past the limit
            extra += ["--fail-save", str(rng.randint(1, args.steps // args.save_every - 1)), "--fail-from",
                      "--fail-bytes", str(size * 1024)]
    try:
        proc = _child(args, "train", ckpt, journal, extra)
        deadline = time.time() + args.timeout
        note = ""
        if kind in ("kill-chief", "kill-save"):
            if kind == "kill-save":
                target = rng.randint(1, args.steps // args.save_every - 1) * args.save_every
                seen, _ = _wait_line(proc, f"saving step {target}", deadline)
                delay = rng.uniform(0, args.kill_window)
                time.sleep(delay)
                note = (f"killed {delay:.3f}s after the save at step {target} began" if seen
                        else f"the save at step {target} never began")
            else:
                # From the first save on (before it, there is nothing to lose): anywhere in training or saving.
                _wait_line(proc, f"saving step {args.save_every}", deadline)
                delay = rng.uniform(0, args.kill_window * 5)
                time.sleep(delay)
                note = f"killed {delay:.2f}s after the first save began"
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, hung = _finish(proc, 30)
        else:
            out, hung = _finish(proc, max(deadline - time.time(), 1))
            if hung:
                return False, "the job hung"
            if proc.returncode != 0:
                errors = [line for line in out.splitlines() if "error:" in line]
                if len(errors) != 1:
                    return False, f"exit {proc.returncode} without one clear line: {out[-600:]}"
                note = "stopped on one line: " + errors[0][:160]
            else:
                fails = [line for line in out.splitlines() if "failed:" in line]
                note = f"{len(fails)} save(s) failed and were logged, training went on"
            if kind == "full-disk":
                note += " (tmpfs" + (f" {args.tmpfs_kb} KiB)" if mounted else " refused: RLIMIT_FSIZE stand-in)")
        ok, detail = _verify(args, ckpt, journal)
        return ok, f"{note}; {detail}"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", ckpt], capture_output=True)


def _metrics_run(args, work, extra, name):
    metrics = os.path.join(work, f"{name}.json")
    cmd = [os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", "--batch-size", "32", "--synthetic-rows", "20000",
           "--metrics-out", metrics, *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, metrics


class _Output:
    """A job's output lines, read on a thread, each with the time it arrived: the sweep sleeps
    until its kill while the job goes on printing, and then tells where the kill landed."""

    def __init__(self, proc):
        self.proc, self.lines, self.ended = proc, [], False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.time(), line))
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait(self, needle, deadline, nth=1):
        """True once `nth` lines hold `needle`; False when the job ends or the deadline passes first."""
        with self._changed:
            while sum(needle in line for _, line in self.lines) < nth:
                if self.ended or time.time() >= deadline:
                    return False
                self._changed.wait(min(1.0, max(deadline - time.time(), 0.01)))
            return True

    def finish(self, timeout):
        """(the whole output, hung): waits for the job; past `timeout` kills its process group."""
        try:
            self.proc.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            hung = True
        self._reader.join(30)
        return self.text(), hung

    def text(self):
        with self._changed:
            return "".join(line for _, line in self.lines)

    def landed(self, moment):
        """Where a kill at `moment` came, from models/train.py's checkpoint lines: inside the
        full or delta save of step N ("saving (...)" printed, "saved" not yet), or in training."""
        with self._changed:
            before = [line for when, line in self.lines if when <= moment]
        phase = "training (before any save)"
        for line in before:
            found = re.search(r"\[train\] checkpoint at step (\d+): (saving \((\w+)\)|saved)", line)
            if found and found.group(3):
                phase = f"inside the {found.group(3)} save of step {found.group(1)}"
            elif found:
                phase = f"training (after the save of step {found.group(1)})"
        return phase


def _child_pids(parent, needle):
    """Processes below `parent` whose command line holds `needle`: never a launcher (horovodrun,
    whose own command line names the script too, or a shell running it), so kill-rank kills a rank."""
    found = []
    for pid in descendants(parent):
        command = command_of(pid)
        line = " ".join(command)
        if command and needle in line and "horovodrun" not in line and "python" in os.path.basename(command[0]):
            found.append(pid)
    return found


def _task_name(pid):
    """'ps 0', 'worker 1' (a PS task, or a synchronous worker's --task-index), 'rank 1' (Horovod's
    HOROVOD_RANK in its environment): which task `pid` is."""
    line = " ".join(command_of(pid))
    task = re.search(r"--job (\w+) --index (\d+)", line)
    if task:
        return f"{task.group(1)} {task.group(2)}"
    sync = re.search(r"--sync .*--task-index (\d+)", line)
    if sync:
        return f"worker {sync.group(1)}"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        return f"rank {env[b'HOROVOD_RANK'].decode()}"
    except (OSError, KeyError):
        return f"pid {pid}"


def case_cluster(args, kind, rng, work):
    """A real PS (or Horovod) job killed in part; then a restart must resume at the newest
    checkpoint with the table the job ended with (when it finished) or the same table twice.

    Half the kills aim at a save (a random delay of up to --kill-window after one of the first
    four saves began: full, delta, delta, full with --full-every 3), half at any moment of
    training (up to 10x --kill-window after the first progress line); the job's checkpoint
    lines tell where each one landed."""
    import tensorflow as tf

    ckpt = os.path.join(work, "ckpt")
    common = ["--checkpoint-dir", ckpt, "--checkpoint-every", str(args.cluster_checkpoint_every), "--full-every", "3"]
    hvd = {"kill-rank": ["--hvd"], "kill-sync": ["--sync"]}.get(kind, [])
    proc, first_metrics = _metrics_run(args, work, ["--steps", str(args.cluster_steps), *common, *hvd], "first")
    output = _Output(proc)
    deadline = time.time() + args.timeout
    if rng.random() < 0.5:
        save = rng.randint(1, 4)
        seen = output.wait(": saving (", deadline, nth=save)
        delay = rng.uniform(0, args.kill_window)
        aim = f"aimed {delay:.2f} s into save #{save}"
    else:
        seen = output.wait("[train] step", deadline)
        delay = rng.uniform(0, args.kill_window * 10)
        aim = f"aimed {delay:.2f} s after the first progress line"
    time.sleep(delay)
    needle = {"kill-ps": "--job ps --index 0", "kill-worker": "--job worker --index",
              "kill-rank": "models/train.py", "kill-sync": "models/train.py"}[kind]
    victims = _child_pids(proc.pid, needle) if seen and proc.poll() is None else []
    victim = rng.choice(victims) if victims else None
    if victim is not None:
        who = _task_name(victim)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        note = f"{kind}: killed {who} ({aim}), landed {output.landed(killed_at)}"
    else:
        note = f"{kind}: no kill ({aim}; the job had {'ended' if proc.poll() is not None else 'not started'})"
    out, hung = output.finish(max(deadline - time.time(), 1))
    if hung:
        return False, f"{note}; the job hung after the kill; output: {out[-600:]}"
    if victim is not None and kind in ("kill-rank", "kill-sync"):
        stopped = time.time() - killed_at
        note += f"; stopped {stopped:.0f} s after the kill"
        if stopped > STOP_SECONDS:
            return False, note + f" (more than {STOP_SECONDS} s)"
    # The clear line of a stop: train.py's, or start_all.sh's when horovodrun stopped the other
    # ranks before one of them could say a peer was lost.
    stops = ("[train] error", "[start_all] Horovod rank", "[start_all] the synchronous job failed")
    lines = [line for line in out.splitlines() if any(stop in line for stop in stops) or "[train] done" in line]
    note += f"; job exit {proc.returncode}: " + (lines[-1][:140] if lines else "no [train] line")
    if kind == "kill-worker" and proc.returncode != 0:
        return False, note + " (a lost worker must let the job finish)"
    if proc.returncode != 0 and not any(stop in line for line in lines for stop in stops):
        return False, note + f" (no one clear line); output: {out[-600:]}"
    chain = os.path.join(ckpt, "ttf_chain.json")
    newest = None
    if os.path.exists(chain):
        latest = (json.load(open(chain)).get("deltas") or [json.load(open(chain))["full"]])[-1]
        newest = int(latest.rsplit("-", 1)[1])
    elif tf.train.latest_checkpoint(ckpt):
        newest = int(tf.train.latest_checkpoint(ckpt).rsplit("-", 1)[1])
    if newest is None:
        return True, note + "; no checkpoint had been written: nothing to restore"
    # The job that finished reported the table it saved last: one restore must give it back.
    # Otherwise two restores must agree.
    finished = proc.returncode == 0 and os.path.exists(first_metrics)
    want = None
    if finished:
        m = json.load(open(first_metrics))
        want = (m.get("table_size"), m.get("table_checksum"))
    summaries = []
    for name in ("restore1",) if finished else ("restore1", "restore2"):
        # --steps = the saved step: restore, train nothing, report
        restart, metrics = _metrics_run(args, work, ["--steps", str(newest), *common, *hvd], name)
        text, hung = _finish(restart, args.timeout)
        if hung or restart.returncode != 0 or not os.path.exists(metrics):
            return False, note + f"; the restart failed: {text[-600:]}"
        if f"at step {newest}" not in text:
            return False, note + f"; the restart did not resume at step {newest}: {text[-600:]}"
        m = json.load(open(metrics))
        summaries.append((m.get("table_size"), m.get("table_checksum")))
    if want is not None:
        if summaries[0] != want:
            lost = (want[0] or 0) - (summaries[0][0] or 0)
            return False, note + f"; the restore of step {newest} gave {summaries[0]}, the job saved {want} ({lost} keys lost)"
        return True, note + f"; restart resumed at step {newest} with {want[0]} keys, the table the job saved"
    if summaries[0] != summaries[1] or not summaries[0][0]:
        return False, note + f"; two restores of step {newest} differ: {summaries}"
    return True, note + f"; restart resumed at step {newest} with {summaries[0][0]} keys, the same twice"


def sweep(args):
    rng = random.Random(args.seed)
    results = {kind: [] for kind in args.kinds}
    started = time.time()
    for kind in args.kinds:
        for case in range(args.cases):
            work = tempfile.mkdtemp(prefix=f"ttf_faults_{kind}_")
            try:
                run = case_one_process if kind in ONE_PROCESS else case_cluster
                ok, detail = run(args, kind, rng, work)
            except Exception as err:  # noqa: BLE001 (a sweep reports every case)
                ok, detail = False, f"the sweep itself failed: {type(err).__name__}: {err}"
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[kind].append(ok)
            print(f"[faults] {kind} #{case + 1}: {'ok' if ok else 'FAILED'}: {detail}", flush=True)
    print(f"[faults] summary ({time.time() - started:.0f}s):")
    for kind, oks in results.items():
        print(f"[faults]   {kind:<11} {sum(oks)}/{len(oks)} ok")
    return 0 if all(all(oks) for oks in results.values()) else 1


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=20, help="cases per kind (default 20)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which kinds (default all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random moments and sizes (default 0)")
    p.add_argument("--steps", type=int, default=40, help="one-process cases: training steps (default 40)")
    p.add_argument("--save-every", type=int, default=5, help="one-process cases: steps between saves (default 5)")
    p.add_argument("--full-every", type=int, default=3,
                   help="one-process cases: every M-th save is full, the others deltas (default 3)")
    p.add_argument("--keys-per-step", type=int, default=4000,
                   help="one-process cases: keys per batch, half of them new (default 4000: the table grows by "
                        "2000 keys a step)")
    p.add_argument("--kill-window", type=float, default=0.3,
                   help="seconds: kill-save kills within this after a save starts; kill-chief within 5x it after "
                        "the first save starts; cluster kinds within 10x it after the first progress line (default 0.3)")
    p.add_argument("--tmpfs-kb", type=int, default=2048, help="full-disk: size of the tmpfs in KiB (default 2048)")
    p.add_argument("--cluster-steps", type=int, default=400, help="cluster kinds: steps of the job (default 400)")
    p.add_argument("--cluster-checkpoint-every", type=int, default=20,
                   help="cluster kinds: steps between checkpoints (default 20; a parameter-server job saves at its "
                        "first progress line, every 50 steps, past each multiple)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a case counts as hung (default 600)")
    child = p.add_argument_group("internal: the one-process child")
    child.add_argument("--child", choices=["train", "verify"], default=None, help=argparse.SUPPRESS)
    child.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    child.add_argument("--journal", help=argparse.SUPPRESS)
    child.add_argument("--fail-save", type=int, default=None, help=argparse.SUPPRESS)
    child.add_argument("--fail-from", action="store_true", help=argparse.SUPPRESS)
    child.add_argument("--fail-bytes", type=int, default=4096, help=argparse.SUPPRESS)
    child.add_argument("--stop-on-failed-save", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("cases", "steps", "save_every", "full_every", "keys_per_step", "tmpfs_kb", "cluster_steps",
                 "cluster_checkpoint_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.steps // args.save_every < 2:
        p.error("--steps must allow at least two saves (--steps >= 2 * --save-every)")
    if args.keys_per_step % 4 or args.keys_per_step < 8:
        p.error("--keys-per-step must be a multiple of 4, >= 8 (4 fields per example)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child == "train":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE a write fails (EFBIG) instead
        return child_train(args)
    if args.child == "verify":
        return child_verify(args)
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
