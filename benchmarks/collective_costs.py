"""Per-message and per-byte costs of the transfers a training step makes, measured on this
host, and the model of a step's bytes and time at 8-256 workers built on them (docs/scaling.md).

    python benchmarks/collective_costs.py measure [--repeats 15] [--out costs.json]
    python benchmarks/collective_costs.py model costs.json [--batch 4096] [--dim 16]

`measure` starts 2 workers on loopback (ttf.distribute.TFCollectives, the collectives
SyncWorkers runs on) and times, for payloads of 1 KB to 16 MB a worker, the median of
`--repeats` calls (each in a tf.function, as in a step) of: the all-to-all, the all-reduce,
and the round trip of a parameter-server lookup (a gather of rows from a variable on a
`ps` task and a scatter-add of as many gradient rows back, TensorFlow gRPC, as ttf's
parameter-server runtime does). It fits time = a + b * bytes to each (least squares) and
writes the constants.

`model` takes those constants and, for a Criteo-like id distribution (ttf.data.Synthetic:
26 fields, Zipf 1.1 over 1M values each; the unique ids of a worker's batch are counted on a
drawn sample), prints per worker and step the bytes and the modelled exchange time of:
the parameter-server runtime, SyncWorkers' sharded tables (padded all-to-all), Horovod's
all-to-all (variable splits, no count exchange), and a dense all-reduce of a bucketed table.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24]  # bytes a worker sends


def _timed(fn, arg, repeats):
    for _ in range(3):
        fn(arg)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(fn(arg))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def collective_worker(hosts, index, repeats, out):
    import tensorflow as tf  # noqa: PLC0415

    import ttf  # noqa: PLC0415

    coll = ttf.distribute.TFCollectives(ttf.distribute.Cluster(worker_hosts=hosts, task_type="worker", task_index=index))
    alltoall = tf.function(lambda x: coll.alltoall_even(x))
    allreduce = tf.function(lambda x: coll.allreduce(x))
    rows = {}
    for size in SIZES:
        x = tf.ones([size // 4], tf.float32)
        rows[size] = {"alltoall": _timed(alltoall, x, repeats), "allreduce": _timed(allreduce, x, repeats)}
    np.asarray(coll.allreduce(tf.ones([1])))  # every worker is done with every other's buffers...
    if index == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    sys.stdout.flush()
    time.sleep(2)  # ...and has fetched this one's last (a peer pulls its part from this server)
    os._exit(0)  # without waiting on the gRPC server's threads


def ps_server(hosts):
    import tensorflow as tf  # noqa: PLC0415

    cluster = tf.train.ClusterSpec({"ps": [hosts[0]], "worker": [hosts[1]]})
    tf.distribute.Server(cluster, job_name="ps", task_index=0).join()


def ps_client(hosts, repeats, dim=16):
    """A lookup of n rows from the ps task and the push of n gradient rows back, per size."""
    import tensorflow as tf  # noqa: PLC0415

    cluster = tf.train.ClusterSpec({"ps": [hosts[0]], "worker": [hosts[1]]})
    tf.config.experimental_connect_to_cluster(cluster, job_name="worker", task_index=0)  # starts this task's server
    rows = 1 << 20
    with tf.device("/job:ps/task:0"):
        table = tf.Variable(tf.zeros([rows, dim]))

    @tf.function
    def lookup_and_push(ids):
        with tf.device("/job:ps/task:0"):
            got = tf.gather(table, ids)
        with tf.device("/job:worker/task:0"):
            grads = got * 0.5 + 1.0
        with tf.device("/job:ps/task:0"):
            table.scatter_add(tf.IndexedSlices(grads, ids))
            return tf.reduce_sum(got[:1])

    out = {}
    for size in SIZES:
        n = max(1, size // (4 * dim))  # the rows' bytes one way
        ids = tf.constant(np.random.default_rng(0).integers(0, rows, n), tf.int64)
        out[size] = _timed(lookup_and_push, ids, repeats)
    return out


def fit(xs, ys):
    """time = a + b * bytes, least squares; returns (a seconds, b seconds per byte)."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return max(float(a), 0.0), float(b)


