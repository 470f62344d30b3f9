"""Exactly-once under kill -9 (issue 23): a stream job killed again and again while it trains
and publishes, then checked example by example.

One job trains on a folder stream (models/train.py --stream, --publish-dir) while a producer
renames a file of --rows-per-file examples into the folder every --file-every seconds, and a
follower process (ttf.serving.DeltaFollower) follows the published deltas. --kills times, at a
random moment (--kill-after seconds after the job has trained again), one process chosen from
--victims gets SIGKILL:

  trainer   the training process (one process: models/train.py; --job cluster: the chief);
            the job is started again with the same flags and resumes from its checkpoint
  ps        the parameter server (--job cluster): the chief stops with one line (exit 1) and
            the whole job is started again
  worker    worker 1 (--job cluster): started again alone, with the same command line; the
            chief's coordinator re-connects it and the job goes on
  rank      one of the 2 Horovod ranks (--job hvd, at random): horovodrun stops the other and
            start_all.sh exits 1; the job is started again and resumes from its checkpoint
  follower  the follower: started again, it loads the newest base and applies its deltas

--format parquet or tfrecord: each stream file is Parquet (written by pyarrow) or TFRecord of
tf.train.Example (tf.io.TFRecordWriter) of the same rows, renamed into the folder as
part-NNNNNN.parquet or part-NNNNNN.tfrecord; the checks are the same.

Data keeps arriving while a process is down. After the last kill the producer stops, the job
trains to the end of the stream and gets SIGTERM (it publishes, checkpoints, exits 0), and
three checks run:

  journal   --stream-journal replayed (a step number not above the previous one is a restart
            from a checkpoint: the steps after it were rolled back with the model) gives every
            example id of the stream exactly once: 0 lost, 0 duplicated;
  table     in the final checkpoint, every example's own key (column C1 holds a value unique
            to the example) has been updated exactly once (the row's count): the model itself
            trained each example once, whatever the journal says;
  follower  the follower, at the trainer's last published (base, sequence), serves the
            checkpoint's rows bit for bit.

Examples:
  python benchmarks/online_faults.py --kills 20                                # the trainer, one process
  python benchmarks/online_faults.py --kills 6 --victims trainer follower
  python benchmarks/online_faults.py --job cluster --kills 6 --victims ps worker trainer
  python benchmarks/online_faults.py --kills 6 --format parquet                 # Parquet files in the folder
  TTF_TF=2.16 .venv-tf2.16/bin/python benchmarks/online_faults.py --job hvd --kills 10 --victims rank follower
Exit codes: 0 every check passed, 1 a check failed (printed), 2 bad usage.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from procs import command_of, descendants  # benchmarks/, the script's folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ID_SHIFT = 40  # ttf.data.ID_SHIFT (not imported: the driver stays light until the checks)
TABLE = "model/sparse/logical_table/ttf/"

# The follower: follows BASE until told to stop, then compares what it serves with a checkpoint.
FOLLOWER = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, sys.argv[3])
import numpy as np, tensorflow as tf
from ttf.serving import DeltaFollower

base, control = sys.argv[1], sys.argv[2]
follower, errors = None, []
while True:
    try:
        if follower is None and os.path.isdir(base):
            follower = DeltaFollower(base)
        if follower is not None:
            follower.sync()
    except (OSError, ValueError, tf.errors.OpError) as err:  # a base removed under it: try again
        errors.append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        follower = None
    if os.path.exists(control):
        want = json.load(open(control))
        if follower is not None and (follower.version, follower.sequence) == (want["version"], want["sequence"]):
            break
    time.sleep(0.3)
reader = tf.train.load_checkpoint(want["checkpoint"])
table = follower._info["tables"][0]
names = [n for n in reader.get_variable_to_shape_map() if n.startswith(want["prefix"]) and n.endswith("/keys")]
rows = {}
for name in names:
    values = reader.get_tensor(name[: -len("keys")] + "values")[:, :table["dim"]]
    rows.update(zip(reader.get_tensor(name).tolist(), values))
keys = np.array(sorted(rows), np.int64)
served = follower.lookup(table["name"], keys).numpy()
print(json.dumps({"version": follower.version, "sequence": follower.sequence, "rows": len(keys),
                  "equal": bool(np.array_equal(served, np.stack([rows[k] for k in keys.tolist()]))),
                  "refused": follower.refused, "errors": errors[-5:]}))
"""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", choices=["single", "cluster", "hvd"], default="single",
                   help="single: one models/train.py process; cluster: start_all.sh's local PS cluster (1 ps, "
                        "2 workers, the chief reading the stream); hvd: start_all.sh --hvd, 2 Horovod ranks each "
                        "reading its share of the folder (run it with TTF_TF=2.16, where horovod builds) "
                        "(default single)")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs in the sweep (default 20)")
    p.add_argument("--victims", nargs="+", choices=["trainer", "ps", "worker", "rank", "follower"],
                   default=["trainer"],
                   help="processes to kill, each kill picks one at random (default trainer)")
    p.add_argument("--in-order", action="store_true",
                   help="kill the --victims in the order given (cycling) instead of at random (the test uses it)")
    p.add_argument("--kill-after", type=float, nargs=2, default=[1.0, 8.0], metavar=("MIN", "MAX"),
                   help="seconds after the job has trained 3 more steps at which a kill comes, uniform "
                        "(default 1 8)")
    p.add_argument("--format", choices=["text", "parquet", "tfrecord"], default="text",
                   help="the stream files' format: Criteo TSV, Parquet (pyarrow) or TFRecord of tf.train.Example "
                        "(default text)")
    p.add_argument("--rows-per-file", type=int, default=400, help="examples per stream file (default 400)")
    p.add_argument("--file-every", type=float, default=2.0, help="seconds between stream files (default 2)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per step (default 256)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    p.add_argument("--publish-every", type=float, default=1.0, help="seconds between deltas (default 1)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any one phase may take; the final catch-up only while it trains nothing (default 300)")
    p.add_argument("--seed", type=int, default=0, help="kill times and victims (default 0)")
    p.add_argument("--workdir", default=None, help="where the stream, checkpoints and logs go (default a temporary "
                                                   "folder, removed when every check passed)")
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    args = p.parse_args(argv)
    if args.job != "cluster" and {"ps", "worker"} & set(args.victims):
        p.error("--victims ps and worker need --job cluster")
    if (args.job == "hvd") != ("rank" in args.victims) or (args.job == "hvd" and "trainer" in args.victims):
        p.error("--job hvd kills a rank (--victims rank, and follower); --victims rank needs --job hvd")
    for name in ("kills", "rows_per_file", "batch_size", "checkpoint_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not (0 <= args.kill_after[0] <= args.kill_after[1]):
        p.error("--kill-after MIN MAX needs 0 <= MIN <= MAX")
    return args


SUFFIXES = {"text": "", "parquet": ".parquet", "tfrecord": ".tfrecord"}


def file_name(sequence, fmt):
    return f"part-{sequence:06d}{SUFFIXES[fmt]}"


def write_rows(lines, path, fmt):
    """Criteo TSV lines as `fmt` at path: Parquet by pyarrow (counts int64, categorical strings, empty
    fields null) or TFRecord of tf.train.Example by tf.io.TFRecordWriter (empty fields absent)."""
    # pylint: disable=import-outside-toplevel
    import ttf
    names = ttf.data.CRITEO.header_line(",").split(",")
    columns = list(zip(*(line.split("\t") for line in lines)))
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        table = {"label": pa.array([int(v) for v in columns[0]], pa.int64())}
        table.update({n: pa.array([int(v) if v else None for v in columns[i]], pa.int64())
                      for i, n in enumerate(names[1:14], 1)})
        table.update({n: pa.array([v or None for v in columns[i]], pa.string()) for i, n in enumerate(names[14:], 14)})
        pq.write_table(pa.table(table), path, row_group_size=max(1, len(lines) // 3))
        return
    import tensorflow as tf
    with tf.io.TFRecordWriter(path) as writer:
        for r in range(len(lines)):
            feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(columns[0][r])]))}
            for i, n in enumerate(names[1:], 1):
                value = columns[i][r]
                if value and i < 14:
                    feature[n] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
                elif value:
                    feature[n] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


