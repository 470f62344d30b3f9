"""Seeded fuzzer of every ttf op: random shapes, dtypes and values (empty, huge, negative,
NaN, mismatched), and threads racing on one table (lookup, apply, import, export, evict).

Case i draws everything from numpy's generator seeded with (seed, i), so a case reruns
alone, bit for bit: `--first i --cases 1`. Cases run in subprocesses, a batch per
subprocess; a batch that crashes (a signal, an abort) or hangs (no case finishes within
--timeout seconds) is rerun case by case from the first unfinished case, each in its own
subprocess, so every crash and hang is attributed to one case.

Outcomes per case: ok (every op call ran), invalid (an op refused its input with
InvalidArgument, or its Python wrapper refused it with TypeError/ValueError), other (some
call ended in another error type: counted by type, e.g. NotFound after a racing destroy,
Aborted when an import changes the slot layout under an update), crash, hang.

    python tests/fuzz/fuzz_ops.py --cases 10000 --seed 1            # the full run (benchmarks/results/fuzz.md)
    python tests/fuzz/fuzz_ops.py --cases 200 --seed 0 --batch 100  # a quick check
    python tests/fuzz/fuzz_ops.py --first 4242 --cases 1 --seed 1 -v # one case, its calls shown

Exit codes: 0 no crash and no hang, 1 crashes or hangs found, 2 bad usage.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

RACE_EVERY = 4  # every 4th case races threads on one table: 25% of the cases
GROUPS = ("table", "lookup", "ragged", "grad", "find", "small_ops", "evict", "export", "import", "remove",
          "apply", "precision", "criteo", "destroy", "checkpoint")
HERE = os.path.dirname(os.path.abspath(__file__))
SSD_DIR = tempfile.mkdtemp(prefix="ttf-fuzz-ssd-")  # tiered tables' files (unlinked at once: it stays empty)


# ------------------------------------------------------------------ value generators

def pick(rng, options):
    return options[int(rng.integers(len(options)))]


def rand_ints(rng, shape):
    """int64 values of one flavour: small, huge (near +-2^63), negative, or mixed."""
    import numpy as np
    kind = int(rng.integers(4))
    if kind == 0:
        return rng.integers(0, 50, size=shape, dtype=np.int64)
    if kind == 1:
        return rng.integers(-(1 << 63), (1 << 63) - 1, size=shape, dtype=np.int64, endpoint=True)
    if kind == 2:
        return -rng.integers(0, 1000, size=shape, dtype=np.int64)
    return rng.choice(np.array([0, -1, 1, 2**31, -(2**31), 2**62, -(2**63), 2**63 - 1], np.int64), size=shape)


def rand_floats(rng, shape):
    import numpy as np
    kind = int(rng.integers(5))
    if kind == 0:
        return rng.normal(size=shape).astype(np.float32)
    if kind == 1:
        return np.zeros(shape, np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45, 0.0, -0.0, 1.0], np.float32)
    return rng.choice(specials, size=shape).astype(np.float32)


def rand_scalar_float(rng):
    return float(pick(rng, [0.0, -1.0, 1.0, 0.1, 0.9, 0.999, 1e-7, float("nan"), float("inf"), -float("inf"),
                            1e30, -0.5, 2.0]))


def rand_shape(rng, rank=None, max_dim=6):
    rank = int(rng.integers(0, 4)) if rank is None else rank
    dims = []
    for _ in range(rank):
        dims.append(0 if rng.random() < 0.12 else int(rng.integers(1, max_dim + 1)))
    return tuple(dims)


def maybe_wrong(rng, value, p=0.1):
    """Sometimes the wrong dtype or rank for an input (the wrapper or the kernel must refuse it)."""
    import numpy as np
    r = rng.random()
    if r < p / 3:
        return np.asarray(value).astype(np.float32) if np.asarray(value).dtype != np.float32 else np.asarray(
            value).astype(np.int64)
    if r < 2 * p / 3:
        return np.asarray(value).reshape(-1)[:0].reshape((0, 1)) if np.asarray(value).size else [[1]]
    if r < p:
        return "a string"
    return value


# ------------------------------------------------------------------ one case

class Case:
    """Runs one case's op calls, classifying each call's outcome."""

    def __init__(self, index, seed, verbose=False):
        import numpy as np
        self.index = index
        self.rng = np.random.default_rng([seed, index])
        self.verbose = verbose
        self.outcomes = collections.Counter()
        self.messages = {}  # result -> the first "call: message" of that outcome, for other:* results
        self.lock = threading.Lock()

    def call(self, name, fn, *args, **kwargs):
        import tensorflow as tf
        try:
            fn(*args, **kwargs)
            result = "ok"
        except tf.errors.InvalidArgumentError:
            result = "invalid"
        except (TypeError, ValueError, OverflowError):  # the generated wrapper's own argument checks
            result = "invalid"
        except tf.errors.OpError as err:
            result, message = f"other:{type(err).__name__}", f"{name}: {err.message}"
        except Exception as err:  # noqa: BLE001  (anything else is reported, never hidden)
            result, message = f"other:python {type(err).__name__}", f"{name}: {err}"
        if self.verbose:
            print(f"  {name}: {result}", flush=True)
        with self.lock:
            self.outcomes[result] += 1
            if result.startswith("other:"):  # a rare race is diagnosable only by its message
                self.messages.setdefault(result, message[:500])
        return result

    # --- helpers
    def table(self, dim=None, valid=True, **attrs):
        from ttf._ops import ops
        rng = self.rng
        cfg = dict(dim=dim or int(pick(rng, [1, 2, 4, 8, 16])), initializer=pick(rng, ["uniform", "normal", "zeros",
                                                                                       "constant"]),
                   init_a=-0.1, init_b=0.1, seed=int(rng.integers(0, 100)),
                   admission_min_count=int(pick(rng, [0, 0, 1, 2, 3])), num_shards=int(pick(rng, [1, 2, 16, 64])),
                   max_candidates=int(pick(rng, [1, 8, 1000, 4194304])),
                   capacity=int(pick(rng, [0, 0, 1, 7, 100])),
                   shared_name=f"fuzz_{self.index}_{rng.integers(1 << 30)}")
        policy = pick(rng, ["lru", "lfu", "ttl"])
        cfg.update(evict_policy=policy, ttl_steps=int(pick(rng, [1, 2, 50])) if policy == "ttl" else 0)
        if cfg["admission_min_count"] > 0 and rng.random() < 0.4:  # admission counted in a count-min sketch
            cfg.update(admission_sketch_bytes=int(pick(rng, [cfg["num_shards"] * 512, 1 << 16, 1 << 20])))
        if rng.random() < 0.25:  # a capacity in bytes instead of rows: room for 1 to 50 Adam rows a shard
            row_bytes = 4 * 3 * cfg["dim"] + 40
            cfg.update(capacity=0, capacity_bytes=cfg["num_shards"] * row_bytes * int(pick(rng, [1, 3, 50])))
        elif rng.random() < 0.3:  # a DRAM + SSD tier (with the capacity and policy drawn above)
            cfg.update(dram_budget=int(pick(rng, [1, 100, 4096, 1 << 20])), ssd_dir=SSD_DIR)
        if rng.random() < 0.4:  # compressed rows (with the tier too)
            cfg.update(rows=pick(rng, ["bf16", "int8"]))
        cfg.update(attrs)
        if not valid:
            key = pick(rng, ["dim", "num_shards", "init_a", "init_b", "default_value", "max_candidates",
                             "admission_min_count", "seed", "capacity", "ttl_steps", "dram_budget", "ssd_dir",
                             "admission_sketch_bytes", "capacity_bytes", "rows"])
            if key == "rows":  # not a row format
                cfg.update(rows=pick(rng, ["int4", "fp16", "INT8", ""]))
            elif key == "ssd_dir":
                cfg.update(dram_budget=4096, ssd_dir=pick(rng, ["/nonexistent/ttf", "/proc", ""]))
            elif key == "capacity_bytes":  # below a row a shard, with a row capacity, or with a tier
                cfg.update(pick(rng, [dict(capacity_bytes=1), dict(capacity_bytes=1 << 20, capacity=7),
                                      dict(capacity_bytes=1 << 20, dram_budget=1 << 20, ssd_dir=SSD_DIR)]))
            else:
                cfg[key] = pick(rng, [0, -1, 2**62, 2**31, 4097, 5000, float("nan"), float("inf"), -(2**63)])
        return ops().ttf_embedding_table(**cfg), cfg

    def ids(self, n=None):
        n = int(self.rng.integers(0, 300)) if n is None else n
        return rand_ints(self.rng, (n,))

    def snapshot(self, dim):
        """Import inputs: sometimes a valid export layout, sometimes broken in one way."""
        import numpy as np
        rng = self.rng
        optimizer, slots = pick(rng, [("", 0), ("sgd", 0), ("adagrad", 1), ("adam", 2), ("ftrl", 2)])
        n, m = int(rng.integers(0, 60)), int(rng.integers(0, 10))
        keys = rng.permutation(np.arange(-n, 3 * n, dtype=np.int64))[:n] * int(pick(rng, [1, 7919, 2**40]))
        snap = dict(keys=keys, values=rand_floats(rng, (n, dim * (1 + slots))) if rng.random() < 0.5 else
                    np.ones((n, dim * (1 + slots)), np.float32),
                    meta=rng.integers(0, 10, (n, 2)), candidate_keys=np.arange(10**6, 10**6 + m, dtype=np.int64),
                    candidate_meta=rng.integers(0, 10, (m, 2)), optimizer=optimizer,
                    slot_init=np.full(slots, 0.1, np.float32), step=int(rng.integers(0, 100)))
        if rng.random() < 0.4:  # break one thing
            field = pick(rng, list(snap))
            value = snap[field]
            if field == "optimizer":
                snap[field] = pick(rng, ["rmsprop", "adam", "", "x" * 1000])
            elif field == "step":
                snap[field] = pick(rng, [-1, -(2**63), 2**63 - 1])
            elif isinstance(value, np.ndarray) and value.dtype == np.int64:
                snap[field] = rand_ints(rng, rand_shape(rng, value.ndim) if rng.random() < 0.5 else value.shape)
            else:
                snap[field] = rand_floats(rng, rand_shape(rng, max(value.ndim, 1)))
        return snap

    def import_(self, h, dim, **attrs):
        import numpy as np
        from ttf._ops import ops
        snap = self.snapshot(dim)
        fields = ("keys", "values", "meta", "candidate_keys", "candidate_meta", "optimizer", "slot_init", "step")
        if self.rng.random() < 0.3:
            attrs.update(num_partitions=int(pick(self.rng, [1, 2, 3, 0, -1])),
                         partition=int(pick(self.rng, [0, 1, 2, 5, -1])))
        if self.rng.random() < 0.3:
            attrs["merge"] = True
        if self.rng.random() < 0.3:  # a checkpoint's stored words (random bits) under a real, bad or no tag
            rows = pick(self.rng, ["int8", "bf16"])
            words = (dim + 11) // 4 if rows == "int8" else (dim + 1) // 2
            tag = pick(self.rng, [f"rows={rows} dim={dim} optimizer= slots= words={words}", "", "rows=int4",
                                  f"rows={rows} dim={dim + 1} optimizer= slots= words={words}", ["a", "b"]])
            if self.rng.random() < 0.7:
                bits = self.rng.integers(0, 1 << 32, (np.size(snap["keys"]), words), dtype=np.uint64)
                snap["values"] = bits.astype(np.uint32).view(np.float32)
            return self.call("import stored", ops().ttf_table_import_stored, h, *(snap[f] for f in fields), tag,
                             **attrs)
        return self.call("import", ops().ttf_table_import, h, *(snap[f] for f in fields), **attrs)

    def apply(self, h, dim, n=None):
        from ttf._ops import ops
        rng = self.rng
        opt = pick(rng, ["sgd", "adagrad", "adam", "ftrl"])
        n = int(rng.integers(0, 200)) if n is None else n
        keys = self.ids(n)
        grads = rand_floats(rng, (n, dim)) if rng.random() < 0.3 else rng.normal(size=(n, dim)).astype("float32")
        good = {"sgd": [0.1], "adagrad": [0.1, 1e-7], "adam": [0.01, 0.9, 0.999, 1e-7],
                "ftrl": [0.1, -0.5, 0.0, 0.0, 0.0, 0.1]}[opt]
        scalars = [rand_scalar_float(rng) if rng.random() < 0.2 else v for v in good]
        step = int(pick(rng, [1, 2, 5, 100, 0, -1, 2**62])) if rng.random() < 0.3 else int(rng.integers(1, 50))
        if rng.random() < 0.1:
            grads = maybe_wrong(rng, grads, p=1.0)
        attrs = {}
        if opt in ("adagrad", "ftrl") and rng.random() < 0.2:
            attrs["initial_accumulator_value"] = rand_scalar_float(rng)
        return self.call(f"apply_{opt}", getattr(ops(), f"ttf_table_apply_{opt}"), h, keys, grads, *scalars, step,
                         **attrs)

    # --- op groups (single-threaded)
    def run_group(self, group):
        import numpy as np
        import tensorflow as tf
        from ttf._ops import ops
        rng = self.rng
        if group == "table":
            self.call("table", lambda: self.table(valid=rng.random() < 0.3))
            return
        if group == "precision":
            self.precision()
            return
        if group == "criteo":
            self.criteo()
            return
        if group == "checkpoint":
            self.checkpoint()
            return
        if group == "grad":
            n, u, d = int(rng.integers(0, 50)), int(rng.integers(0, 20)), int(pick(rng, [0, 1, 4, 5000]))
            inverse = rng.integers(-2, u + 2, n).astype(np.int32) if rng.random() < 0.3 else rng.integers(
                0, max(u, 1), n).astype(np.int32)
            grads = rand_floats(rng, (n, d) if rng.random() < 0.8 else rand_shape(rng))
            if rng.random() < 0.05:
                grads = tf.zeros([0, 2**40])
            self.call("grad", ops().ttf_embedding_grad, grads, maybe_wrong(rng, inverse), self.ids(u))
            return
        dim = int(pick(rng, [1, 2, 4, 8]))
        h, _ = self.table(dim)
        if rng.random() < 0.5:  # some content first
            self.call("find_or_insert", ops().ttf_table_find_or_insert, h, self.ids(), dim=dim)
            self.apply(h, dim)
        wrong_dim = dim if rng.random() < 0.8 else int(pick(rng, [1, 3, 2**40]))
        if group == "lookup":
            ids = rand_ints(rng, rand_shape(rng, max_dim=40))
            self.call("lookup", ops().ttf_embedding_lookup, h, maybe_wrong(rng, ids), dim=wrong_dim,
                      training=bool(rng.random() < 0.7))
        elif group == "ragged":
            values = self.ids(int(rng.integers(0, 40)))
            if rng.random() < 0.6:
                cuts = np.sort(rng.integers(0, len(values) + 1, int(rng.integers(0, 6))))
                splits = np.concatenate([[0], cuts, [len(values)]]).astype(np.int64)
            else:
                splits = rand_ints(rng, rand_shape(rng, int(pick(rng, [0, 1, 1, 2]))))
            self.call("ragged", ops().ttf_embedding_lookup_ragged, h, values, maybe_wrong(rng, splits),
                      dim=wrong_dim, training=bool(rng.random() < 0.7), combiner=pick(rng, ["sum", "mean"]))
        elif group == "find":
            keys = maybe_wrong(rng, rand_ints(rng, rand_shape(rng, max_dim=300)))
            if rng.random() < 0.5:
                self.call("find_or_insert", ops().ttf_table_find_or_insert, h, keys, dim=wrong_dim)
            else:
                self.call("find", ops().ttf_table_find, h, keys, dim=wrong_dim, training=bool(rng.random() < 0.5))
        elif group == "small_ops":
            self.call("size", ops().ttf_table_size, h)
            self.call("stats", ops().ttf_table_stats, h)
            self.call("tier_stats", ops().ttf_table_tier_stats, h)
            self.call("deleted_keys", ops().ttf_table_deleted_keys, h, reset=bool(rng.random() < 0.5))
            self.call("summary", ops().ttf_table_summary, h)
        elif group == "evict":
            self.call("evict", ops().ttf_table_evict, h, maybe_wrong(rng, rand_ints(rng, rand_shape(rng, 0))),
                      rand_ints(rng, rand_shape(rng, 0 if rng.random() < 0.8 else 1)))
        elif group == "export":
            if rng.random() < 0.3:
                self.save(h)
            elif rng.random() < 0.5:
                self.call("export", ops().ttf_table_export, h, reset_deleted=bool(rng.random() < 0.5))
            else:
                self.call("export_delta", ops().ttf_table_export_delta, h,
                          maybe_wrong(rng, rand_ints(rng, rand_shape(rng, 0))))
        elif group == "import":
            self.import_(h, dim)
            self.call("export", ops().ttf_table_export, h)
        elif group == "remove":
            self.call("remove", ops().ttf_table_remove, h, maybe_wrong(rng, self.ids()))
        elif group == "apply":
            self.apply(h, dim)
            self.apply(h, dim)
        elif group == "destroy":
            self.call("destroy", ops().ttf_table_destroy, h, ignore_lookup_error=bool(rng.random() < 0.5))
            self.call("destroy again", ops().ttf_table_destroy, h, ignore_lookup_error=bool(rng.random() < 0.5))
            self.call("size after destroy", ops().ttf_table_size, h)

    def precision(self):
        import numpy as np
        import tensorflow as tf
        from ttf._ops import ops
        rng = self.rng
        attrs = dict(warmup_steps=int(pick(rng, [0, 1, 5, 100])), decay=rand_scalar_float(rng),
                     spike_k=rand_scalar_float(rng), calm_k=rand_scalar_float(rng),
                     calm_steps=int(pick(rng, [1, 2, 10])), hold_steps=int(pick(rng, [0, 1, 100])),
                     min_relative_deviation=rand_scalar_float(rng), shared_name=f"fuzz_prec_{self.index}")
        handle = []
        if self.call("precision switch", lambda: handle.append(ops().ttf_precision_switch(**attrs))) != "ok":
            return
        h = handle[0]
        dtype = pick(rng, [tf.float32, tf.float64, tf.float16, tf.bfloat16])
        for step in range(int(rng.integers(1, 30))):
            loss = tf.cast(rand_floats(rng, ()) if rng.random() < 0.3 else rng.random() + 0.5, dtype)
            s = int(pick(rng, [step, -1, 2**63 - 1])) if rng.random() < 0.1 else step
            self.call("precision update", ops().ttf_precision_switch_update, h, loss, s)
        self.call("precision read", ops().ttf_precision_switch_read, h)
        exported = []
        self.call("precision export", lambda: exported.append(ops().ttf_precision_switch_export(h)))
        if exported and rng.random() < 0.5:
            stats, counters = exported[0]
            self.call("precision import", ops().ttf_precision_switch_import, h, stats, counters)
        else:
            self.call("precision import (random)", ops().ttf_precision_switch_import, h,
                      rand_floats(rng, rand_shape(rng, 1, 10)).astype(np.float64),
                      rand_ints(rng, rand_shape(rng, 1, 10)))

    def criteo(self):
        import numpy as np
        from ttf._ops import ops
        rng = self.rng
        lines = []
        for _ in range(int(rng.integers(0, 8))):
            fields = [str(int(rng.integers(0, 2)))] + [
                pick(rng, ["", "0", "-3", "12", "1e5", "1e400", "nan", "x", "+", "9" * 30]) for _ in range(13)] + [
                pick(rng, ["", "68fd1e64", "zz", "0" * 40, "\x00", "\xff"]) for _ in range(26)]
            if rng.random() < 0.3:
                fields = fields[: int(rng.integers(0, len(fields)))]
            line = pick(rng, ["\t", ","]).join(fields)
            if rng.random() < 0.1:
                line = bytes(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8)).decode("latin-1")
            lines.append(line.encode("latin-1", "replace"))
        numbers = np.arange(1, len(lines) + 1, dtype=np.int64)
        if rng.random() < 0.2:
            numbers = rand_ints(rng, rand_shape(rng, 1))
        names = "f.txt" if rng.random() < 0.7 else [b"a"] * int(rng.integers(0, 10))
        import ttf
        from ttf.data._reader import _op_attrs
        schema = pick(rng, [ttf.data.CRITEO, ttf.data.AVAZU])
        self.call("parse lines", ops().ttf_parse_lines, np.array(lines, dtype=object), names, numbers,
                  strict=bool(rng.random() < 0.5), **_op_attrs(schema))

    def checkpoint(self):
        """A checkpoint folder (full + delta, 2 shards) damaged one way: a file truncated, bits
        flipped, a file removed, or a chain file that is garbage or names a file outside the
        folder. Restoring it must succeed or raise one clear error (ValueError naming the
        file or entry), and touch nothing outside the folder."""
        import shutil
        import numpy as np
        import tensorflow as tf
        import ttf
        rng = self.rng
        case_dir = os.path.join(_sandbox(), f"case-{self.index}")
        folder, outside = os.path.join(case_dir, "ckpt"), os.path.join(case_dir, "outside")
        shutil.copytree(_checkpoint_template(), folder)
        shutil.copytree(_checkpoint_template(), outside)  # what a traversal entry would name
        before = _listing(case_dir)
        files = sorted(os.listdir(folder))
        damage = pick(rng, ["truncate", "flip", "remove", "chain"])
        target = os.path.join(folder, pick(rng, files))
        if damage == "truncate":
            with open(target, "rb+") as f:
                f.truncate(int(rng.integers(0, max(os.path.getsize(target), 1))))
        elif damage == "flip":
            raw = bytearray(open(target, "rb").read())
            for _ in range(int(rng.integers(1, 4))):
                if raw:
                    raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
            open(target, "wb").write(bytes(raw))
        elif damage == "remove":
            os.remove(target)
        else:
            entry = pick(rng, ["../outside/ckpt-1", os.path.join(outside, "ckpt-1"), "/etc/passwd", "..", "",
                               "ckpt-1/../../outside/ckpt-1", "delta-2\x00", 17, None, ["ckpt-1"]])
            chain = pick(rng, [{"full": entry, "deltas": []}, {"full": "ckpt-1", "deltas": [entry]},
                               bytes(rng.integers(0, 256, int(rng.integers(0, 60)), dtype=np.uint8)).decode("latin-1")])
            with open(os.path.join(folder, "ttf_chain.json"), "w", encoding="latin-1") as f:
                f.write(chain if isinstance(chain, str) else json.dumps(chain))

        def restore():
            layer = ttf.DynamicEmbedding(4, seed=3, admission_min_count=2, shard_devices=["/cpu:0"] * 3, name="emb")
            layer(tf.constant([[0, 0]], tf.int64))
            try:
                ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer), folder, full_every=3).restore_latest()
            except FileNotFoundError as err:  # the chain's full checkpoint is gone: named in the message
                raise ValueError(str(err)) from None

        self.call(f"restore ({damage})", restore)
        after = _listing(case_dir)
        outside_changes = sorted(name for name in set(before) | set(after)
                                 if not name.startswith("ckpt" + os.sep) and name != "ckpt"
                                 and before.get(name) != after.get(name))
        self.call("nothing touched outside the folder", _check_untouched, outside_changes)
        shutil.rmtree(case_dir, ignore_errors=True)

    def save(self, h):
        """TtfTableSave (the streamed checkpoint writer) into a scratch folder: random piece
        sizes, full or delta, sometimes a broken input (prefix, since_step, piece_bytes), half
        the time committed (TtfTableCommitSave)."""
        from ttf._ops import ops
        rng = self.rng
        scratch = f"save-{self.index}-{rng.integers(1 << 30)}-"
        prefix = os.path.join(SSD_DIR, scratch)
        since = int(pick(rng, [-1, 0, 5, -7, -(2**63)]))
        args = dict(delta=bool(rng.random() < 0.5), piece_bytes=int(pick(rng, [1, 100, 4096, 64 << 20, 0, -5])))
        bad = rng.random()
        if bad < 0.1:
            prefix = pick(rng, ["", ["a", "b"], "/nonexistent/dir/x"])
        self.call("save", ops().ttf_table_save, h, prefix, "t/ttf/src-0", since, **args)
        if rng.random() < 0.5:  # the save's commit: forgets the deleted keys it took
            self.call("commit save", ops().ttf_table_commit_save, h)
        for name in os.listdir(SSD_DIR):  # the bundles are the fuzzer's, not the table's: keep the folder empty
            if name.startswith(scratch):
                os.remove(os.path.join(SSD_DIR, name))

    # --- racing threads on one table
    def race(self):
        from ttf._ops import ops
        rng = self.rng
        dim = int(pick(rng, [4, 8, 1, 2, 16]))
        h, _ = self.table(dim)
        self.call("seed rows", ops().ttf_table_find_or_insert, h, self.ids(500), dim=dim)
        kinds = ["lookup", "ragged", "apply", "import", "export", "evict", "delta", "remove", "find", "stats", "save"]
        chosen = [pick(rng, kinds) for _ in range(int(rng.integers(3, 7)))]
        chosen += ["apply", "import"] if rng.random() < 0.5 else ["export"]
        iterations = int(rng.integers(3, 12))
        # Each thread gets its own generator (seeded from the case), so the calls are reproducible
        # up to thread interleaving.
        import numpy as np
        seeds = rng.integers(0, 2**32, len(chosen))
        destroy_at = int(rng.integers(0, iterations)) if rng.random() < 0.1 else -1

        def worker(kind, seed):
            local = Case(self.index, 0)
            local.rng = np.random.default_rng(seed)
            local.outcomes = self.outcomes
            local.messages = self.messages
            local.lock = self.lock
            local.verbose = self.verbose
            for it in range(iterations):
                if kind == "lookup":
                    local.call("race lookup", ops().ttf_embedding_lookup, h, local.ids(), dim=dim)
                elif kind == "ragged":
                    values = local.ids(40)
                    local.call("race ragged", ops().ttf_embedding_lookup_ragged, h, values, [0, 10, 10, 40], dim=dim)
                elif kind == "apply":
                    local.apply(h, dim, 100)
                elif kind == "import":
                    local.import_(h, dim)
                elif kind == "export":
                    local.call("race export", ops().ttf_table_export, h, reset_deleted=bool(local.rng.random() < 0.3))
                elif kind == "save":
                    local.save(h)
                elif kind == "delta":
                    local.call("race delta", ops().ttf_table_export_delta, h, int(local.rng.integers(-1, 20)))
                elif kind == "evict":
                    local.call("race evict", ops().ttf_table_evict, h, int(local.rng.integers(0, 20)),
                               int(local.rng.integers(0, 3)))
                elif kind == "remove":
                    local.call("race remove", ops().ttf_table_remove, h, local.ids(50))
                elif kind == "find":
                    local.call("race find", ops().ttf_table_find, h, local.ids(), dim=dim)
                elif kind == "stats":
                    local.call("race stats", ops().ttf_table_stats, h)
                    local.call("race deleted", ops().ttf_table_deleted_keys, h, reset=bool(local.rng.random() < 0.5))
                if it == destroy_at and kind == chosen[0]:
                    local.call("race destroy", ops().ttf_table_destroy, h)

        threads = [threading.Thread(target=worker, args=(kind, seed)) for kind, seed in zip(chosen, seeds)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def run(self):
        racing = self.index % RACE_EVERY == 0
        group = "race" if racing else GROUPS[int(self.rng.integers(len(GROUPS)))]
        if self.verbose:
            print(f"case {self.index}: {group}", flush=True)
        if racing:
            self.race()
        else:
            self.run_group(group)
        return group, racing


_CHECKPOINT = {}


def _sandbox():
    """A temporary folder for this worker's checkpoint cases, removed when it exits."""
    if "sandbox" not in _CHECKPOINT:
        import atexit
        import shutil
        import tempfile
        _CHECKPOINT["sandbox"] = tempfile.mkdtemp(prefix="ttf_fuzz_ckpt_")
        atexit.register(shutil.rmtree, _CHECKPOINT["sandbox"], True)
    return _CHECKPOINT["sandbox"]


