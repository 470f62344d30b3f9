"""ttf's lookup and training step against the gather / scatter floor (issue 18 item 5).

A ttf table of --keys rows (dim 16, Adam slots, filled first) and the same rows as plain
contiguous arrays, read with the same Zipf(1.1) ids (--batch ids a call; id rank r is ttf key
r * 0x9E3779B97F4A7C15 and floor row r; rows filled in rank order on both sides). Each call is
timed in CPU time of the whole process (time.process_time_ns: TensorFlow's pool threads
count), reported as ns per id (median over calls; the JSON also has wall-clock medians), after
gc.freeze() (Python's collector scanning TensorFlow's heap inside timed calls was 7% of a
lookup's profile). The paths:

  inference lookup
    ttf            TtfEmbeddingLookup(training=False) in a tf.function that reads only its
                   embeddings, as a ttf layer runs at inference: ids -> [batch, dim] rows, each id
                   probed straight into its output (no de-dup: nothing reads the unique keys)
    ttf_tiered     the same on a table with the SSD tier on (dram_budget, ssd_dir), DRAM hits (ids
                   without a DRAM row would then be read from disk, per shard)
    np_take        np.take of the rows from a contiguous [keys, dim] array
    cpp_gather     a C++ loop copying the value part of rows of a [keys, 3 * dim] array
    cpp_hash       the bare hash loop of ttf's own layout over the same rows, keyed by the same
                   keys (lookup_floor.cc: one 12-byte-slot index at ttf's load, FindEach's
                   pipeline; no shards, locks or TensorFlow): what a hash lookup can reach
  training step (forward rows, then the Adam update of value and both slots)
    ttf            TtfEmbeddingLookup(training=True) + TtfEmbeddingGrad (the layer's gradient
                   sum per unique key) + TtfTableApplyAdam
    ttf_tiered     the same on the tiered table
    np             np.take of [value | m | v] rows, Adam in NumPy, scatter back (one gather
                   serves the forward and the update)
    cpp            the C++ gather above, then a C++ loop updating the rows in place
The floors work per id (duplicates included); ttf works per unique id after a de-dup.

The compared paths run interleaved in one process, --repeats rounds of --calls calls each.
With --isolate, each family (ttf table / tiered table / floor arrays) instead lives in its own
child process, one at a time, alternating over the rounds: at 10M keys the three together
would need ~6 GiB, one at a time ~2.6 GiB.

  .venv/bin/python benchmarks/lookup_floor.py --keys 1000000
  .venv/bin/python benchmarks/lookup_floor.py --keys 10000000 --isolate       # ~2.6 GiB peak
  .venv/bin/python benchmarks/lookup_floor.py --keys 100000 --repeats 2 --calls 5  # a smoke run
  .venv/bin/python benchmarks/lookup_floor.py --kinds lookup --families ttf,floor  # issue 37 item 5: vs cpp_hash
  .venv/bin/python benchmarks/lookup_floor.py --keys 10000000 --dim 32 --families ttf --rows fp32,int8,bf16

--rows FORMATS (issue 49): one ttf table per row format (TableConfig(rows=...)), paths
lookup/ttf_int8 etc. beside lookup/ttf (fp32); each is also compared with fp32 call by call
(the median of the paired ratios). The order of the paths reverses every call (A B, B A: ABBA
pairs), so neither side always runs right after the other.

Prints a table of ns/id and the ratios ttf / floor; --out FILE also writes the JSON.
"""
import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ttf  # noqa: E402,F401  (sets up Keras 2 before TF is used)
import tensorflow as tf  # noqa: E402
from ttf._ops import ops  # noqa: E402
from ttf.embedding import EmbeddingTable, parse_size, tier_row_bytes  # noqa: E402