class Producer(threading.Thread):
    """Renames a file of rows_per_file synthetic Criteo rows (in format `fmt`) into `incoming`
    every `every` seconds until stopped. Column C1 of example n (over all files) is n in hex: a
    key of its own."""

    def __init__(self, incoming, rows_per_file, every, fmt="text"):
        super().__init__(daemon=True)
        self.incoming, self.rows_per_file, self.every, self.fmt = incoming, rows_per_file, every, fmt
        self.files = 0
        self.done = threading.Event()

    def drop(self):
        import ttf  # pylint: disable=import-outside-toplevel
        hidden = os.path.join(self.incoming, f".part-{self.files:06d}")
        ttf.data.write_synthetic_criteo(hidden, self.rows_per_file, seed=self.files)
        with open(hidden, encoding="utf-8") as f:
            lines = f.read().splitlines()
        first = self.files * self.rows_per_file
        for i, line in enumerate(lines):
            columns = line.split("\t")
            columns[14] = f"{first + i:010x}"  # C1: label, I1..I13, then C1
            lines[i] = "\t".join(columns)
        if self.fmt == "text":
            with open(hidden, "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        else:
            write_rows(lines, hidden, self.fmt)
        os.rename(hidden, os.path.join(self.incoming, file_name(self.files, self.fmt)))
        self.files += 1

    def run(self):
        while not self.done.wait(self.every):
            self.drop()


def replay(journal):
    """The example ids the model holds, from the journal: a step at or below the previous one
    is a restart from a checkpoint, which rolled the steps from it on back."""
    steps = {}
    if os.path.exists(journal):
        with open(journal, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a line cut by the kill (the step's checkpoint cannot follow it)
                step, *ids = line.split()
                step = int(step)
                for later in [s for s in steps if s >= step]:
                    del steps[later]
                steps[step] = [int(i) for i in ids]
    return [i for s in sorted(steps) for i in steps[s]]


def journal_steps(journal):
    if not os.path.exists(journal):
        return 0
    with open(journal, encoding="utf-8") as f:
        return sum(1 for _ in f)


class Job:
    """The training job (one process or start_all.sh's cluster), started and restarted with the same flags."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.starts, self.proc, self.log = 0, None, None
        flags = ["--stream-poll", "0.2", "--log-every", "10", "--precision", "fp32", "--embedding-dim", "4",
                 "--checkpoint-every", str(args.checkpoint_every), "--stream-journal", os.path.join(work, "journal"),
                 "--publish-dir", os.path.join(work, "publish"), "--publish-every", str(args.publish_every)]
        stream = ["--stream", f"folder:{os.path.join(work, 'incoming')}", "--batch-size", str(args.batch_size),
                  "--checkpoint-dir", os.path.join(work, "ckpt")]
        if args.job == "single":
            self.command = [sys.executable, os.path.join(ROOT, "models", "train.py"), "--tiacc", "--model", "fm",
                            *stream, *flags]
        else:
            hvd = ["--hvd"] if args.job == "hvd" else []
            self.command = [os.path.join(ROOT, "start_all.sh"), *hvd, "--tiacc", "--fm", "--no-isolation", *stream,
                            "--", *flags]

    def start(self):
        self.starts += 1
        self.log = os.path.join(self.work, f"job{self.starts}.log")
        self.proc = subprocess.Popen(self.command, cwd=ROOT, stdout=open(self.log, "w", encoding="utf-8"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def text(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def pid_of(self, victim):
        """The pid of `victim` (trainer, ps, worker) in this job."""
        if self.args.job == "single":
            return self.proc.pid
        if victim == "rank":  # horovodrun starts the ranks in sessions of their own: found by parentage
            found = [pid for pid in descendants(self.proc.pid) if command_of(pid)[:1] != ["/bin/sh"]
                     and any(arg.endswith("models/train.py") for arg in command_of(pid))]
            return random.choice(found) if found else None
        needle = {"trainer": "models/train.py", "ps": "--job ps --index 0", "worker": "--job worker --index 1"}[victim]
        found = subprocess.run(["pgrep", "-s", str(self.proc.pid), "-f", "--", needle], capture_output=True,
                               text=True).stdout.split()
        return int(found[0]) if found else None

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session we started: every process of the job
            self.proc.wait()
            return None

    def stop_all(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def restart_worker(pid):
    """Starts worker `pid` again with its command line, environment and folder (read before the kill)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    return lambda log: subprocess.Popen(argv, env=env, cwd=cwd, stdout=open(log, "w", encoding="utf-8"),
                                        stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, what, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def file_numbers(files, shares, fmt="text"):
    """The id's file number of each file produced (ttf.data.FolderStream): with several shares
    (Horovod ranks), file f goes to share crc32(name) % shares, and is that share's n-th file:
    number n x shares + share."""
    numbers, counts = [], [0] * shares
    for sequence in range(files):
        share = zlib.crc32(file_name(sequence, fmt).encode()) % shares
        numbers.append(counts[share] * shares + share)
        counts[share] += 1
    return numbers


def example_keys(incoming, files, shares, fmt):
    """{example id: the key of its C1 value} over the files produced (read as the job reads them:
    ttf.data.Reader, rows in file order, example n of a file is its n-th row)."""
    import ttf  # pylint: disable=import-outside-toplevel
    ids, keys = [], []
    for sequence, number in enumerate(file_numbers(files, shares, fmt)):
        reader = ttf.data.Reader(os.path.join(incoming, file_name(sequence, fmt)))
        file_keys = [k for f, _ in reader.dataset(1 << 20, shuffle=False) for k in f["ids"][:, 0].numpy().tolist()]
        keys.extend(file_keys)
        ids.extend((number << ID_SHIFT) | n for n in range(1, len(file_keys) + 1))
    return dict(zip(ids, keys))


def checkpoint_counts(path):
    """{key: update count} of the DeepFM table in checkpoint `path`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    reader = tf.train.load_checkpoint(path)
    counts = {}
    for name in reader.get_variable_to_shape_map():
        if name.startswith(TABLE) and name.endswith("/keys"):
            meta = reader.get_tensor(name[: -len("keys")] + "meta")
            counts.update(zip(reader.get_tensor(name).tolist(), meta[:, 0].tolist()))
    return counts


def sweep(args):
    work = args.workdir or tempfile.mkdtemp(prefix="ttf_online_faults_")
    incoming = os.path.join(work, "incoming")
    os.makedirs(incoming)
    rng = random.Random(args.seed)
    producer = Producer(incoming, args.rows_per_file, args.file_every, args.format)
    for _ in range(3):
        producer.drop()
    producer.start()
    job, control = Job(args, work), os.path.join(work, "follower-control.json")
    follower_logs = []

    def start_follower():
        follower_logs.append(os.path.join(work, f"follower{len(follower_logs) + 1}.log"))
        return subprocess.Popen([sys.executable, "-c", FOLLOWER, os.path.join(work, "publish"), control, ROOT],
                                stdout=subprocess.PIPE, stderr=open(follower_logs[-1], "w", encoding="utf-8"),
                                text=True, start_new_session=True)

    journal, kills, started = os.path.join(work, "journal"), [], time.time()
    follower, workers = start_follower(), []
    job.start()
    try:
        for k in range(args.kills):
            before = journal_steps(journal)
            wait_for(lambda: journal_steps(journal) >= before + 3 or job.proc.poll() is not None,
                     "the job to train 3 more steps", args.timeout)
            if job.proc.poll() is not None:
                raise RuntimeError(f"the job exited ({job.proc.returncode}) before kill {k + 1}: {job.text()[-1500:]}")
            time.sleep(rng.uniform(*args.kill_after))
            victim = args.victims[k % len(args.victims)] if args.in_order else rng.choice(args.victims)
            steps = journal_steps(journal)
            if victim == "follower":
                follower.kill()
                follower.wait()
                follower = start_follower()
            else:
                # worker 1 started again by this driver lives in a session of its own: the latest one is it
                restarted = victim == "worker" and workers and workers[-1].poll() is None
                pid = workers[-1].pid if restarted else job.pid_of(victim)
                if pid is None:
                    raise RuntimeError(f"no {victim} process found in the job: {job.text()[-1500:]}")
                again = restart_worker(pid) if victim == "worker" else None
                os.kill(pid, signal.SIGKILL)
                if victim == "worker":
                    workers.append(again(os.path.join(work, f"worker-restart{len(workers) + 1}.log")))
                else:
                    code = job.wait_exit(args.timeout)
                    if victim == "ps" and "[train] error: lost contact with the cluster" not in job.text():
                        raise RuntimeError(f"a lost ps did not stop the chief with its line: {job.text()[-1500:]}")
                    job.stop_all()
                    for worker in workers:  # a worker started again belongs to the job that ended
                        worker.kill()
                        worker.wait()
                    job.start()
                    kills.append({"victim": victim, "journal_steps": steps, "job_exit": code})
            if victim in ("follower", "worker"):
                kills.append({"victim": victim, "journal_steps": steps})
            print(f"[online_faults] kill {k + 1}/{args.kills}: {victim} after journal step line {steps} "
                  f"({time.time() - started:.0f} s)", flush=True)
        producer.done.set()
        producer.join()
        shares = 2 if args.job == "hvd" else 1
        expected_ids = [(f << ID_SHIFT) | n for f in file_numbers(producer.files, shares, args.format)
                        for n in range(1, args.rows_per_file + 1)]
        trained_before = -1
        while len(replay(journal)) < len(expected_ids) and job.proc.poll() is None:  # catch up, while it moves
            trained_before = len(replay(journal))
            wait_for(lambda: len(replay(journal)) != trained_before or job.proc.poll() is not None,
                     "the job to train on (the rest of the stream)", args.timeout)
        job.proc.send_signal(signal.SIGTERM)  # train.py, or start_all.sh, which passes it to the chief
        code = job.wait_exit(args.timeout)
        text = job.text()
        if code != 0:
            raise RuntimeError(f"the job did not stop with exit 0 on SIGTERM ({code}): {text[-1500:]}")
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        checkpoint = tf.train.latest_checkpoint(os.path.join(work, "ckpt"))
        # (a Horovod job's lines come prefixed by horovodrun: "[0]<stdout>:[train] ...")
        version, sequence = (int(x) for x in re.findall(r"\[train\] published to .*: base (\d+), sequence (\d+)",
                                                         text)[-1])
        with open(control + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"version": version, "sequence": sequence, "checkpoint": checkpoint, "prefix": TABLE}, f)
        os.rename(control + ".tmp", control)
        out, _ = follower.communicate(timeout=args.timeout)
        served = json.loads(out.strip().splitlines()[-1])
        trained = replay(journal)
        counts = checkpoint_counts(checkpoint)
        keys = example_keys(incoming, producer.files, shares, args.format)
        per_example = [counts.get(keys[i], 0) for i in expected_ids]
        seen = {}
        for i in trained:
            seen[i] = seen.get(i, 0) + 1
        summary = {
            "job": args.job, "format": args.format, "victims": args.victims, "kills": len(kills),
            "kills_by_victim": {v: sum(1 for k in kills if k["victim"] == v) for v in args.victims},
            "job_starts": job.starts, "examples": len(expected_ids), "files": producer.files,
            "journal_lost": len(set(expected_ids) - set(seen)),
            "journal_duplicated": sum(n - 1 for n in seen.values() if n > 1),
            "journal_unknown": len(set(seen) - set(expected_ids)),
            "table_lost": sum(1 for c in per_example if c == 0),
            "table_duplicated": sum(c - 1 for c in per_example if c > 1),
            "follower": served, "seconds": time.time() - started, "workdir": work,
            # rounds rolled back because a lost worker's step was run again (models/train.py roll_back)
            "rollbacks": sum(open(os.path.join(work, f"job{n}.log"), encoding="utf-8", errors="replace").read()
                             .count("[train] a worker was lost") for n in range(1, job.starts + 1)),
        }
    finally:
        producer.done.set()
        job.stop_all()
        for proc in [follower, *workers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ok = (summary["journal_lost"] == summary["journal_duplicated"] == summary["journal_unknown"] == 0
          and summary["table_lost"] == summary["table_duplicated"] == 0 and served["equal"]
          and served["refused"] is None)
    summary["ok"] = ok
    return summary


def main(argv=None):
    args = parse_args(argv)
    summary = sweep(args)
    print(f"[online_faults] {summary['format']}: {summary['kills']} kills {summary['kills_by_victim']}, {summary['job_starts']} job starts, "
          f"{summary['examples']} examples in {summary['files']} files, {summary['seconds']:.0f} s: journal "
          f"{summary['journal_lost']} lost, {summary['journal_duplicated']} duplicated; table "
          f"{summary['table_lost']} lost, {summary['table_duplicated']} duplicated; follower at base "
          f"{summary['follower']['version']} sequence {summary['follower']['sequence']}: "
          f"{'equals' if summary['follower']['equal'] else 'DIFFERS FROM'} the checkpoint's "
          f"{summary['follower']['rows']} rows -> {'ok' if summary['ok'] else 'FAILED'}", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    if summary["ok"] and not args.workdir:
        shutil.rmtree(summary["workdir"], ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