def _checkpoint_template():
    """A full checkpoint and a delta of a 2-shard table (Adam slots, candidates, an eviction),
    written once per worker."""
    if "template" not in _CHECKPOINT:
        import numpy as np
        import tensorflow as tf
        import ttf
        folder = os.path.join(_sandbox(), "template")
        layer = ttf.DynamicEmbedding(4, seed=3, admission_min_count=2, shard_devices=["/cpu:0"] * 2, name="emb")
        optimizer = ttf.optimizers.Adam(0.05)
        manager = ttf.checkpoint.CheckpointManager(tf.train.Checkpoint(layer=layer), folder, full_every=3)
        rng = np.random.default_rng(0)
        for step in (1, 2):
            for _ in range(2):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(layer(tf.constant(rng.integers(0, 40, (16, 2))), training=True))
                optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                                              layer.trainable_variables))
            if step == 2:
                layer.evict(min_count=3)
            manager.save(step)
        _CHECKPOINT["template"] = folder
    return _CHECKPOINT["template"]


def _listing(directory):
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            stat = os.stat(path)
            out[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns)
    return out


def _check_untouched(changes):
    if changes:
        raise RuntimeError(f"files outside the checkpoint folder changed: {changes}")


def classify(outcomes):
    others = sorted(k for k in outcomes if k.startswith("other:"))
    if others:
        return "other", others
    return ("invalid" if outcomes.get("invalid") else "ok"), []


