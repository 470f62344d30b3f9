"""Parser throughput: lines/s of one parse-op call on blocks of synthetic lines.

Times process CPU seconds (not wall time: the machine is shared), with one intra-op
thread by default. Compares, interleaved in one process, the schema-driven parser (TtfParseLines with the
built-in schemas) and, when the op library still has it, the Criteo-only parser it
replaced (TtfParseCriteo), on the same blocks. Also measures the whole reader pipeline
(ttf.data.Reader, batch 4096, no shuffle) on a synthetic file per schema.

    .venv/bin/python benchmarks/parse.py --repeats 7
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402
from ttf._ops import ops  # noqa: E402
from ttf.data._reader import _op_attrs  # noqa: E402


def synthetic_lines(schema, rows, directory):
    path = os.path.join(directory, f"{schema}.txt")
    ttf.data.write_synthetic(path, rows, ttf.data.SyntheticCriteo(schema=schema, vocab_per_field=100_000))
    return path


def time_call(fn, repeats_inner=3):
    """CPU seconds of the process per call (all threads): on a shared machine this counts the
    work done, not the time spent waiting for a core."""
    fn()  # warm
    start = time.process_time()
    for _ in range(repeats_inner):
        fn()
    return (time.process_time() - start) / repeats_inner


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions (default 7)")
    parser.add_argument("--lines", type=int, default=65_536, help="lines per op call (default 65536)")
    parser.add_argument("--file-rows", type=int, default=500_000, help="rows of the pipeline's file (default 500000)")
    parser.add_argument("--no-pipeline", action="store_true", help="time the op calls only")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow's intra-op threads (default 1)")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    directory = tempfile.mkdtemp(prefix="ttf_parse_bench_")
    blocks, files = {}, {}
    for name in ("criteo", "avazu"):
        files[name] = synthetic_lines(name, args.file_rows, directory)
        with open(files[name], "rb") as f:
            lines = f.read().splitlines()
        schema = ttf.data.load_schema(name)
        first = 1 if schema.header is True else 0
        blocks[name] = tf.constant(lines[first:first + args.lines])
    numbers = tf.range(1, args.lines + 1, dtype=tf.int64)

    calls = {}
    for name in ("criteo", "avazu"):
        attrs = _op_attrs(ttf.data.load_schema(name))
        calls[f"TtfParseLines {name}"] = (lambda b=blocks[name], a=attrs: ops().ttf_parse_lines(b, "x", numbers, **a))
    if hasattr(ops(), "ttf_parse_criteo"):
        calls["TtfParseCriteo criteo (old)"] = lambda: ops().ttf_parse_criteo(blocks["criteo"], "x", numbers)

    def pipeline(name):
        reader = ttf.data.Reader(files[name], schema=name)

        def run():
            for _ in reader.dataset(4096, shuffle=False):
                pass
        return run

    pipelines = {} if args.no_pipeline else {f"Reader {name} (pipeline)": pipeline(name) for name in ("criteo", "avazu")}
    seconds = {name: [] for name in list(calls) + list(pipelines)}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            seconds[name].append(time_call(fn))
        for name, fn in pipelines.items():
            seconds[name].append(time_call(fn, repeats_inner=1))

    from _results import machine
    print(f"Machine: {machine(ROOT)}; "
          f"TensorFlow {tf.__version__}, Python {platform.python_version()}. {args.threads} intra-op thread(s); "
          f"process CPU seconds per call, medians of {args.repeats} interleaved repetitions.\n")
    print("| what | lines per call | median CPU s | lines per CPU s | vs TtfParseLines criteo |")
    print("|---|---|---|---|---|")
    base = statistics.median(seconds["TtfParseLines criteo"])
    for name, values in seconds.items():
        median = statistics.median(values)
        lines = args.file_rows if name.startswith("Reader") else args.lines
        ratio = f"{base / median * (lines / args.lines):.2f}x" if not name.startswith("Reader") else "-"
        print(f"| {name} | {lines:,} | {median:.4f} | {lines / median:,.0f} | {ratio} |")
    all_values = {k: [round(v, 4) for v in vs] for k, vs in seconds.items()}
    print("\nall runs (s):", all_values)


if __name__ == "__main__":
    main()
