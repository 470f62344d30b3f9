"""Peak extra memory of a table's export (save) and import (restore), as a multiple of the
table's own memory; with --rows, the peak RSS a table of each row format adds.

Builds a table of --keys keys (dim 16, Adam slots: the layout of the training benchmark),
then for each of export and import resets the process's peak RSS (/proc/self/clear_refs),
runs the op, and reports peak RSS minus the RSS before it. The export's outputs stay alive
(a save holds them while writing), so they count as extra; the import's inputs were alive
before it, so they do not.

    .venv/bin/python benchmarks/table_memory.py --keys 10000000
    .venv/bin/python benchmarks/table_memory.py --keys 2000000 --json   # what the slow test runs
    .venv/bin/python benchmarks/table_memory.py --rows int8 --keys 3900000 --dim 32 --json

--rows FORMAT: in this process, the peak RSS (VmHWM) once a table of --keys keys, dim --dim,
stored as FORMAT, has been trained by Adam in batches of 65,536 new keys (one training update
each), minus the RSS before the table was made. Run one format per process.

Exit codes: 0 done, 2 bad usage, 1 failure (e.g. not Linux: needs /proc/self/clear_refs).
"""
import argparse
import json
import sys


def rss_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current RSS


def measure(num_keys, dim=16, batch=1_000_000):
    import numpy as np

    import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
    from ttf._ops import ops

    table = ops().ttf_embedding_table(dim=dim, initializer="uniform", seed=1, shared_name="table_memory")
    for start in range(0, num_keys, batch):
        keys = np.arange(start, min(start + batch, num_keys), dtype=np.int64) * 2654435761
        ops().ttf_table_find_or_insert(table, keys, dim=dim)
        ops().ttf_table_apply_adam(table, keys, np.ones((len(keys), dim), np.float32), 0.001, 0.9, 0.999, 1e-7, 1)
    del keys
    table_bytes = int(ops().ttf_table_stats(table).memory_bytes)

    def peak_extra(fn):
        before = rss_kib("VmRSS")
        reset_peak()
        result = fn()
        return result, (rss_kib("VmHWM") - before) * 1024

    exported, export_extra = peak_extra(lambda: ops().ttf_table_export(table))
    export_bytes = sum(t.numpy().nbytes for t in exported[:5])
    _, import_extra = peak_extra(lambda: ops().ttf_table_import(table, *exported))
    assert int(ops().ttf_table_size(table)) == num_keys
    return {"keys": num_keys, "dim": dim, "table_bytes": table_bytes, "export_output_bytes": export_bytes,
            "export_peak_extra_bytes": export_extra, "export_ratio": export_extra / table_bytes,
            "import_peak_extra_bytes": import_extra, "import_ratio": import_extra / table_bytes}


def measure_rows(rows, num_keys, dim, batch=65_536):
    """The peak RSS a table of `rows` adds (bytes), with its memory_bytes and per-key figures."""
    import numpy as np

    import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
    from ttf._ops import ops

    grads = np.full((batch, dim), 0.01, np.float32)
    before = rss_kib("VmRSS")
    reset_peak()
    table = ops().ttf_embedding_table(dim=dim, initializer="uniform", seed=1, rows=rows, shared_name="rows_memory")
    for step, start in enumerate(range(0, num_keys, batch), 1):
        keys = np.arange(start, min(start + batch, num_keys), dtype=np.int64) * 2654435761
        ops().ttf_table_apply_adam(table, keys, grads[:len(keys)], 0.001, 0.9, 0.999, 1e-7, step)
    assert int(ops().ttf_table_size(table)) == num_keys
    added = (rss_kib("VmHWM") - before) * 1024
    table_bytes = int(ops().ttf_table_stats(table).memory_bytes)
    return {"rows": rows, "keys": num_keys, "dim": dim, "peak_rss_added_bytes": added,
            "peak_rss_added_per_key": added / num_keys, "table_bytes": table_bytes,
            "table_bytes_per_key": table_bytes / num_keys}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: %(prog)s --keys 10000000")
    parser.add_argument("--keys", type=int, default=10_000_000, help="keys in the table (default 10,000,000)")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    parser.add_argument("--rows", choices=["fp32", "bf16", "int8"], default=None,
                        help="measure the peak RSS a table of this row format adds instead")
    parser.add_argument("--dim", type=int, default=32, help="row width with --rows (default 32)")
    args = parser.parse_args(argv)
    if args.keys < 1:
        parser.error(f"--keys must be >= 1, got {args.keys}")
    if args.rows:
        r = measure_rows(args.rows, args.keys, args.dim)
        print(json.dumps(r) if args.json else
              f"{r['rows']}: {r['keys']:,} keys, dim {r['dim']} + Adam: peak RSS added "
              f"{r['peak_rss_added_bytes'] / (1 << 20):,.0f} MiB ({r['peak_rss_added_per_key']:.0f} bytes a key)")
        return 0
    try:
        r = measure(args.keys)
    except (OSError, RuntimeError) as err:
        print(f"table_memory: failed: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(r))
        return 0
    gib = 1 << 30
    print(f"table: {r['keys']:,} keys, dim {r['dim']} + Adam slots, {r['table_bytes'] / gib:.2f} GiB")
    print(f"export: peak extra {r['export_peak_extra_bytes'] / gib:.2f} GiB = {r['export_ratio']:.2f}x the table "
          f"(outputs {r['export_output_bytes'] / gib:.2f} GiB)")
    print(f"import: peak extra {r['import_peak_extra_bytes'] / gib:.2f} GiB = {r['import_ratio']:.2f}x the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