# ------------------------------------------------------------------ worker and driver

def worker_main(seed, first, count, verbose):
    """Runs cases first .. first+count-1 in this process, one JSON line per finished case."""
    import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
    from ttf._ops import ops
    ops()
    print(json.dumps({"ready": True}), flush=True)
    # The harness's own tests: a crash on purpose before case ABORT_AT, or after case
    # ABORT_AFTER's record (a process that fails on its way out).
    abort_at = int(os.environ.get("TTF_FUZZ_ABORT_AT", "-1"))
    abort_after = int(os.environ.get("TTF_FUZZ_ABORT_AFTER", "-1"))
    for index in range(first, first + count):
        if index == abort_at:
            os.abort()
        case = Case(index, seed, verbose)
        group, racing = case.run()
        kind, others = classify(case.outcomes)
        print(json.dumps({"case": index, "group": group, "racing": racing, "kind": kind, "others": others,
                          "messages": case.messages,
                          "calls": sum(case.outcomes.values())}), flush=True)
        if index == abort_after:
            os.abort()


def run_batch(seed, first, count, timeout, verbose=False):
    """Runs a batch in a subprocess. Returns (finished case records, failure or None) where a
    failure is ("crash", signal/exit code, stderr tail) or ("hang", None, stderr tail) for the
    first unfinished case."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed), "--first", str(first),
           "--cases", str(count)] + (["-v"] if verbose else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    records, failure = [], None
    stderr_tail = collections.deque(maxlen=30)
    threading.Thread(target=lambda: [stderr_tail.append(line) for line in proc.stderr], daemon=True).start()
    lines = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in proc.stdout], daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout + 120  # start-up (TensorFlow import) gets 2 extra minutes
    seen = 0
    while True:
        while seen < len(lines):
            line = lines[seen]
            seen += 1
            if verbose and not line.startswith("{"):
                print(line, end="")
            if line.startswith("{"):
                rec = json.loads(line)
                if "case" in rec:
                    records.append(rec)
                deadline = time.monotonic() + timeout
        if proc.poll() is not None:
            reader.join(5)
            if seen < len(lines):
                continue
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            failure = ("hang", None, "".join(stderr_tail))
            break
        time.sleep(0.05)
    if failure is None and proc.returncode != 0:
        failure = ("crash", proc.returncode, "".join(stderr_tail))
    if failure is None and len(records) < count:
        failure = ("crash", proc.returncode, "".join(stderr_tail))
    return records, failure


def run_alone(seed, index, timeout, verbose=False):
    """Runs one case in a process of its own: (its record, None), or (None, failure) when the
    process crashed or hung, before or after the case's record (a process that fails on its
    way out fails its case: the case is counted once, as that failure)."""
    records, failure = run_batch(seed, index, 1, timeout, verbose)
    if failure is not None:
        return None, failure
    return records[0], None


def run(cases, seed, first=0, batch=200, timeout=60.0, verbose=False, log=print):
    """Runs cases first .. first+cases-1; returns the summary dict."""
    summary = {"cases": 0, "racing": 0, "ok": 0, "invalid": 0, "other": 0, "crash": 0, "hang": 0,
               "other_types": collections.Counter(), "other_messages": {}, "groups": collections.Counter(),
               "failures": [],
               "seed": seed, "first": first}
    start = time.monotonic()

    def record(rec):
        summary["cases"] += 1
        summary["racing"] += rec["racing"]
        summary[rec["kind"]] += 1
        summary["groups"][rec["group"]] += 1
        for o in rec["others"]:
            key = o[len("other:"):] + " in " + rec["group"]
            summary["other_types"][key] += 1
            summary["other_messages"].setdefault(key, f"case {rec['case']}: " + rec.get("messages", {}).get(o, ""))

    def fail(index, kind, code, tail):
        summary["cases"] += 1
        summary[kind] += 1
        summary["racing"] += index % RACE_EVERY == 0
        summary["failures"].append({"case": index, "kind": kind, "code": code, "stderr": tail[-2000:]})
        log(f"[fuzz] case {index}: {kind} (exit {code}); rerun: python {os.path.relpath(__file__)} --seed {seed} "
            f"--first {index} --cases 1 -v")

    next_case, end = first, first + cases
    while next_case < end:
        count = min(batch, end - next_case)
        records, failure = run_batch(seed, next_case, count, timeout, verbose)
        if failure is not None and len(records) == count:
            records.pop()  # every case finished, then the process failed: its last case is rerun alone
        for rec in records:
            record(rec)
        done = next_case + len(records)
        if failure is not None:
            # Rerun the unfinished cases one per process: the failing one is the one that fails
            # alone. Each case is counted once: a case whose process fails after its record
            # (on its way out) counts as that failure only, not also as finished.
            for index in range(done, next_case + count):
                one, one_failure = run_alone(seed, index, timeout, verbose)
                if one_failure is None:
                    record(one)
                else:
                    fail(index, one_failure[0], one_failure[1], one_failure[2])
        next_case += count
        log(f"[fuzz] {summary['cases']}/{cases} cases ({summary['racing']} racing): {summary['crash']} crashes, "
            f"{summary['hang']} hangs, {summary['other']} other errors, {time.monotonic() - start:.0f}s")
    summary["seconds"] = round(time.monotonic() - start, 1)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--first", type=int, default=0, help="index of the first case (default 0)")
    parser.add_argument("--batch", type=int, default=200, help="cases per subprocess (default 200)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a case may take before it counts as a hang (default 60)")
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON to PATH")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every op call's outcome")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cases < 1 or args.batch < 1 or args.first < 0 or args.timeout <= 0:
        parser.error("--cases and --batch must be >= 1, --first >= 0, --timeout > 0")
    if args.worker:
        worker_main(args.seed, args.first, args.cases, args.verbose)
        return 0
    summary = run(args.cases, args.seed, args.first, args.batch, args.timeout, args.verbose)
    others = ", ".join(f"{k}: {v}" for k, v in summary["other_types"].most_common())
    print(f"[fuzz] done: {summary['cases']} cases ({summary['racing']} racing), {summary['ok']} ok, "
          f"{summary['invalid']} refused with InvalidArgument, {summary['other']} with other errors "
          f"({others or 'none'}), {summary['crash']} crashes, {summary['hang']} hangs, {summary['seconds']}s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**summary, "other_types": dict(summary["other_types"]), "groups": dict(summary["groups"])},
                      out, indent=1)
    return 1 if summary["crash"] or summary["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
