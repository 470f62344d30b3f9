"""SyncWorkers with JobConfig(pipeline=True) against without (issue 47's target: at least 1.15x steps/s on 2
workers, the same AUC): batch N+1's ids routed while batch N trains (docs/sync.md, "Pipelined steps").

    python benchmarks/sync_pipeline.py [--pairs 2] [--models functional,deepfm] [--steps 300] [--batch-size 512]
                                       [--link RATE[,DELAY]]  (e.g. --link 1gbit,0.2ms; needs root)

Two models, fp32, 2 SyncWorkers on this host, the same synthetic data, seed and initial weights in every run:
- functional: a DeepFM-sized functional model (one FusedEmbedding of dim 16 over the 26 Criteo fields, the 13
  dense features beside it, MLP 256-128-1, ttf Adam 1e-3) on ttf.distribute.Job (its ids come from a sub-model);
- deepfm: the CLI's subclassed DeepFM, `start_all.sh --sync --tiacc --fm [--pipeline]` (sync_speed.py's run; its
  ids come from a recording pass of its call).
Runs alternate ABBA (plain, pipelined, pipelined, plain, ...) so drift in the machine's load falls on both. Per run:
worker 0's steps/s after the job's warm-up steps and its CPU ms per step; AUC on the held-out fifth. Records
benchmarks/results/sync.md.

--link RATE[,DELAY] (functional model only) puts each worker on its own "host": a network namespace, the two joined
by a veth pair as tests/distribute/test_multihost.py joins its hosts, each end's egress shaped to RATE by
`tc qdisc ... tbf` and delayed by DELAY with netem (a kernel without sch_netem takes RATE alone). Each run then
also reports the bytes the link carried (both directions, the whole job: set-up, the steps and the evaluation) per
global step. The namespaces are removed when
the benchmark ends, fails or is interrupted.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid

import sync_speed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
LABELS = {False: "plain", True: "pipelined"}


def worker(args):
    """One worker of the benchmark's job: prints its numbers as one JSON line."""
    import tensorflow as tf  # noqa: PLC0415 (the parent process never imports TensorFlow)

    import ttf  # noqa: PLC0415

    topology = ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts=args.hosts, task_type="worker",
                                                                 task_index=args.task_index))
    tf.keras.utils.set_random_seed(1)
    with topology.scope():
        ids, dense = tf.keras.Input([26], dtype=tf.int64, name="ids"), tf.keras.Input([13], name="dense")
        rows = ttf.FusedEmbedding(16, num_fields=26)(ids)
        x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(rows), dense])
        for width in (256, 128):
            x = tf.keras.layers.Dense(width, activation="relu", name=f"mlp_{width}")(x)
        model = tf.keras.Model({"ids": ids, "dense": dense}, tf.keras.layers.Dense(1, name="logit")(x))
        optimizer = ttf.optimizers.Adam(1e-3)
    config = ttf.distribute.JobConfig(batch_size=args.batch_size, steps=args.steps, log_every=100,
                                      pipeline=args.pipeline)
    job = ttf.distribute.Job(model, optimizer, topology=topology, config=config, log=lambda message: None)
    reader = ttf.data.Reader([args.data], "criteo")
    result = job.fit(reader, split="train")
    result.update(job.evaluate(reader, split="eval"))
    print("RESULT " + json.dumps(result), flush=True)


def run(model, pipeline, args, data, link=None):
    """One job of `model` (functional | deepfm), pipelined or not: {steps_per_sec, cpu_seconds_per_step, auc}."""
    if model == "deepfm":
        out = os.path.join(ROOT, "runs", f"sync_pipeline_{LABELS[pipeline]}.json")
        m = sync_speed.run(f"deepfm {LABELS[pipeline]}", args, out, flags=["--sync"], env=dict(os.environ),
                           train_args=["--pipeline"] * pipeline)
        return dict(m, steps_per_sec=m["global_steps_per_sec"])
    return run_functional(pipeline, args, data, link)