MIX = np.uint64(0x9E3779B97F4A7C15)
ADAM = dict(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
FAMILIES = ("ttf", "tiered", "floor")
ROW_FORMATS = ("fp32", "bf16", "int8")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="rows in each table (default 1,000,000)")
    p.add_argument("--batch", type=int, default=26_624, help="ids per call (default 26,624 = 1024 x 26 fields)")
    p.add_argument("--dim", type=int, default=16, help="row width (default 16)")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the id ranks (default 1.1)")
    p.add_argument("--num-shards", type=int, default=16, help="lock shards of the ttf tables (default 16)")
    p.add_argument("--group", type=int, default=8,
                   help="batches per timed call (default 8): ttf's run in one tf.function, one after the other, "
                        "so TensorFlow's ~0.4 ms call overhead is not counted as table work")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--calls", type=int, default=20, help="timed calls per path per round (default 20)")
    p.add_argument("--families", default="ttf,tiered,floor",
                   help="comma-separated subset of ttf, tiered, floor (default all three)")
    p.add_argument("--kinds", default="lookup,train",
                   help="which paths: lookup, train or both (default both; lookups alone leave the training "
                        "step's memory traffic out of the lookups' caches)")
    p.add_argument("--ssd-dir", default=os.path.join(tempfile.gettempdir(), "ttf-lookup-floor"),
                   help="disk tier directory of the tiered table (default $TMPDIR/ttf-lookup-floor)")
    p.add_argument("--dram-budget", default=None,
                   help="the tiered table's DRAM budget (e.g. 512M; default: 1.1x what --keys rows take, "
                        "so every lookup is a DRAM hit)")
    p.add_argument("--isolate", action="store_true",
                   help="one child process per family, one at a time (for sizes whose families do not fit together)")
    p.add_argument("--rows", default="fp32",
                   help="comma-separated row formats of the ttf tables: fp32, bf16, int8 (default fp32; the tiered "
                        "table is fp32 only)")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("keys", "batch", "dim", "num_shards", "repeats", "calls"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.zipf <= 1.0:
        p.error(f"--zipf must be > 1 (numpy's Zipf), got {args.zipf}")
    args.families = [f for f in args.families.split(",") if f]
    args.rows = [r for r in args.rows.split(",") if r]
    if not args.rows or any(r not in ROW_FORMATS for r in args.rows) or len(set(args.rows)) != len(args.rows):
        p.error(f"--rows takes distinct formats among {', '.join(ROW_FORMATS)}, got {','.join(args.rows)}")
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not args.kinds or any(k not in ("lookup", "train") for k in args.kinds):
        p.error(f"--kinds takes lookup, train or both, got {','.join(args.kinds)}")
    if not args.families or any(f not in FAMILIES for f in args.families):
        p.error(f"--families takes a subset of {', '.join(FAMILIES)}, got {','.join(args.families)}")
    if args.dram_budget is None:
        args.dram_budget = int(1.1 * args.keys * tier_row_bytes(args.dim, 2))
    else:
        try:
            args.dram_budget = parse_size(args.dram_budget)
        except ValueError as err:
            p.error(f"--dram-budget: {err}")
        if args.dram_budget <= 0:
            p.error("--dram-budget must be > 0")
    return args


# Call c of the k-th path covers --group batches from batch (c + PATH_STAGGER * k) * group (mod
# NUM_BATCHES), so a path never runs a batch that another path ran fewer than PATH_STAGGER calls
# before. With every path on the same batch in turn (as before issue 18's branch floor), a path
# reading the memory of the one before it found that batch's rows still in the cache: the C++
# training floor after the NumPy one (one array), the ttf training step after the ttf lookup.
NUM_BATCHES = 128
PATH_STAGGER = 4


def id_batches(args, count=NUM_BATCHES):
    """`count` batches of Zipf ranks in [0, keys), the same in every process (seed 0)."""
    rng = np.random.default_rng(0)
    return [(rng.zipf(args.zipf, args.batch) - 1) % args.keys for _ in range(count)]


def batches_from(batches, first, group):
    """The `group` batches a timed call covers, from batch `first` on (wrapping around)."""
    return [batches[(first + i) % NUM_BATCHES] for i in range(group)]


def keys_of(ranks):
    return (ranks.astype(np.uint64) * MIX).astype(np.int64)  # hot ranks spread over the key space


def cpp_floor():
    """The C++ loops of lookup_floor.cc, built with ttf's flags into a temporary folder."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lookup_floor.cc")
    lib = os.path.join(tempfile.mkdtemp(prefix="ttf-floor-"), "lookup_floor.so")
    subprocess.run(["g++", "-O3", "-fPIC", "-shared", "-std=c++17", src, "-o", lib], check=True)
    so = ctypes.CDLL(lib)
    ptr, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    so.floor_gather.argtypes = [ptr, i64, ptr, i64, i64, ptr]
    so.floor_adam.argtypes = [ptr, i64, ptr, i64, i64, ptr, f32, f32, f32, f32]
    so.floor_hash_build.argtypes, so.floor_hash_build.restype = [ptr, i64], ptr
    so.floor_hash_free.argtypes = [ptr]
    so.floor_hash_lookup.argtypes = [ptr, ptr, i64, ptr, i64, i64, ptr]
    return so


class TtfFamily:
    """A filled ttf table (tiered or not) and its two timed paths."""

    def __init__(self, args, tiered, rows="fp32"):
        self.prefix = "ttf_tiered" if tiered else "ttf" if rows == "fp32" else f"ttf_{rows}"
        self.dim, self.step, self.group = args.dim, 1, args.group
        self.infer_of = {}
        if tiered:
            os.makedirs(args.ssd_dir, exist_ok=True)
        self.table = EmbeddingTable(args.dim, num_shards=args.num_shards, seed=1,
                                    dram_budget=args.dram_budget if tiered else 0,
                                    ssd_dir=args.ssd_dir if tiered else "", rows=rows)
        self.handle = self.table.resource_handle
        for begin in range(0, args.keys, 1 << 18):  # every row once, in rank order, as Adam rows
            ranks = np.arange(begin, min(begin + (1 << 18), args.keys))
            ops().ttf_table_apply_adam(self.handle, keys_of(ranks), np.zeros((len(ranks), args.dim), np.float32),
                                       0.0, 0.9, 0.999, 1e-7, self.step)
        rng = np.random.default_rng(1)
        self.batches = [tf.constant(keys_of(r)) for r in id_batches(args)]
        self.grads = tf.constant(rng.normal(size=(args.batch, args.dim)).astype(np.float32))

    def paths(self):
        return {f"lookup/{self.prefix}": self.lookup, f"train/{self.prefix}": self.train}

    def lookup(self, b):
        # One function per group of batches, its batches captured: a call costs TensorFlow's
        # executor and the ops, not Python binding 8 tensor arguments (13% of this path's CPU
        # when they were arguments, profiled; a model pays that once a predict, not a lookup).
        if b not in self.infer_of:
            batches = batches_from(self.batches, b, self.group)
            self.infer_of[b] = tf.function(lambda: self.infer(batches))
        return self.infer_of[b]()

    def infer(self, batches):
        # As a layer runs at inference: in a graph, only the embeddings read (the op then skips
        # its de-dup). One lookup after the other, as calls would run; only the last output is
        # returned, so each other one is freed as soon as its op ends (as a model's next layer
        # consumes it) and the allocator hands the same cache-warm buffer to the next lookup, as
        # the floors write into one. Returning all the group's outputs kept 8 live, cold buffers
        # a call (~15% more CPU time, measured).
        out = []
        for ids in batches:
            with tf.control_dependencies(out[-1:]):
                out.append(ops().ttf_embedding_lookup(self.handle, ids, dim=self.dim, training=False)[0])
        return out[-1]

    def train(self, b):
        first_step = self.step + 1
        self.step += self.group
        return self.train_steps(batches_from(self.batches, b, self.group), tf.constant(first_step, tf.int64))

    @tf.function
    def train_steps(self, batches, first_step):
        done = []
        for i, ids in enumerate(batches):
            with tf.control_dependencies(done[-1:]):
                _, unique_keys, inverse = ops().ttf_embedding_lookup(self.handle, ids, dim=self.dim, training=True)
                unique_grads = ops().ttf_embedding_grad(self.grads, inverse, unique_keys)
                done.append(ops().ttf_table_apply_adam(self.handle, unique_keys, unique_grads, ADAM["lr"],
                                                       ADAM["beta_1"], ADAM["beta_2"], ADAM["epsilon"],
                                                       first_step + i))
        return done

    def extra(self):
        stats = self.table.tier_stats()
        hits = stats["dram_hits"] + stats["disk_hits"]
        out = {f"{self.prefix}_rows": int(self.table.size()), f"{self.prefix}_memory_bytes": int(self.table.stats()[1]),
               f"{self.prefix}_process_anon_huge_pages_mib": anon_huge_pages_mib()}
        if self.prefix == "ttf_tiered":
            out["ttf_tiered_dram_hit_rate"] = round(stats["dram_hits"] / max(hits, 1), 6)
            out["ttf_tiered_disk_rows"] = stats["disk_rows"]
        return out


class FloorFamily:
    """The same rows as contiguous arrays: NumPy and C++ loops, no hash table."""

    def __init__(self, args):
        self.dim, self.group = args.dim, args.group
        rng = np.random.default_rng(1)
        self.value = rng.uniform(-0.05, 0.05, size=(args.keys, args.dim)).astype(np.float32)  # np.take's rows
        self.store = np.zeros((args.keys, 3 * args.dim), np.float32)  # value | m | v
        self.store[:, :args.dim] = self.value
        self.batches = [np.ascontiguousarray(r, dtype=np.int64) for r in id_batches(args)]
        self.grads = rng.normal(size=(args.batch, args.dim)).astype(np.float32)
        self.out = np.empty((args.batch, args.dim), np.float32)
        self.so = cpp_floor()
        # The bare hash loop's own copy of the rows: shared with the gather, which reads the same
        # hot rows just before it, its rows were warm where the ttf table's are not.
        self.hash_store = self.store.copy()
        all_keys = keys_of(np.arange(args.keys))  # key of rank r -> row r, as the ttf table fills
        self.index = self.so.floor_hash_build(all_keys.ctypes.data, args.keys)
        if not self.index:
            raise MemoryError(f"the bare hash loop's index of {args.keys} keys: mmap failed")
        self.keys = [keys_of(r) for r in self.batches]
        self.unique_share = statistics.mean(len(np.unique(r)) / len(r) for r in self.batches)

    def paths(self):
        return {"lookup/np_take": self.np_take, "lookup/cpp_gather": self.cpp_gather, "lookup/cpp_hash": self.cpp_hash,
                "train/np": self.np_train, "train/cpp": self.cpp_train}

    def np_take(self, b):
        out = None
        for idx in batches_from(self.batches, b, self.group):
            out = np.take(self.value, idx, axis=0)  # the previous batch's array freed: its buffer reused
        return out

    def cpp_gather(self, b):
        for idx in batches_from(self.batches, b, self.group):
            self.gather_one(idx)
        return self.out

    def cpp_hash(self, b):
        for keys in batches_from(self.keys, b, self.group):
            self.so.floor_hash_lookup(self.index, self.hash_store.ctypes.data, self.store.shape[1], keys.ctypes.data,
                                      len(keys), self.dim, self.out.ctypes.data)
        return self.out

    def gather_one(self, idx):
        self.so.floor_gather(self.store.ctypes.data, self.store.shape[1], idx.ctypes.data, len(idx), self.dim,
                             self.out.ctypes.data)

    def np_train(self, b):
        for idx in batches_from(self.batches, b, self.group):
            self.np_step(idx)

    def np_step(self, idx, lr=ADAM["lr"], b1=ADAM["beta_1"], b2=ADAM["beta_2"], eps=ADAM["epsilon"]):
        dim, g = self.dim, self.grads
        rows = np.take(self.store, idx, axis=0)  # [batch, 3 * dim]; rows[:, :dim] is the forward
        value, m, v = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:]
        m += (g - m) * (1 - b1)
        v += (g * g - v) * (1 - b2)
        value -= lr * m / (np.sqrt(v) + eps)
        self.store[idx] = rows

    def cpp_train(self, b):
        for idx in batches_from(self.batches, b, self.group):
            self.gather_one(idx)  # the forward
            self.so.floor_adam(self.store.ctypes.data, self.store.shape[1], idx.ctypes.data, len(idx), self.dim,
                               self.grads.ctypes.data, ADAM["lr"], ADAM["beta_1"], ADAM["beta_2"], ADAM["epsilon"])

    def extra(self):
        return {"unique_ids_per_id": round(self.unique_share, 4), "floor_process_anon_huge_pages_mib": anon_huge_pages_mib()}


def anon_huge_pages_mib():
    """The process's memory in transparent huge pages (Linux; None elsewhere): whether the
    table's rows and the floors' arrays got them decides much of a gather's cost."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def build(args, family):
    """The family's objects: one ttf table per --rows format, one tiered table, or the floors."""
    if family == "floor":
        return [FloorFamily(args)]
    if family == "tiered":
        return [TtfFamily(args, tiered=True)]
    return [TtfFamily(args, tiered=False, rows=rows) for rows in args.rows]


def quiet_gc():
    """Moves the objects built so far out of the collector's reach: its full scans of
    TensorFlow's Python heap would otherwise land inside random timed calls, of any path."""
    gc.collect()
    gc.freeze()


def group_starts(args):
    """Every first batch a timed call can start at (run_round's): the warm-up calls each once, so
    no timed call traces a tf.function (ttf's lookup has one per start)."""
    return sorted({(call * args.group) % NUM_BATCHES for call in range(NUM_BATCHES)})


def paths_of(family, args):
    return {name: fn for name, fn in family.paths().items() if name.split("/")[0] in args.kinds}


def run_round(families, args, times, first_call=0):
    """One round: every path of every family, interleaved call by call (staggered batches)."""
    paths = list({name: fn for fam in families for name, fn in paths_of(fam, args).items()}.items())
    for call in range(first_call, first_call + args.calls):
        order = list(enumerate(paths))
        for k, (name, fn) in order if call % 2 == 0 else order[::-1]:  # ABBA: each path first every other call
            t0, w0 = time.process_time_ns(), time.perf_counter_ns()
            fn(((call + PATH_STAGGER * k) * args.group) % NUM_BATCHES)
            times.setdefault(name, []).append((time.process_time_ns() - t0) / (args.batch * args.group))
            times.setdefault("wall:" + name, []).append((time.perf_counter_ns() - w0) / (args.batch * args.group))


def run_child(args):
    """--child FAMILY: build it, warm up, time --calls calls per path (one round), print JSON."""
    fams = build(args, args.child)
    quiet_gc()
    for fam in fams:
        for name, fn in paths_of(fam, args).items():  # warm-up: first-call tracing and page faults
            for b in group_starts(args):
                fn(b)
    times = {}
    run_round(fams, args, times)
    extra = {k: v for fam in fams for k, v in fam.extra().items()}
    print("RESULT " + json.dumps({"times": times, "extra": extra}), flush=True)


def paired_speed(times, name, fp32_name):
    """A compressed-row path's speed against fp32's: the median over calls of fp32's time / its
    time in the same call (the two ran back to back, ABBA); None for fp32 itself or without it."""
    if name == fp32_name or not name.startswith(fp32_name + "_") or fp32_name not in times or "tiered" in name:
        return None
    return statistics.median(a / b for a, b in zip(times[fp32_name], times[name]))


def summarize(args, times, extra):
    wall = {name[5:]: round(statistics.median(v), 1) for name, v in times.items() if name.startswith("wall:")}
    med = {name: statistics.median(v) for name, v in times.items() if not name.startswith("wall:")}
    lines = ["| path | CPU ns/id (median) | vs np floor | vs C++ floor | vs bare hash loop | fp32's speed (paired) |",
             "| --- | --- | --- | --- | --- | --- |"]
    ratios = {}
    fmt = lambda r: f"{r:.2f}x" if r is not None else "-"  # noqa: E731
    for kind, np_floor, cpp_floor_name in (("lookup", "lookup/np_take", "lookup/cpp_gather"),
                                           ("train", "train/np", "train/cpp")):
        for name in sorted(n for n in med if n.startswith(kind + "/")):
            vs_np = med[name] / med[np_floor] if np_floor in med else None
            vs_cpp = med[name] / med[cpp_floor_name] if cpp_floor_name in med else None
            # Issue 37 item 5: a lookup against the bare loop of its own layout (cpp_hash).
            vs_hash = med[name] / med["lookup/cpp_hash"] if kind == "lookup" and "lookup/cpp_hash" in med else None
            speed = paired_speed(times, name, f"{kind}/ttf")
            lines.append(f"| {name} | {med[name]:.1f} | {fmt(vs_np)} | {fmt(vs_cpp)} | {fmt(vs_hash)} | {fmt(speed)} |")
            ratios[name] = {"vs_np": vs_np and round(vs_np, 3), "vs_cpp": vs_cpp and round(vs_cpp, 3)}
            if speed is not None:
                ratios[name]["speed_vs_fp32_paired"] = round(speed, 3)
            if vs_hash is not None:
                ratios[name]["vs_hash"] = round(vs_hash, 3)
    table = "\n".join(lines)
    result = {"keys": args.keys, "batch": args.batch, "dim": args.dim, "zipf": args.zipf, "group": args.group, "kinds": args.kinds,
              "repeats": args.repeats,
              "calls": args.calls, "isolate": args.isolate, "ns_per_id_median": {k: round(v, 1) for k, v in med.items()},
              "wall_ns_per_id_median": wall,
              "ratios": ratios, **extra}
    return table, result


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    times, extra = {}, {}
    if args.isolate:
        base = [sys.executable, os.path.abspath(__file__)] + [a for a in (argv or sys.argv[1:]) if a != "--isolate"]
        for rnd in range(args.repeats):
            for family in args.families:
                out = subprocess.run(base + ["--child", family], check=True, capture_output=True, text=True).stdout
                got = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
                for name, v in got["times"].items():
                    times.setdefault(name, []).extend(v)
                extra.update(got["extra"])
                print(f"[floor] round {rnd + 1}/{args.repeats} {family} done", flush=True)
    else:
        families = []
        for family in args.families:
            t0 = time.perf_counter()
            families.extend(build(args, family))
            print(f"[floor] {family}: built in {time.perf_counter() - t0:.1f}s", flush=True)
        quiet_gc()
        for fam in families:  # warm-up
            for fn in paths_of(fam, args).values():
                for b in group_starts(args):
                    fn(b)
        for rnd in range(args.repeats):
            run_round(families, args, times, first_call=rnd * args.calls)
            print(f"[floor] round {rnd + 1}/{args.repeats} done", flush=True)
        for fam in families:
            extra.update(fam.extra())
    table, result = summarize(args, times, extra)
    print(table)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
