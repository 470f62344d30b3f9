"""Save and restore of a large table on a local parameter-server cluster: peak memory of
the chief and of each PS, save throughput against the disk, and checksums after restore.

Starts --ps parameter-server processes (3 by default; the table lives on the first 2)
and acts as the chief. Fills a table of --keys keys (dim --dim, Adagrad slots) sharded
over 2 PS, then:
  1. saves it (tf.train.Checkpoint.write; a variable on a PS makes TensorFlow trace the
     save, as in a training job) and times it;
  2. writes as many bytes with `dd ... conv=fdatasync` into the same folder (the disk's
     sequential write speed, measured in the same run);
  3. restores it into 3 PS, then (the cluster stopped) into one fresh process alone;
and reports each process's peak extra RSS during save and restore (VmHWM after minus VmRSS
before, VmHWM reset through /proc/<pid>/clear_refs), the table's memory per PS, and the
table checksum (ttf.embedding.table_summary) of the source, the 3-PS and the one-process
copies.

    .venv/bin/python benchmarks/scale.py --keys 5000000            # what benchmarks/results/scale.md shows here
    .venv/bin/python benchmarks/scale.py --keys 100000000 --dim 8   # the issue's target size
    .venv/bin/python benchmarks/scale.py --keys 100000000 --dim 8 --rows int8   # int8 rows (docs/table_rows.md)
    .venv/bin/python benchmarks/scale.py --keys 200000 --json        # a quick run, one JSON line
    .venv-tf2.16/bin/python benchmarks/scale.py --horovod 2 --keys 2000000   # the Horovod case

--horovod N: the same table on N Horovod ranks instead (horovodrun --gloo, this host; needs
horovod, so TensorFlow 2.16's venv): each rank fills the ids it owns, then
ttf.distribute.horovod.save_checkpoint on every rank (each writes its own part, rank 0 merges)
and manager.restore_latest on every rank; reported per rank: its part's table memory, peak
extra RSS during save and restore (and save / part), and the checksums of the ranks' tables
before and after, and of rank 0 restoring the whole checkpoint alone.

Flags: --keys N (default 5,000,000), --dim D (8), --ps N (3), --horovod N (0: the PS case),
--dir PATH (a temporary folder under the current one; removed at the end), --json (print
one JSON line only).
Exit codes: 0 done, 2 bad usage, 1 failure (a checksum differs, a process died).
"""
import argparse
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BATCH = 1_000_000


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


class PeakWatch:
    """Peak extra RSS of several processes over a block: VmHWM after minus VmRSS before."""

    def __init__(self, pids):
        self.pids = pids

    def __enter__(self):
        self.before = {}
        for name, pid in self.pids.items():
            self.before[name] = status_kib(pid, "VmRSS")
            with open(f"/proc/{pid}/clear_refs", "w") as refs:
                refs.write("5")  # resets VmHWM to the current RSS
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.start
        self.extra_mib = {name: (status_kib(pid, "VmHWM") - self.before[name]) / 1024 for name, pid in self.pids.items()}


def ps_main(cluster_json, index):
    import tensorflow as tf

    import ttf  # noqa: F401  (loads the op library into this server)
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(cluster_json)), "ps", index, start=True)
    print("ready", flush=True)
    server.join()


def progress(what, started, done=None):
    """One line on stderr for long phases (a 100M-key run takes many minutes)."""
    if done is None or done % (10 * BATCH) == 0:
        print(f"[scale] {time.monotonic() - started:7.0f} s  {what}", file=sys.stderr, flush=True)


def du_bytes(path):
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def dd_mib_per_sec(directory, nbytes):
    count = max(1, nbytes // (64 << 20))
    target = os.path.join(directory, "dd.tmp")
    start = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={count}", "conv=fdatasync"],
                   check=True, capture_output=True)
    seconds = time.monotonic() - start
    os.remove(target)
    return count * 64 / seconds