def run_functional(pipeline, args, data, link=None):
    """`link`: the two namespaces of link_hosts, or None for both workers on loopback."""
    if link is None:
        hosts, prefixes = ",".join(f"127.0.0.1:{port}" for port in _free_ports(2)), [[], []]
    else:
        hosts = ",".join(f"{addr}:22231" for _, _, addr in link)
        prefixes = [["ip", "netns", "exec", ns] for ns, _, _ in link]
        sent = [_tx_bytes(ns, dev) for ns, dev, _ in link]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--hosts", hosts, "--data", data,
           "--steps", str(args.steps), "--batch-size", str(args.batch_size)] + (["--pipeline"] if pipeline else [])
    started = time.time()
    procs = [subprocess.Popen(prefixes[i] + cmd + ["--task-index", str(i)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=3600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise SystemExit(f"[sync-pipeline] {LABELS[pipeline]} failed:\n" + outs[0][-3000:] + outs[1][-3000:])
    m = json.loads(outs[0].split("RESULT ")[-1])
    m["load"] = os.getloadavg()[0]
    wire = ""
    if link is not None:
        m["link_bytes_per_step"] = sum(_tx_bytes(ns, dev) - b for (ns, dev, _), b in zip(link, sent)) / args.steps
        wire = f", link {m['link_bytes_per_step'] / 1e6:.2f} MB/step"
    print(f"[sync-pipeline] {LABELS[pipeline]:9} {m['steps_per_sec']:.2f} steps/s, "
          f"{m['cpu_seconds_per_step'] * 1000:.0f} CPU ms/step, AUC {m['auc']:.6f}{wire} "
          f"({time.time() - started:.0f} s, load {m['load']:.1f})", flush=True)
    return m


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _sh(*cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"[sync-pipeline] `{' '.join(cmd)}` failed: {done.stderr.strip()} (--link needs root and "
                         f"iproute2; a DELAY needs the kernel's sch_netem: give RATE alone without it)")
    return done.stdout


def _tx_bytes(ns, dev):
    return json.loads(_sh("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev))[0]["stats64"]["tx"]["bytes"]


@contextlib.contextmanager
def link_hosts(rate, delay):
    """Two network namespaces joined by a veth pair, each end's egress shaped to `rate` (tbf) and delayed by
    `delay` (netem, none if ""): yields [(namespace, device, address)] per host, and removes both namespaces (and
    their processes) on any exit."""
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"ttfp{side}{tag}", f"vp{side}{tag}", f"10.231.9.{i + 1}") for i, side in enumerate("ab")]
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still runs the clean-up
    try:
        for ns, _, _ in hosts:
            _sh("ip", "netns", "add", ns)
        (ns_a, dev_a, _), (ns_b, dev_b, _) = hosts
        _sh("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
        for ns, dev, addr in hosts:
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            # tbf shapes the rate (a 64 KB bucket, one GSO packet; a 64 MB queue holds a step's burst
            # without a drop); netem under it adds the delay. Kernels without sch_netem have tbf.
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
            _sh(*tc, "root", "handle", "1:", "tbf", "rate", rate, "burst", "64kb", "limit", "64mb")
            if delay:
                _sh(*tc, "parent", "1:1", "handle", "10:", "netem", "delay", delay, "limit", "100000")
            # As on a real host, the host's name resolves to its own address (test_multihost.py's hosts).
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n{addr} {socket.gethostname()}\n")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=2, help="plain/pipelined pairs, run ABBA (default 2)")
    p.add_argument("--models", default="functional,deepfm", help="functional and/or deepfm (default both)")
    p.add_argument("--steps", type=int, default=300, help="global steps per run (default 300)")
    p.add_argument("--batch-size", type=int, default=512, help="batch per worker (default 512)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (default 200000)")
    p.add_argument("--link", help="RATE[,DELAY] (tc's units, e.g. 1gbit,0.2ms): each worker in its own network "
                                  "namespace, joined by a veth link so shaped (functional model only, needs root)")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hosts", help=argparse.SUPPRESS)
    p.add_argument("--task-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    link = _parse_link(args.link, args.models) if args.link else None
    load_before = os.getloadavg()[0]
    data = subprocess.run([sys.executable, "-c", "import ttf; print(ttf.data.cached_synthetic(%r, %d, "
                           "ttf.data.Synthetic(vocab_per_field=100000))[0])" % (os.path.join(ROOT, "runs"), args.rows)],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()[-1]
    models = args.models.split(",")
    pairs = {model: [] for model in models}
    with link_hosts(*link) if link else contextlib.nullcontext() as hosts:
        for i in range(args.pairs):
            order = [False, True] if i % 2 == 0 else [True, False]
            for model in models:
                pairs[model].append({pipeline: run(model, pipeline, args, data, hosts) for pipeline in order})
    extra = " link MB/step (plain / pipelined) | load (plain / pipelined) |" if link else ""
    lines = ["| model | pair | plain steps/s | pipelined steps/s | ratio | CPU ms/step (plain / pipelined) | "
             "AUC (plain / pipelined) |" + extra, "| --- " * (7 + 2 * bool(link)) + "|"]
    summary = []
    for model in models:
        ratios = []
        for i, pair in enumerate(pairs[model], 1):
            a, b = pair[False], pair[True]
            ratios.append(b["steps_per_sec"] / a["steps_per_sec"])
            lines.append(f"| {model} | {i} | {a['steps_per_sec']:.2f} | {b['steps_per_sec']:.2f} | {ratios[-1]:.3f}x | "
                         f"{a['cpu_seconds_per_step'] * 1000:.0f} / {b['cpu_seconds_per_step'] * 1000:.0f} | "
                         f"{a['auc']:.6f} / {b['auc']:.6f} |" + (
                             f" {a['link_bytes_per_step'] / 1e6:.2f} / {b['link_bytes_per_step'] / 1e6:.2f} | "
                             f"{a['load']:.1f} / {b['load']:.1f} |" if link else ""))
        summary.append(f"{model}: median ratio of steps/s (pipelined / plain) over {len(ratios)} pairs "
                       f"**{statistics.median(ratios):.3f}x** (range {min(ratios):.3f}-{max(ratios):.3f}x).")
    table = "\n".join(lines) + "\n\n" + "  \n".join(summary)
    print(table)
    if not args.no_record:
        from _results import machine, record  # noqa: PLC0415

        delay = f"delay {link[1]}" if link and link[1] else "no added delay"
        where = (f"2 workers in two network namespaces of this host, joined by a veth link shaped by tc "
                 f"(rate {link[0]}, {delay} each way)" if link else "2 workers on this host")
        entry = (f"## SyncWorkers pipelined vs plain, {args.pairs} ABBA pairs "
                 f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                 f"Command: `.venv/bin/python benchmarks/sync_pipeline.py {' '.join(sys.argv[1:])}`  \n"
                 f"Machine: {machine(ROOT)}; load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} "
                 f"at the end. Models: {args.models} (see the script's doc), fp32, {args.steps} global steps of {args.batch_size} "
                 f"examples per worker, {where}.\n\n{table}\n")
        print(f"[sync-pipeline] recorded in {record('sync', entry)}")
    return 0


def _parse_link(text, models):
    rate, _, delay = text.partition(",")
    if not rate or "," in delay:
        raise SystemExit(f"[sync-pipeline] --link {text!r}: give RATE[,DELAY] in tc's units, e.g. --link 1gbit,0.2ms")
    if models != "functional":
        raise SystemExit(f"[sync-pipeline] --link runs the functional model only (the CLI's DeepFM starts its workers "
                         f"through start_all.sh on one host): pass --models functional, not {models!r}")
    return rate, delay


if __name__ == "__main__":
    sys.exit(main())