def run_collectives(workers, repeats, out, env):
    from ttf.distribute._cluster import free_ports  # noqa: PLC0415

    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(workers))
    procs = [subprocess.Popen([sys.executable, __file__, "_collective", hosts, str(i), str(repeats), out], env=env)
             for i in range(workers)]
    for proc in procs:
        if proc.wait(timeout=1800):
            raise SystemExit(f"a collective worker failed (exit {proc.returncode})")
    with open(out) as f:
        result = {int(k): v for k, v in json.load(f).items()}
    os.remove(out)
    return result


def measure(args):
    sys.path.insert(0, ROOT)
    from ttf.distribute._cluster import free_ports  # noqa: PLC0415

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    coll = {w: run_collectives(w, args.repeats, args.out + ".collectives", env) for w in (2, 4)}
    ps_hosts = [f"127.0.0.1:{p}" for p in free_ports(2)]
    server = subprocess.Popen([sys.executable, __file__, "_ps", ",".join(ps_hosts)], env=env)
    try:
        ps = ps_client(ps_hosts, args.repeats)
    finally:
        server.kill()
    import tensorflow as tf  # noqa: PLC0415

    from _results import machine  # noqa: PLC0415

    result = {"host": {"machine": machine(ROOT), "python": platform.python_version(),
                       "tensorflow": tf.__version__, "disk_free_gb": round(shutil.disk_usage(ROOT).free / 1e9),
                       "load": os.getloadavg()},
              "sizes": SIZES,
              "measured": {str(s): {**{f"{k}_{w}": coll[w][s][k] for w in coll for k in coll[w][s]},
                                    "ps_round_trip": ps[s]} for s in SIZES}}
    for kind in ("alltoall", "allreduce"):
        # Per byte from 2 workers (the link); per call at 1 KB, and how it grows with the peers (2 vs 4 workers).
        per_call, per_byte = fit(SIZES, [coll[2][s][kind] for s in SIZES])
        per_peer = max(0.0, (coll[4][SIZES[0]][kind] - coll[2][SIZES[0]][kind]) / 2)
        result[kind] = {"seconds_per_call": per_call, "seconds_per_peer": per_peer, "seconds_per_byte": per_byte}
    per_call, per_byte = fit(SIZES, [ps[s] for s in SIZES])
    result["ps_round_trip"] = {"seconds_per_call": per_call, "seconds_per_byte": per_byte}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("| bytes a worker | all-to-all ms (2 / 4 workers) | all-reduce ms (2 / 4 workers) | PS lookup + push ms |\n"
          "| --- | --- | --- | --- |")
    for s in SIZES:
        m = result["measured"][str(s)]
        print(f"| {s:,} | {m['alltoall_2'] * 1e3:.2f} / {m['alltoall_4'] * 1e3:.2f} | "
              f"{m['allreduce_2'] * 1e3:.2f} / {m['allreduce_4'] * 1e3:.2f} | {m['ps_round_trip'] * 1e3:.2f} |")
    for kind in ("alltoall", "allreduce", "ps_round_trip"):
        c = result[kind]
        print(f"{kind}: {c['seconds_per_call'] * 1e3:.3f} ms a call + {c.get('seconds_per_peer', 0) * 1e3:.3f} ms a "
              f"further peer + {1 / c['seconds_per_byte'] / 1e9:.2f} GB/s")


def unique_ids(batch, vocab=1_000_000, samples=8):
    """The mean count of unique ids in a batch of the Criteo-like synthetic distribution."""
    sys.path.insert(0, ROOT)
    from ttf.data import Synthetic  # noqa: PLC0415

    ids = Synthetic(vocab_per_field=vocab).generate(batch * samples, seed=1)["ids"]
    return float(np.mean([np.unique(ids[i * batch:(i + 1) * batch]).size for i in range(samples)]))


def padding(unique, workers, seed=0):
    """SyncWorkers' padding factor: each worker's unique ids go to their owners by hash (a
    multinomial over the workers), every block is sent at the largest block's size; returns
    that size over the mean block."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(int(unique), [1.0 / workers] * workers, size=workers)
    return float(counts.max() / (unique / workers))


def call_seconds(cost, workers, nbytes):
    """One collective call of `nbytes` a worker among `workers`: the per-call cost measured at
    2 workers, plus the per-peer growth measured from 2 to 4, plus the bytes at the link's rate."""
    return cost["seconds_per_call"] + cost.get("seconds_per_peer", 0.0) * (workers - 2) + cost["seconds_per_byte"] * nbytes