def chief_main(args, cluster, procs):
    import numpy as np
    import tensorflow as tf

    import ttf
    from ttf._ops import ops

    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), job_name="chief", task_index=0)
    ps = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(args.ps)]
    pids = {"chief": os.getpid(), **{f"ps{i}": p.pid for i, p in enumerate(procs)}}

    def layer_on(devices):
        layer = ttf.DynamicEmbedding(args.dim, seed=1, shard_devices=devices, name="emb", rows=args.rows)
        layer(tf.constant([[0]], tf.int64))
        return layer

    def with_dense(layer, device):
        with tf.device(device):  # a variable on a PS: TensorFlow traces the save, as in a training job
            dense = tf.Variable(tf.zeros([4]))
        return tf.train.Checkpoint(layer=layer, dense=dense)

    source = layer_on(ps[:2])

    @tf.function
    def fill(start, stop):  # the keys are made on each PS: nothing but two numbers leaves the chief
        for i, table in enumerate(source.tables):
            with tf.device(table._resource_device):  # pylint: disable=protected-access
                keys = tf.range(start, stop) * 2654435761
                mine = tf.boolean_mask(keys, tf.equal(ttf.embedding.shard_of(keys, 2), i))
                ops().ttf_table_find_or_insert(table.resource_handle, mine, dim=args.dim)
                ops().ttf_table_apply_adagrad(table.resource_handle, mine, tf.ones([tf.size(mine), args.dim]),
                                              0.1, 1e-7, 1)

    started = time.monotonic()
    for start in range(0, args.keys, BATCH):
        progress(f"filling: {start:,} of {args.keys:,} keys", started, start)
        fill(tf.constant(start, tf.int64), tf.constant(min(start + BATCH, args.keys), tf.int64))
    shard_mib = [int(t.stats()[1]) / (1 << 20) for t in source.tables]
    want = ttf.embedding.table_summary(source)
    # What each process holds with the filled table (its rows, slots, keys and index, and
    # TensorFlow's own memory), and its peak so far.
    rss_filled = {name: status_kib(pid, "VmRSS") / 1024 for name, pid in pids.items()}
    hwm_filled = {name: status_kib(pid, "VmHWM") / 1024 for name, pid in pids.items()}

    prefix = os.path.join(args.dir, "ckpt")
    progress(f"saving {sum(shard_mib):,.0f} MiB of table", started)
    with PeakWatch(pids) as save:
        with_dense(source, ps[2 % args.ps]).write(prefix)
    ckpt_bytes = du_bytes(args.dir)
    progress(f"saved {ckpt_bytes / (1 << 20):,.0f} MiB in {save.seconds:.0f} s; dd of as many bytes", started)
    disk = dd_mib_per_sec(args.dir, ckpt_bytes)
    # Its summary is taken: the source is freed (fill's graph holds its tables too), so that one
    # copy of the table at a time fits this machine.
    del source, fill
    gc.collect()
    rss_freed = {name: status_kib(pid, "VmRSS") / 1024 for name, pid in pids.items()}

    progress(f"save: peak extra MiB {save.extra_mib}, {disk:.0f} MiB/s dd; restoring into 3 PS", started)
    three = layer_on(ps[:3])
    with PeakWatch(pids) as restore3:
        with_dense(three, ps[2 % args.ps]).read(prefix)
    got3 = ttf.embedding.table_summary(three)
    shard3_mib = [int(t.stats()[1]) / (1 << 20) for t in three.tables]
    progress(f"restored into 3 PS: peak extra MiB {restore3.extra_mib}, summary {got3}", started)
    save_mib_s = ckpt_bytes / (1 << 20) / save.seconds
    return {
        "keys": args.keys, "dim": args.dim, "rows": args.rows, "optimizer": "adagrad", "table_mib_per_ps": shard_mib,
        "rss_after_fill_mib": rss_filled, "peak_rss_after_fill_mib": hwm_filled,
        "checkpoint_mib": ckpt_bytes / (1 << 20), "save_seconds": save.seconds, "save_mib_per_sec": save_mib_s,
        "dd_fdatasync_mib_per_sec": disk, "save_vs_disk": save_mib_s / disk,
        "save_peak_extra_mib": save.extra_mib, "restore_3ps_seconds": restore3.seconds,
        "restore_3ps_peak_extra_mib": restore3.extra_mib, "rss_after_source_freed_mib": rss_freed,
        "table_mib_per_ps_of_3": shard3_mib,
        # what a restore needs beyond the shard it builds (a fresh PS: its peak minus its new shard)
        "restore_3ps_extra_beyond_shard_mib": {f"ps{i}": restore3.extra_mib[f"ps{i}"] - mib
                                               for i, mib in enumerate(shard3_mib)},
        "summary_source": want, "summary_3ps": got3,
    }


