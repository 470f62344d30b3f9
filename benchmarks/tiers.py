"""Bounded-table benchmark (issue 18): a capacity-capped ttf table trained on a stream of
distinct ids keeps its size within capacity + one batch and its RSS flat after warm-up; and
the per-id CPU time of its training lookup and Adam update against a plain NumPy floor
(gather of the rows, scatter of value and both Adam slots) on the same ids.

Example (the issue's target; ~1 GiB RSS):
  .venv/bin/python benchmarks/tiers.py --capacity 1000000 --distinct 10000000
Down-scaled (what a shared 2-core machine runs in a minute):
  .venv/bin/python benchmarks/tiers.py --capacity 200000 --distinct 2000000

Prints one JSON object (also written to --out). Timing figures are medians over steps.
The DRAM + SSD tier is not built yet: this script measures the capacity target only.
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ttf  # noqa: E402,F401  (sets up Keras 2 before TF is used)
import tensorflow as tf  # noqa: E402
from ttf._ops import ops  # noqa: E402
from ttf.embedding import EmbeddingTable  # noqa: E402


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity", type=int, default=1_000_000, help="table capacity in rows (default 1,000,000)")
    p.add_argument("--distinct", type=int, default=10_000_000,
                   help="distinct ids in the stream; each step brings --batch new ones (default 10,000,000)")
    p.add_argument("--batch", type=int, default=26_624, help="ids per step (default 26,624 = 1024 x 26 fields)")
    p.add_argument("--dim", type=int, default=16, help="row width (default 16)")
    p.add_argument("--policy", choices=["lru", "lfu", "ttl"], default="lru", help="eviction policy (default lru)")
    p.add_argument("--ttl-steps", type=int, default=0, help="for --policy ttl")
    p.add_argument("--num-shards", type=int, default=16, help="lock shards of the table (default 16)")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = p.parse_args(argv)
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


def main(argv=None):
    args = parse_args(argv)
    table = EmbeddingTable(args.dim, num_shards=args.num_shards, capacity=args.capacity, evict_policy=args.policy,
                           ttl_steps=args.ttl_steps)
    h = table.resource_handle
    rng = np.random.default_rng(0)
    steps = args.distinct // args.batch
    mix = np.uint64(0x9E3779B97F4A7C15)
    sizes, rss, lookup_ns, apply_ns, floor_ns = [], [], [], [], []
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
            lookup_ns.append((t1 - t0) / args.batch)
            apply_ns.append((t2 - t1) / args.batch)
            floor_ns.append((t3 - t2) / args.batch)
    after = rss[len(rss) // 10:] if rss else []  # past the first tenth after warm-up
    result = {
        "command": " ".join(["benchmarks/tiers.py"] + (argv if argv is not None else sys.argv[1:])),
        "capacity": args.capacity, "batch": args.batch, "steps": steps, "distinct_ids": steps * args.batch,
        "policy": args.policy, "dim": args.dim,
        "max_size": max(sizes), "size_bound": args.capacity + args.batch,
        "size_within_bound": max(sizes) <= args.capacity + args.batch,
        "rows_evicted": int(table.stats().rows_evicted),
        "warm_up_step": warm_step,
        "rss_mib_min_after_warmup": round(min(after) / 2**20, 1) if after else None,
        "rss_mib_max_after_warmup": round(max(after) / 2**20, 1) if after else None,
        "rss_spread_after_warmup": round(max(after) / min(after) - 1, 4) if after else None,
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
