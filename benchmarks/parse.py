"""Parser throughput: lines/s of one parse-op call on blocks of synthetic lines.

Times process CPU seconds (not wall time: the machine is shared), with one intra-op
thread by default. Compares, interleaved in one process, the schema-driven parser (TtfParseLines with the
built-in schemas) and, when the op library still has it, the Criteo-only parser it
replaced (TtfParseCriteo), on the same blocks. Also measures the whole reader pipeline
(ttf.data.Reader, batch 4096, no shuffle) on a synthetic file per schema.

--formats: the same Criteo-shaped rows as TSV, Parquet (written by pyarrow, row groups of
--row-group rows) and TFRecord of tf.train.Example (tf.io.TFRecordWriter), each read to
batches of 4096 by ttf.data.Reader, and the TFRecord file by stock TFRecordDataset +
tf.io.parse_example (FixedLenFeatures: no keys, no transform), interleaved (ABBA).
--tfrecord-ops: TtfReadRecords and TtfParseExampleSpans alone on that TFRecord file.

    .venv/bin/python benchmarks/parse.py --repeats 7
    .venv/bin/python benchmarks/parse.py --formats --repeats 5 --file-rows 200000
    .venv/bin/python benchmarks/parse.py --formats --repeats 5 --file-rows 300000 --data-dir /tmp/formats
    .venv/bin/python benchmarks/parse.py --tfrecord-ops --repeats 5 --file-rows 300000 --data-dir /tmp/formats
    .venv/bin/python benchmarks/parse.py --part-files 200 --repeats 3 --file-rows 400000 --data-dir /tmp/formats
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
import pyarrow as pa  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402
from ttf._ops import ops  # noqa: E402
from ttf.data._columnar import TFRecordSource  # noqa: E402
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


def format_files(text, directory, row_group):
    """The rows of a Criteo TSV as Parquet (pyarrow) and TFRecord (tf.io.TFRecordWriter)."""
    names = ttf.data.CRITEO.header_line(",").split(",")
    table = pacsv.read_csv(text, read_options=pacsv.ReadOptions(column_names=names),
                           parse_options=pacsv.ParseOptions(delimiter="\t"),
                           convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names[14:]}))
    parquet = os.path.join(directory, "criteo.parquet")
    pq.write_table(table, parquet, row_group_size=row_group)
    record = os.path.join(directory, "criteo.tfrecord")
    columns = table.to_pydict()
    with tf.io.TFRecordWriter(record) as writer:
        for i in range(table.num_rows):
            feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[columns["label"][i]]))}
            for n in names[1:14]:
                if columns[n][i] is not None:
                    feature[n] = tf.train.Feature(float_list=tf.train.FloatList(value=[columns[n][i]]))
            for n in names[14:]:
                if columns[n][i] is not None:
                    feature[n] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[columns[n][i].encode()]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return parquet, record


def stock_tfrecord(path, batch_size):
    """The stock reading of the same records: FixedLenFeatures with defaults, parse_example."""
    names = ttf.data.CRITEO.header_line(",").split(",")
    spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
    spec.update({n: tf.io.FixedLenFeature([], tf.float32, default_value=0.0) for n in names[1:14]})
    spec.update({n: tf.io.FixedLenFeature([], tf.string, default_value="") for n in names[14:]})
    return (tf.data.TFRecordDataset(path, buffer_size=1 << 20).batch(batch_size)
            .map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE).prefetch(2))


def formats_files(args):
    """(text, parquet, record): the --formats files, made once per --data-dir and sizes."""
    directory = args.data_dir or tempfile.mkdtemp(prefix="ttf_formats_bench_")
    os.makedirs(directory, exist_ok=True)
    made = os.path.join(directory, f"made-{args.file_rows}-{args.row_group}")
    if os.path.exists(made):  # the files of an earlier run with these sizes (see --data-dir)
        return (os.path.join(directory, "criteo.txt"), os.path.join(directory, "criteo.parquet"),
                os.path.join(directory, "criteo.tfrecord"))
    text = synthetic_lines("criteo", args.file_rows, directory)
    parquet, record = format_files(text, directory, args.row_group)
    open(made, "w").close()
    return text, parquet, record


def part_files(args):
    """--part-files N: the --formats rows split into N TFRecord and N Parquet part files, one folder
    each, and the time of making a Reader over each folder (what a job waits before its first
    step: the file listing and the layout check), interleaved ABBA."""
    _, parquet, record = formats_files(args)
    folders = {fmt: os.path.join(os.path.dirname(parquet), f"parts-{args.part_files}", fmt)
               for fmt in ("tfrecord", "parquet")}
    if not os.path.isdir(folders["parquet"]):
        for folder in folders.values():
            os.makedirs(folder)
        table = pq.read_table(parquet)
        records = list(tf.data.TFRecordDataset(record).as_numpy_iterator())
        per = -(-table.num_rows // args.part_files)
        for i in range(args.part_files):
            pq.write_table(table.slice(i * per, per), os.path.join(folders["parquet"], f"part-{i:05d}.parquet"))
            with tf.io.TFRecordWriter(os.path.join(folders["tfrecord"], f"part-{i:05d}.tfrecord")) as writer:
                for r in records[i * per:(i + 1) * per]:
                    writer.write(r)
    times = {fmt: [] for fmt in folders}
    for i in range(args.repeats):
        for fmt in (list(folders) if i % 2 == 0 else list(folders)[::-1]):
            wall, cpu = time.perf_counter(), time.process_time()
            ttf.data.Reader(folders[fmt], schema="criteo")
            times[fmt].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"{args.part_files} part files of {-(-args.file_rows // args.part_files):,} rows, medians of {args.repeats}")
    print("| format | Reader(folder) wall s | CPU s |\n|---|---|---|")
    for fmt, runs in times.items():
        print(f"| {fmt} | {statistics.median(w for w, _ in runs):.3f} | {statistics.median(c for _, c in runs):.3f} |")
    return 0


def tfrecord_ops(args):
    """The two ops of the TFRecord path alone on the --formats file: TtfReadRecords framing the whole
    file in blocks of 4,096 records (reads and CRC32C), and TtfParseExampleSpans on those blocks,
    read once beforehand."""
    record = formats_files(args)[2]
    schema = ttf.data.load_schema("criteo")
    attrs = TFRecordSource([record], schema, _op_attrs(schema), True).attrs

    def frame():
        blocks, offset, number = [], 0, 0
        while True:
            data, starts, ends, numbers, offset, number, _, done = ops().ttf_read_records(record, offset, number, 4096)
            blocks.append((data, starts, ends, numbers))
            if bool(done):
                return blocks

    blocks = frame()
    parse_block = tf.function(lambda d, s, e, n: ops().ttf_parse_example_spans(d, s, e, record, n, **attrs))

    def parse():
        for block in blocks:
            parse_block(*block)

    seconds = {"TtfReadRecords (framing, CRC32C)": [], "TtfParseExampleSpans": []}
    for _ in range(args.repeats):
        for name, fn in zip(seconds, (frame, parse)):
            seconds[name].append(time_call(fn, repeats_inner=1))
    from _results import machine
    print(f"Machine: {machine(ROOT)}; TensorFlow {tf.__version__}. {args.threads} intra-op thread(s); "
          f"{args.file_rows:,} Criteo-shaped records; process CPU seconds per pass over the file, medians of "
          f"{args.repeats} interleaved repetitions.\n")
    print("| op | median CPU s | us per record |")
    print("|---|---|---|")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / args.file_rows * 1e6:.2f} |")
    print("\nall runs (s):", {k: [round(v, 3) for v in vs] for k, vs in seconds.items()})


def formats(args):
    text, parquet, record = formats_files(args)
    runs = {"text (TSV), ttf.data.Reader": lambda: ttf.data.Reader(text).dataset(4096, shuffle=False),
            "Parquet, ttf.data.Reader": lambda: ttf.data.Reader(parquet).dataset(4096, shuffle=False),
            "TFRecord, ttf.data.Reader": lambda: ttf.data.Reader(record).dataset(4096, shuffle=False),
            "TFRecord, stock TFRecordDataset + parse_example": lambda: stock_tfrecord(record, 4096)}
    seconds = {name: [] for name in runs}
    for repeat in range(args.repeats):
        order = list(runs.items())
        if repeat % 2:  # ABBA: every other repetition in reverse order
            order.reverse()
        for name, make in order:
            def run(make=make):
                for _ in make():
                    pass
            seconds[name].append(time_call(run, repeats_inner=1))
    from _results import machine
    print(f"Machine: {machine(ROOT)}; TensorFlow {tf.__version__}, pyarrow {pa.__version__}. {args.threads} "
          f"intra-op thread(s); {args.file_rows:,} Criteo-shaped rows, batch 4096, Parquet row groups of "
          f"{args.row_group:,}; process CPU seconds (all threads) per epoch, medians of {args.repeats} interleaved "
          "repetitions (ABBA: every other one in reverse order).\n")
    print("| input | median CPU s | rows per CPU s | vs text | vs stock TFRecord |")
    print("|---|---|---|---|---|")
    text_s = statistics.median(seconds["text (TSV), ttf.data.Reader"])
    stock_s = statistics.median(seconds["TFRecord, stock TFRecordDataset + parse_example"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {args.file_rows / median:,.0f} | {text_s / median:.2f}x | "
              f"{stock_s / median:.2f}x |")
    print("\nall runs (s):", {k: [round(v, 3) for v in vs] for k, vs in seconds.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions (default 7)")
    parser.add_argument("--lines", type=int, default=65_536, help="lines per op call (default 65536)")
    parser.add_argument("--file-rows", type=int, default=500_000, help="rows of the pipeline's file (default 500000)")
    parser.add_argument("--no-pipeline", action="store_true", help="time the op calls only")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow's intra-op threads (default 1)")
    parser.add_argument("--formats", action="store_true", help="text vs Parquet vs TFRecord pipelines (see above)")
    parser.add_argument("--row-group", type=int, default=65_536, help="--formats: Parquet rows per row group")
    parser.add_argument("--tfrecord-ops", action="store_true",
                        help="the TFRecord path's two ops alone (framing, parsing) on the --formats file")
    parser.add_argument("--data-dir", help="--formats: write the files here once and reuse them in later runs (runs "
                        "of two builds compared as processes in turn read the same files; default: a new temporary "
                        "folder each run)")
    parser.add_argument("--part-files", type=int, default=0,
                        help="time making a Reader over the --formats rows split into this many TFRecord and Parquet "
                             "part files (see part_files)")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.tfrecord_ops:
        return tfrecord_ops(args)
    if args.part_files:
        return part_files(args)
    if args.formats:
        return formats(args)

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