def one_main(args):
    """--role one: a fresh process (the cluster is gone) restores the checkpoint alone; prints
    its seconds, peak extra RSS and table summary as one JSON line."""
    import tensorflow as tf

    import ttf
    layer = ttf.DynamicEmbedding(args.dim, seed=1, name="emb", rows=args.rows)
    layer(tf.constant([[0]], tf.int64))
    checkpoint = tf.train.Checkpoint(layer=layer, dense=tf.Variable(tf.zeros([4])))
    with PeakWatch({"one": os.getpid()}) as restore:
        checkpoint.read(os.path.join(args.dir, "ckpt"))
    print(json.dumps({"restore_1_seconds": restore.seconds, "restore_1_peak_extra_mib": restore.extra_mib["one"],
                      "summary_1": ttf.embedding.table_summary(layer)}))
    return 0


def hvd_main(args):
    """One Horovod rank of --horovod: fills its ids, saves, restores; rank 0 writes the JSON."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tdh.shard_tables takes a tf_keras layer
    import numpy as np
    import ttf
    import tensorflow as tf
    import ttf.distribute.horovod as tdh
    from ttf._ops import ops

    hvd = tdh.hvd
    hvd.init()
    coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
    rank, size = hvd.rank(), hvd.size()

    def sharded_layer():
        layer = ttf.DynamicEmbedding(args.dim, seed=1, name="emb")
        layer(tf.constant([[0]], tf.int64))
        tdh.shard_tables(layer, coll)
        return layer

    source = sharded_layer()
    table = source.tables[0]
    for start in range(0, args.keys, BATCH):
        keys = np.arange(start, min(start + BATCH, args.keys), dtype=np.int64) * 2654435761
        mine = keys[ttf.embedding.shard_of(keys, size).numpy() == rank]
        ops().ttf_table_find_or_insert(table.resource_handle, mine, dim=args.dim)
        ops().ttf_table_apply_adagrad(table.resource_handle, mine, np.ones((len(mine), args.dim), np.float32),
                                      0.1, 1e-7, 1)
    del keys, mine
    part_mib = int(table.stats()[1]) / (1 << 20)
    want = hvd.allgather_object(ttf.embedding.table_summary(source), name="scale_want")
    manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=source), args.dir)
    hvd.allreduce(tf.constant(0), name="scale_ready")
    with PeakWatch({"rank": os.getpid()}) as save:
        tdh.save_checkpoint(manager, 1, coll)
    del source, table, manager  # this rank's part, freed before the restore
    restored = sharded_layer()
    with PeakWatch({"rank": os.getpid()}) as restore:
        ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=restored), args.dir).restore_latest()
    got = hvd.allgather_object(ttf.embedding.table_summary(restored), name="scale_got")
    per_rank = hvd.allgather_object({"part_mib": part_mib, "save_seconds": save.seconds,
                                     "save_peak_extra_mib": save.extra_mib["rank"],
                                     "save_extra_vs_part": save.extra_mib["rank"] / part_mib,
                                     "restore_peak_extra_mib": restore.extra_mib["rank"],
                                     "restore_seconds": restore.seconds}, name="scale_ranks")
    if rank != 0:
        return 0
    del restored
    one = ttf.DynamicEmbedding(args.dim, seed=1, name="emb")  # rank 0 alone: the whole table in one process
    one(tf.constant([[0]], tf.int64))
    ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=one), args.dir).restore_latest()
    want, got, got1 = ttf.embedding.table_summary(*want), ttf.embedding.table_summary(*got), \
        ttf.embedding.table_summary(one)
    result = {"keys": args.keys, "dim": args.dim, "optimizer": "adagrad", "horovod_ranks": size,
              "checkpoint_mib": du_bytes(args.dir) / (1 << 20), "per_rank": per_rank,
              "max_save_extra_vs_part": max(r["save_extra_vs_part"] for r in per_rank),
              "summary_source": want, "summary_ranks": got, "summary_1": got1,
              "checksums_equal": want[:2] == got[:2] == got1[:2]}
    with open(args.out, "w") as out:
        json.dump(result, out)
    return 0


def horovod_main(args):
    """--horovod N: runs this script's hvd role on N ranks; prints rank 0's result."""
    out = os.path.join(args.dir, "result.json")
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [sys.executable, launcher, "--gloo", "-np", str(args.horovod), "-H", f"localhost:{args.horovod}",
           sys.executable, os.path.abspath(__file__), "--role", "hvd", "--keys", str(args.keys), "--dim",
           str(args.dim), "--dir", args.dir, "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(out):
        print(f"scale.py: the Horovod run failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    with open(out) as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5_000_000, help="keys in the table (default 5,000,000)")
    parser.add_argument("--dim", type=int, default=8, help="row width (default 8)")
    parser.add_argument("--ps", type=int, default=3, help="parameter servers started (>= 3; default 3)")
    parser.add_argument("--rows", choices=["fp32", "bf16", "int8"], default="fp32",
                        help="how the table stores rows (TableConfig rows; the parameter-server case; default fp32)")
    parser.add_argument("--horovod", type=int, default=0,
                        help="N > 0: the Horovod case on N ranks of this host instead of the PS one (default 0)")
    parser.add_argument("--dir", default=None, help="checkpoint folder (default: a temporary one here, removed)")
    parser.add_argument("--json", action="store_true", help="print one JSON line only")
    parser.add_argument("--role", default="chief", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "ps":
        return ps_main(args.cluster, args.index)
    if args.role == "hvd":
        return hvd_main(args)
    if args.role == "one":
        return one_main(args)
    if args.keys < 1 or args.dim < 1 or args.ps < 3 or args.horovod < 0:
        parser.error("--keys and --dim must be >= 1, --ps >= 3 and --horovod >= 0")
    cleanup = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="scale_ckpt_", dir=".")
    if args.horovod:
        try:
            result = horovod_main(args)
        finally:
            if cleanup:
                shutil.rmtree(args.dir, ignore_errors=True)
        if result is None:
            return 1
        print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
        return 0 if result["checksums_equal"] else 1
    cluster = {"chief": [f"localhost:{free_port()}"], "ps": [f"localhost:{free_port()}" for _ in range(args.ps)]}
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "ps", "--cluster", json.dumps(cluster),
                               "--index", str(i)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(args.ps)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                print(f"scale.py: parameter server {proc.pid} did not start", file=sys.stderr)
                return 1
        result = chief_main(args, cluster, procs)
        for proc in procs:  # the cluster's memory back before the whole table goes into one process
            proc.kill()
            proc.wait()
        print("[scale] restoring into one fresh process", file=sys.stderr, flush=True)
        one = subprocess.run([sys.executable, os.path.abspath(__file__), "--role", "one", "--dir", args.dir,
                              "--dim", str(args.dim), "--rows", args.rows], capture_output=True, text=True, check=True)
        result.update(json.loads(one.stdout.strip().splitlines()[-1]))
        result["checksums_equal"] = (list(result["summary_source"][:2]) == list(result["summary_3ps"][:2])
                                     == list(result["summary_1"][:2]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        if cleanup:
            shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name}: {value}")
    return 0 if result["checksums_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