def model(args):
    with open(args.costs) as f:
        costs = json.load(f)
    a2a, ar, ps = (costs[k] for k in ("alltoall", "allreduce", "ps_round_trip"))
    row, dense = 4 * args.dim, 4 * args.dense_params
    u = unique_ids(args.batch)
    print(f"Per worker and step: batch {args.batch}, {u:,.0f} unique ids (26 fields, Zipf 1.1 over 1M values each), "
          f"dim {args.dim}, {args.dense_params:,} dense parameters; the bucketed table {args.buckets:,} rows; "
          f"the parameter servers: one for every {args.workers_per_ps} workers.\n")
    print("| workers | topology | MB out / worker | collective calls or RPCs / worker | exchange ms (model) |\n"
          "| --- | --- | --- | --- | --- |")
    for w in (8, 32, 128, 256):
        remote = u * (w - 1) / w  # a worker's unique ids that another worker owns
        one_way = remote * 8, remote * row, remote * row  # ids out; rows back; row gradients out
        ring = 2 * (w - 1) / w * dense  # a ring all-reduce's bytes out per worker
        dense_s = call_seconds(ar, w, ring)
        pad = padding(u, w)  # 1.003x measured at 2 workers (results/sync.md)
        sync_s = call_seconds(a2a, w, 4 * w) + sum(call_seconds(a2a, w, b * pad) for b in one_way) + dense_s
        hvd_s = sum(call_seconds(a2a, w, b) for b in one_way) + dense_s
        # PS: every unique id goes out (lookup, then push), the dense weights are pulled and
        # pushed; RPCs to the servers run in parallel, but a server serves workers_per_ps workers' bytes.
        servers = max(1, w // args.workers_per_ps)
        ps_bytes = u * (8 + 2 * row) + 2 * dense
        ps_s = 2 * ps["seconds_per_call"] + ps["seconds_per_byte"] * ps_bytes * args.workers_per_ps
        bucket = ring + 2 * (w - 1) / w * args.buckets * row
        rows = [("parameter servers", ps_bytes, 2 * servers + 2, ps_s),  # a lookup and a push a server, the dense pull and push
                (f"SyncWorkers (padded all-to-all, padding {pad:.2f}x)", sum(one_way) * pad + 4 * w + ring, 5, sync_s),
                ("Horovod all-to-all (variable splits)", sum(one_way) + ring, 4, hvd_s),
                ("dense all-reduce of a bucketed table", bucket, 1, call_seconds(ar, w, bucket))]
        for name, nbytes, calls, seconds in rows:
            print(f"| {w} | {name} | {nbytes / 1e6:,.2f} | {calls} | {seconds * 1e3:,.1f} |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_collective":
        return collective_worker(argv[1], int(argv[2]), int(argv[3]), argv[4])
    if argv and argv[0] == "_ps":
        return ps_server(argv[1].split(","))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the transfers on 2 local workers")
    m.add_argument("--repeats", type=int, default=15, help="timed calls per size (default 15)")
    m.add_argument("--out", default="collective_costs.json", help="the constants (default collective_costs.json)")
    p = sub.add_parser("model", help="bytes and time per step at 8-256 workers")
    p.add_argument("costs", help="the JSON `measure` wrote")
    p.add_argument("--batch", type=int, default=4096, help="examples per worker and step (default 4096)")
    p.add_argument("--dim", type=int, default=16, help="embedding width (default 16)")
    p.add_argument("--dense-params", type=int, default=450_000, help="dense parameters (default 450,000: DeepFM's MLP)")
    p.add_argument("--buckets", type=int, default=1_000_000, help="rows of the bucketed table (default 1M)")
    p.add_argument("--workers-per-ps", type=int, default=4, help="workers per parameter server (default 4)")
    args = parser.parse_args(argv)
    return measure(args) if args.command == "measure" else model(args)


if __name__ == "__main__":
    main()
