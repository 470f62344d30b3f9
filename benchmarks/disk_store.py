"""Per-row cost of candidate disk stores for the DRAM + SSD tier (docs/tiers.md), on the rows
it moves: 216-byte records (dim 16 with Adam: key, count, last-seen + 48 floats), random keys.

- slot file (what ttf uses): a fixed-size record per slot, one pwrite per demoted row, one
  pread per row read back, key -> slot in RAM;
- append-only log with a write buffer (DeepRec's SSDHASH): demoted rows appended in one
  large write per batch (reads as above; compaction not counted);
- an embedded B-tree KV store: SQLite (in the Python standard library; RocksDB and LMDB are
  not installed on this machine), one transaction per batch, key -> blob.
Every path is driven from Python, so each per-row figure carries the same ~0.2-0.5 us of
interpreter overhead per call; the ratios are what matter. Example:
  .venv/bin/python benchmarks/disk_store.py --rows 200000 --dir /tmp/ttf-store
"""
import argparse
import json
import os
import sqlite3
import time

import numpy as np

RECORD = 216


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="rows written then read back (default 200,000)")
    p.add_argument("--batch", type=int, default=4096, help="rows per demotion batch (default 4096)")
    p.add_argument("--dir", default="/tmp/ttf-store", help="where the files go (default /tmp/ttf-store)")
    args = p.parse_args()
    if args.rows <= 0 or args.batch <= 0:
        p.error("--rows and --batch must be > 0")
    return args


def main():
    args = parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(0)
    keys = rng.permutation(args.rows).astype(np.int64) * 7919
    blob = rng.bytes(RECORD)
    order = rng.permutation(args.rows)
    result = {"rows": args.rows, "record_bytes": RECORD}

    path = os.path.join(args.dir, "slots")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    t0 = time.perf_counter()
    for slot in order:  # slots reused in any order: scattered writes
        os.pwrite(fd, blob, int(slot) * RECORD)
    t1 = time.perf_counter()
    for slot in rng.permutation(args.rows):
        os.pread(fd, RECORD, int(slot) * RECORD)
    t2 = time.perf_counter()
    result["slot_file_write_us_per_row"] = round((t1 - t0) / args.rows * 1e6, 2)
    result["slot_file_read_us_per_row"] = round((t2 - t1) / args.rows * 1e6, 2)
    os.close(fd)

    fd = os.open(path + ".log", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    t0 = time.perf_counter()
    for begin in range(0, args.rows, args.batch):
        os.write(fd, blob * min(args.batch, args.rows - begin))
    t1 = time.perf_counter()
    result["append_log_write_us_per_row"] = round((t1 - t0) / args.rows * 1e6, 2)
    os.close(fd)

    db = sqlite3.connect(os.path.join(args.dir, "kv.sqlite"))
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("DROP TABLE IF EXISTS kv")
    db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB)")
    t0 = time.perf_counter()
    for begin in range(0, args.rows, args.batch):
        with db:
            db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                           ((int(k), blob) for k in keys[begin:begin + args.batch]))
    t1 = time.perf_counter()
    cur = db.cursor()
    for k in rng.permutation(keys):
        cur.execute("SELECT v FROM kv WHERE k = ?", (int(k),)).fetchone()
    t2 = time.perf_counter()
    result["sqlite_write_us_per_row"] = round((t1 - t0) / args.rows * 1e6, 2)
    result["sqlite_read_us_per_row"] = round((t2 - t1) / args.rows * 1e6, 2)
    db.close()
    for name in ("slots", "slots.log", "kv.sqlite"):
        os.remove(os.path.join(args.dir, name))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
