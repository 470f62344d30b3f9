"""Bounded-table benchmark (issue 18), two targets.

Capacity (default): a capacity-capped ttf table trained on a stream of distinct ids keeps
its size within capacity + one batch and its RSS flat after warm-up (a capacity with a unit,
e.g. --capacity 256M, is bytes: the rows that fit at dim + Adam's slots, and memory_bytes is
reported against it); and the per-id CPU time
of its training lookup and Adam update against a plain NumPy floor (gather of the rows,
scatter of value and both Adam slots) on the same ids.

The 10x case (--dram-budget SIZE): a table of --keys rows (default: 10x the rows the budget
holds in DRAM), dim 16 with Adam, filled, then trained on Zipf(1.1) ids (each step a training
lookup and an Adam update of --batch ids); once with the DRAM + SSD tier (budget, --ssd-dir)
and once all in DRAM, each in its own child process (so each RSS is its own), alternating,
--repeats times. Reports steps/s of each (median), their ratio (target >= 0.7), the CPU time
per step of each (median, all threads) and its ratio (steadier on a shared machine), the tiered
process's peak RSS against budget + 1.5 GiB, the DRAM hit rate and bytes per key.
  .venv/bin/python benchmarks/tiers.py --dram-budget 64M --ssd-dir /tmp/ttf-ssd   # ~3M keys
  .venv/bin/python benchmarks/tiers.py --dram-budget 2G --ssd-dir /mnt/ssd --keys 100000000  # the issue's
  (add --dram-keys 10000000 where a 100M-row table does not fit in RAM: the all-DRAM run then holds 10M rows)
With --checkpoint-dir DIR, the last tiered run also saves its table there (tf.train.Checkpoint:
streamed in 64 MiB pieces) and a fresh process restores it into a tiered table: the peak
extra RSS of each (and of a whole-table export, what an unstreamed save holds) is reported.
  .venv/bin/python benchmarks/tiers.py --dram-budget 64M --ssd-dir /tmp/ttf-ssd --checkpoint-dir /tmp/ttf-ckpt --repeats 1

Example (the issue's target; ~1 GiB RSS):
  .venv/bin/python benchmarks/tiers.py --capacity 1000000 --distinct 10000000
Down-scaled (what a shared 2-core machine runs in a minute):
  .venv/bin/python benchmarks/tiers.py --capacity 200000 --distinct 2000000
A capacity in bytes, 1,000 steps after warm-up (1,157,040 rows fit; warm-up ~44 steps):
  .venv/bin/python benchmarks/tiers.py --capacity 256M --distinct 27795456

Prints one JSON object (also written to --out). Timing figures are medians over steps.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ttf  # noqa: E402,F401  (sets up Keras 2 before TF is used)
import tensorflow as tf  # noqa: E402
from ttf._ops import ops  # noqa: E402
from ttf.embedding import EmbeddingTable, parse_capacity, parse_size, tier_row_bytes  # noqa: E402


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity", default="1000000",
                   help="table capacity in rows, or with a unit (K, M, G of 1024) in bytes (default 1,000,000 rows)")
    p.add_argument("--distinct", type=int, default=10_000_000,
                   help="distinct ids in the stream; each step brings --batch new ones (default 10,000,000)")
    p.add_argument("--batch", type=int, default=26_624, help="ids per step (default 26,624 = 1024 x 26 fields)")
    p.add_argument("--dim", type=int, default=16, help="row width (default 16)")
    p.add_argument("--policy", choices=["lru", "lfu", "ttl"], default="lru", help="eviction policy; with --dram-budget, the order rows move to disk in (default lru)")
    p.add_argument("--ttl-steps", type=int, default=0, help="for --policy ttl")
    p.add_argument("--num-shards", type=int, default=16, help="lock shards of the table (default 16)")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    tier = p.add_argument_group("the 10x case (DRAM + SSD tier)")
    tier.add_argument("--dram-budget", default=None,
                      help="run the 10x case with this DRAM budget (e.g. 64M, 2G) instead of the capacity target")
    tier.add_argument("--ssd-dir", default="/tmp/ttf-ssd-tier", help="disk tier directory (default /tmp/ttf-ssd-tier)")
    tier.add_argument("--keys", type=int, default=0,
                      help="rows in the table (default 0: 10x the rows --dram-budget holds in DRAM)")
    tier.add_argument("--dram-keys", type=int, default=0,
                      help="rows of the all-DRAM run (default --keys); smaller when a table of --keys rows does not "
                           "fit in this machine's RAM (the issue's comparison: an all-DRAM table that fits)")
    tier.add_argument("--model", choices=["table", "deepfm"], default="table",
                      help="the step timed: 'table' (a training lookup and an Adam update of the table alone: "
                           "the strictest ratio) or 'deepfm' (a DeepFM train step of models/ctr.py, batch "
                           "--batch/26 rows of 26 fields, 13 dense columns, Adam: the issue's job) (default table)")
    tier.add_argument("--rows", choices=["fp32", "bf16", "int8"], default="fp32",
                      help="how the table stores rows, on both paths (docs/table_rows.md; --keys' default still "
                           "counts fp32's bytes a row) (default fp32)")
    tier.add_argument("--steps", type=int, default=60, help="timed training steps per run (default 60)")
    tier.add_argument("--warm-steps", type=int, default=20, help="untimed training steps first (default 20)")
    tier.add_argument("--repeats", type=int, default=2, help="runs of each path, alternating (default 2)")
    tier.add_argument("--checkpoint-dir", default=None,
                      help="also measure a checkpoint of the tiered table: its save (tf.train.Checkpoint, "
                           "streamed piece by piece) and, in a fresh process, its restore into a tiered table; "
                           "reports each one's peak extra RSS against the budget and the table (default: not run)")
    tier.add_argument("--child", choices=["tiered", "dram", "restore"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dram_budget is not None:
        try:
            args.dram_budget = parse_size(args.dram_budget)
        except ValueError as err:
            p.error(f"--dram-budget: {err}")
        if args.dram_budget <= 0:
            p.error("--dram-budget must be > 0")
        args.keys = args.keys or 10 * args.dram_budget // tier_row_bytes(args.dim, 2)
        args.dram_keys = args.dram_keys or args.keys
        for name in ("steps", "repeats", "keys", "dram_keys"):
            if getattr(args, name) <= 0:
                p.error(f"--{name} must be > 0")
    try:
        args.capacity, args.capacity_bytes = parse_capacity(int(args.capacity) if args.capacity.isdigit()
                                                            else args.capacity)  # digits: rows
    except ValueError as err:
        p.error(f"--capacity: {err}")
    if args.capacity_bytes:  # the rows that fit once Adam's slots are in (the table's limit while training)
        args.capacity = args.num_shards * (args.capacity_bytes // args.num_shards // tier_row_bytes(args.dim, 2))
    for name in ("capacity", "distinct", "batch", "dim", "num_shards"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if (args.policy == "ttl") != (args.ttl_steps > 0):
        p.error("--policy ttl needs --ttl-steps > 0 (and only it)")
    return args


def floor_step(store, rows_index, grads, lr=0.001, b1=0.9, b2=0.999, eps=1e-7):
    """The plain floor: gather the rows, then an Adam update scattered into value and slots."""
    dim = grads.shape[1]
    rows = np.take(store, rows_index, axis=0)  # [U, 3 * dim]: value | m | v
    value, m, v = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:]
    m += (grads - m) * (1 - b1)
    v += (grads * grads - v) * (1 - b2)
    value -= lr * m / (np.sqrt(v) + eps)
    store[rows_index] = rows


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def current_rss_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def rss_parts_mib():
    """{anon, file}: the process's RSS by kind (/proc/self/status RssAnon, RssFile: mapped
    libraries and files), MiB."""
    with open("/proc/self/status") as f:
        parts = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("RssAnon", "RssFile"))}
    return {"anon": round(parts["RssAnon"] / 1024, 1), "file": round(parts["RssFile"] / 1024, 1)}


def peak_extra_mib(run):
    """Runs run(); returns (its result, the process's peak RSS during it minus the RSS before, MiB):
    VmHWM is reset to the current RSS first (/proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = current_rss_bytes()
    result = run()
    return result, round((peak_rss_bytes() - before) / 2**20, 1)


def tier_layer(args, tiered):
    """A DynamicEmbedding of one table (so tf.train.Checkpoint saves it in ttf's format)."""
    os.makedirs(args.ssd_dir, exist_ok=True)
    layer = ttf.DynamicEmbedding(args.dim, seed=1, num_shards=args.num_shards, name="emb", evict_policy=args.policy,
                                 dram_budget=args.dram_budget if tiered else 0, ssd_dir=args.ssd_dir if tiered else "",
                                 rows=args.rows)
    layer(tf.constant([[0]], tf.int64))  # built: its table exists
    return layer


def table_step(args, layer):
    """step(keys, number) of the table alone: a training lookup, the gradient summed per
    distinct key, an Adam update."""
    h = layer.tables[0].resource_handle
    grads = tf.constant(np.random.default_rng(1).normal(size=(args.batch, args.dim)).astype(np.float32))

    def step(keys, number):
        emb, unique_keys, inverse = ops().ttf_embedding_lookup(h, keys, dim=args.dim, training=True)
        unique_grads = tf.math.unsorted_segment_sum(grads, inverse, tf.shape(unique_keys)[0])
        ops().ttf_table_apply_adam(h, unique_keys, unique_grads, 0.001, 0.9, 0.999, 1e-7, number)
    return step


def deepfm(args, tiered, first_step):
    """(its table layer, step(keys, number)): models/ctr.py's DeepFM with ttf tables (one table for the
    26 fields, rows of dim + 1 floats: the FM's linear term) and ttf's Adam, trained on the
    keys as [batch / 26, 26] ids with random dense columns and labels (throughput only: a
    tiered table trains bit for bit as an all-DRAM one, tests/embedding/test_table_tiers.py)."""
    from benchmarks._ctr import train_step
    from models import ctr

    os.makedirs(args.ssd_dir, exist_ok=True)
    spec = ctr.ModelSpec(model="fm", embedding_dim=args.dim)
    table = ttf.embedding.TableConfig(num_shards=args.num_shards, dram_budget=args.dram_budget if tiered else 0,
                                      ssd_dir=args.ssd_dir if tiered else "", evict_policy=args.policy, rows=args.rows)
    model = ctr.build(spec, "ttf", seed=1, table=table)
    optimizer = ctr.make_optimizer("ttf", "adam", 0.001)
    optimizer.iterations.assign(first_step - 1)  # its next apply updates the table at first_step
    rows, fields = args.batch // spec.num_fields, spec.num_fields
    rng = np.random.default_rng(1)

    train = train_step(model, optimizer)

    def step(keys, number):
        features = {"ids": keys[:rows * fields].reshape(rows, fields),
                    "dense": rng.normal(size=(rows, spec.num_dense)).astype(np.float32)}
        train(features, (rng.random(rows) < 0.25).astype(np.float32)).numpy()
    model.logits({"ids": np.zeros((1, fields), np.int64), "dense": np.zeros((1, spec.num_dense), np.float32)})
    return model.sparse, step


def checkpoint_save(args, layer, table):
    """The tiered table's save (the checkpoint format's streamed path), then for comparison
    the whole-table export an unstreamed save would hold; peak extra RSS of each."""
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path, save_extra = peak_extra_mib(
        lambda: tf.train.Checkpoint(layer=layer).write(os.path.join(args.checkpoint_dir, "ckpt")))
    _, export_extra = peak_extra_mib(lambda: len(table.export()["keys"]))
    size = sum(os.path.getsize(os.path.join(args.checkpoint_dir, f)) for f in os.listdir(args.checkpoint_dir)
               if f.startswith("ckpt"))
    return {"checkpoint": path, "checkpoint_mib": round(size / 2**20, 1), "save_peak_extra_mib": save_extra,
            "whole_export_peak_extra_mib": export_extra}


def restore_child(args):
    """A fresh tiered table restored from --checkpoint-dir; prints its JSON line."""
    layer = tier_layer(args, True)
    table = layer.tables[0]
    path = tf.train.latest_checkpoint(args.checkpoint_dir) or os.path.join(args.checkpoint_dir, "ckpt")
    _, extra = peak_extra_mib(lambda: tf.train.Checkpoint(layer=layer).read(path).assert_consumed())
    stats = table.tier_stats()
    print(json.dumps({"path": "restore", "rows": int(table.size()), "restore_peak_extra_mib": extra,
                      "dram_rows": stats["dram_rows"], "disk_rows": stats["disk_rows"],
                      "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1)}))
    return 0


def tier_child(args):
    """One run of the 10x case on one path; prints its JSON line."""
    if args.child == "restore":
        return restore_child(args)
    tiered = args.child == "tiered"
    keys_held = args.keys if tiered else args.dram_keys
    fill_batch = 1 << 18
    first_step = -(-args.keys // fill_batch) + 1  # after the fill's steps, the same on both paths
    if args.model == "deepfm":
        layer, train_step = deepfm(args, tiered, first_step)
    else:
        layer = tier_layer(args, tiered)
        train_step = table_step(args, layer)
    table = layer.tables[0]
    h = table.resource_handle
    row_dim = args.dim + (args.model == "deepfm")  # DeepFM's rows carry the FM's linear term
    mix = np.uint64(0x9E3779B97F4A7C15)
    t0 = time.perf_counter()
    # Fill every row once (as Adam rows: apply, zero gradients), the coldest ranks first, each
    # batch at a step of its own (the last at first_step - 1): the DRAM tier starts with the
    # hottest rows, as a long job's LRU holds them (the warm steps then bring it to the steady
    # state; the window lines on stderr show the hit rate settle). Filled at one step, the
    # rows' order (last-seen step, count, then key) came down to their keys: DRAM started
    # with rows at random.
    for end in range(keys_held, 0, -fill_batch):
        ids = np.arange(max(0, end - fill_batch), end, dtype=np.uint64)[::-1]
        keys = (ids * mix).astype(np.int64)
        fill_step = first_step - 1 - (end - 1) // fill_batch
        ops().ttf_table_apply_adam(h, keys, np.zeros((len(keys), row_dim), np.float32), 0.0, 0.9, 0.999, 1e-7,
                                   fill_step)
        if (keys_held - end) % (1 << 24) < fill_batch:  # progress every ~16M rows
            print(f"[tiers] filled {keys_held - end + len(keys):,} of {keys_held:,} rows, "
                  f"RSS {current_rss_bytes() / 2**20:.0f} MiB (peak {peak_rss_bytes() / 2**20:.0f})",
                  file=sys.stderr, flush=True)
    fill_s = time.perf_counter() - t0
    rss_after_fill_mib = round(current_rss_bytes() / 2**20, 1)
    rng = np.random.default_rng(0)
    times, cpu_times = [], []
    hits_at = lambda s: (s["dram_hits"], s["disk_hits"], s["disk_waits"])  # noqa: E731
    window_t, window_hits = time.perf_counter(), hits_at(table.tier_stats()) if tiered else (0, 0, 0)
    for i in range(args.warm_steps + args.steps):
        step = first_step + i
        if i == args.warm_steps and tiered:
            timed_hits = hits_at(table.tier_stats())
        # The same ids on both paths: Zipf(1.1) ranks folded into the tiered table's --keys
        # (a rank beyond them is another key, not one overloaded last key); the all-DRAM
        # table, filled with the hottest --dram-keys, inserts the others as they come.
        ranks = (rng.zipf(1.1, args.batch) - 1) % args.keys  # rank 0 is the hottest id
        keys = (ranks.astype(np.uint64) * mix).astype(np.int64)  # hot ids spread over the id space
        t0, c0 = time.perf_counter(), time.process_time()
        train_step(keys, step)
        if i >= args.warm_steps:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)  # all threads: steadier than wall time on a shared machine
        if tiered and (i + 1) % 200 == 0:  # progress: each window's hit rate and speed
            now_hits, now_t = hits_at(table.tier_stats()), time.perf_counter()
            dram, disk = now_hits[0] - window_hits[0], now_hits[1] - window_hits[1]
            print(f"[tiers] step {i + 1}: window hit rate {dram / max(1, dram + disk):.4f}, "
                  f"{200 / (now_t - window_t):.2f} steps/s, RSS {current_rss_bytes() / 2**20:.0f} MiB",
                  file=sys.stderr, flush=True)
            window_t, window_hits = now_t, now_hits
    stats = table.tier_stats()
    rows = int(table.size())
    peak_rss_mib = round(peak_rss_bytes() / 2**20, 1)  # of training, before any checkpoint
    saved = checkpoint_save(args, layer, table) if tiered and args.checkpoint_dir else {}
    print(json.dumps({**saved,
        "path": args.child, "rows": rows, "fill_s": round(fill_s, 1),
        "steps_per_s": round(1.0 / float(np.median(times)), 2),
        "cpu_ms_per_step": round(1000 * float(np.median(cpu_times)), 2), "peak_rss_mib": peak_rss_mib,
        "dram_rows": stats["dram_rows"], "disk_rows": stats["disk_rows"],
        "promoted": stats["promoted"], "written_back": stats.get("written_back"),  # since the fill began
        "dram_hit_rate": round((stats["dram_hits"] - timed_hits[0]) / max(
            1, stats["dram_hits"] + stats["disk_hits"] - sum(timed_hits[:2])), 4) if tiered else None,  # timed steps
        "disk_reads_from_device": round((stats["disk_waits"] - timed_hits[2]) / max(
            1, stats["disk_hits"] - timed_hits[1]), 4) if tiered else None,  # the rest: page cache
        "rss_after_fill_mib": rss_after_fill_mib, "rss_at_end_mib": rss_parts_mib(),
        "ram_bytes_per_key": round((stats["dram_bytes"] + stats["disk_index_bytes"]) / max(rows, 1), 1),
        "disk_index_bytes_per_disk_key": round(stats["disk_index_bytes"] / max(1, stats["disk_rows"]), 1),
        "disk_file_mib": round(stats["disk_file_bytes"] / 2**20, 1),
        "memory_bytes": int(table.stats().memory_bytes)}))
    return 0


def tier_main(args, argv):
    """The 10x case: alternating child runs of both paths, then the summary."""
    runs = {"tiered": [], "dram": []}
    base = [sys.executable, os.path.abspath(__file__)] + (argv if argv is not None else sys.argv[1:])
    for _ in range(args.repeats):
        for path in ("tiered", "dram"):
            done = subprocess.run(base + ["--child", path], capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                return 1
            runs[path].append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.checkpoint_dir:  # the last tiered run saved: restore it in a fresh process
        done = subprocess.run(base + ["--child", "restore"], capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-3000:])
            return 1
        runs["restore"] = [json.loads(done.stdout.strip().splitlines()[-1])]
    tiered_sps = float(np.median([r["steps_per_s"] for r in runs["tiered"]]))
    dram_sps = float(np.median([r["steps_per_s"] for r in runs["dram"]]))
    tiered_cpu = float(np.median([r["cpu_ms_per_step"] for r in runs["tiered"]]))
    dram_cpu = float(np.median([r["cpu_ms_per_step"] for r in runs["dram"]]))
    budget_mib = args.dram_budget / 2**20
    peak = max(r["peak_rss_mib"] for r in runs["tiered"])
    result = {
        "command": " ".join(["benchmarks/tiers.py"] + (argv if argv is not None else sys.argv[1:])),
        "dram_budget_mib": round(budget_mib, 1), "keys": args.keys, "dram_keys": args.dram_keys, "batch": args.batch,
        "dim": args.dim, "rows": args.rows,
        "rows_over_dram_rows": round(args.keys / max(1, runs["tiered"][0]["dram_rows"]), 1),
        "tiered_steps_per_s": tiered_sps, "dram_steps_per_s": dram_sps,
        "throughput_ratio": round(tiered_sps / dram_sps, 3), "throughput_target_met": tiered_sps >= 0.7 * dram_sps,
        "tiered_cpu_ms_per_step": tiered_cpu, "dram_cpu_ms_per_step": dram_cpu,
        "cpu_time_ratio": round(dram_cpu / tiered_cpu, 3),  # all-DRAM CPU time per step over tiered: >= 0.7 wanted
        "tiered_peak_rss_mib": peak, "rss_bound_mib": round(budget_mib + 1536, 1), "rss_target_met": peak <= budget_mib + 1536,
        "runs": runs, "tf_version": tf.__version__,
    }
    if args.checkpoint_dir:
        saved = runs["tiered"][-1]
        result.update({"save_peak_extra_mib": saved["save_peak_extra_mib"],
                       "whole_export_peak_extra_mib": saved["whole_export_peak_extra_mib"],
                       "checkpoint_mib": saved["checkpoint_mib"],
                       "restore_peak_extra_mib": runs["restore"][0]["restore_peak_extra_mib"],
                       "restored_rows": runs["restore"][0]["rows"]})
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return tier_child(args)
    if args.dram_budget is not None:
        return tier_main(args, argv)
    capacity = f"{args.capacity_bytes}B" if args.capacity_bytes else args.capacity
    table = EmbeddingTable(args.dim, num_shards=args.num_shards, capacity=capacity, evict_policy=args.policy,
                           ttl_steps=args.ttl_steps)
    h = table.resource_handle
    rng = np.random.default_rng(0)
    steps = args.distinct // args.batch
    mix = np.uint64(0x9E3779B97F4A7C15)
    sizes, rss, memory, lookup_ns, apply_ns, floor_ns = [], [], [], [], [], []
    store = np.zeros((args.capacity, 3 * args.dim), np.float32)  # the floor's contiguous rows
    warm_step = None
    for step in range(1, steps + 1):
        ids = np.arange((step - 1) * args.batch, step * args.batch, dtype=np.uint64)
        keys = (ids * mix).astype(np.int64)  # distinct, spread over the id space
        grads = rng.normal(size=(args.batch, args.dim)).astype(np.float32)
        t0 = time.process_time_ns()
        _, unique_keys, inverse = ops().ttf_embedding_lookup(h, keys, dim=args.dim, training=True)
        t1 = time.process_time_ns()
        ops().ttf_table_apply_adam(h, unique_keys, grads, 0.001, 0.9, 0.999, 1e-7, step)
        t2 = time.process_time_ns()
        floor_step(store, rng.integers(0, args.capacity, args.batch), grads)
        t3 = time.process_time_ns()
        size = int(table.size())
        sizes.append(size)
        if warm_step is None and size >= args.capacity * 15 // 16:
            warm_step = step
        if warm_step is not None:
            rss.append(rss_bytes())
            memory.append(int(table.stats().memory_bytes))
            lookup_ns.append((t1 - t0) / args.batch)
            apply_ns.append((t2 - t1) / args.batch)
            floor_ns.append((t3 - t2) / args.batch)
    after = rss[len(rss) // 10:] if rss else []  # past the first tenth after warm-up
    result = {
        "command": " ".join(["benchmarks/tiers.py"] + (argv if argv is not None else sys.argv[1:])),
        "capacity": args.capacity, "capacity_bytes": args.capacity_bytes, "batch": args.batch, "steps": steps,
        "distinct_ids": steps * args.batch,
        "policy": args.policy, "dim": args.dim,
        "max_size": max(sizes), "size_bound": args.capacity + args.batch,
        "size_within_bound": max(sizes) <= args.capacity + args.batch,
        "rows_evicted": int(table.stats().rows_evicted),
        "warm_up_step": warm_step,
        "rss_mib_min_after_warmup": round(min(after) / 2**20, 1) if after else None,
        "rss_mib_max_after_warmup": round(max(after) / 2**20, 1) if after else None,
        "rss_spread_after_warmup": round(max(after) / min(after) - 1, 4) if after else None,
        "steps_after_warmup": len(rss),
        "memory_mib_min_after_warmup": round(min(memory) / 2**20, 1) if memory else None,
        "memory_mib_max_after_warmup": round(max(memory) / 2**20, 1) if memory else None,
        "memory_spread_after_warmup": round(max(memory) / min(memory) - 1, 4) if memory else None,
        # The rows that fit plus one update's new ids, RowBytes each. Reported, not the exit code:
        # a table of a few MiB also holds its lock shards' partly used chunks of 1024 rows.
        "memory_bound_mib": round((args.capacity + args.batch) * tier_row_bytes(args.dim, 2) / 2**20, 1),
        "memory_within_bound": max(memory) <= (args.capacity + args.batch) * tier_row_bytes(args.dim, 2)
        if memory else None,
        "lookup_ns_per_id_median": round(float(np.median(lookup_ns)), 1) if lookup_ns else None,
        "apply_ns_per_id_median": round(float(np.median(apply_ns)), 1) if apply_ns else None,
        "numpy_gather_adam_scatter_ns_per_id_median": round(float(np.median(floor_ns)), 1) if floor_ns else None,
        "tf_version": tf.__version__,
    }
    if lookup_ns:
        result["train_step_vs_floor"] = round(
            (result["lookup_ns_per_id_median"] + result["apply_ns_per_id_median"])
            / result["numpy_gather_adam_scatter_ns_per_id_median"], 2)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["size_within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
