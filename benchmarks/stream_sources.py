"""How fast the stream sources deliver parsed batches, beside the file reader on the same rows.

Reads R synthetic Criteo rows (files of --rows-per-file rows renamed into a folder; the same
rows as one message per line in a topic of librdkafka's mock cluster) in batches of
--batch-size, committing each batch as the trainer does, and reports examples/s: medians of
--repeats interleaved repetitions. The file reader (`Reader.share_dataset`, tf.data) reads the
same rows as one file (its pipeline built in each repetition). No training: this is the ceiling a
stream puts on a job. The mock cluster keeps about the last 20,000 messages of a partition:
--rows is checked against --partitions.

Example:
  python benchmarks/stream_sources.py --rows 100000 --partitions 8 --batch-size 4096 --repeats 3
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))  # kafka_mock: the mock cluster through ctypes

import ttf  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rows read per repetition (default 100000)")
    p.add_argument("--rows-per-file", type=int, default=20_000, help="rows per file of the folder (default 20000)")
    p.add_argument("--batch-size", type=int, default=4096, help="(default 4096)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the Kafka topic (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka source")
    args = p.parse_args(argv)
    for name in ("rows", "rows_per_file", "batch_size", "partitions", "repeats"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not args.no_kafka and args.rows > 15_000 * args.partitions:
        # librdkafka's mock cluster keeps about the last 20,000 messages of a partition.
        p.error(f"--rows {args.rows}: the mock cluster keeps ~20000 messages per partition; "
                f"give --partitions {-(-args.rows // 15_000)} or more, or --no-kafka")
    return args


def drain(stream, batch_size, rows):
    start, done = time.perf_counter(), 0
    while done < rows:
        batch = stream.next_batch(batch_size)
        stream.commit(batch)
        done += int(batch.labels.shape[0])
    return done / (time.perf_counter() - start)


def main(argv=None):
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix="ttf_stream_bench_")
    source = os.path.join(work, "rows.tsv")
    ttf.data.write_synthetic_criteo(source, args.rows)
    with open(source, encoding="utf-8") as f:
        lines = f.read().splitlines()
    folder = os.path.join(work, "incoming")
    os.makedirs(folder)
    for index, begin in enumerate(range(0, args.rows, args.rows_per_file)):
        tmp = os.path.join(folder, f".part-{index:06d}")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines[begin:begin + args.rows_per_file]))
        os.rename(tmp, os.path.join(folder, f"part-{index:06d}"))
    cluster = None
    if not args.no_kafka:
        import kafka_mock  # pylint: disable=import-outside-toplevel
        cluster = kafka_mock.MockKafkaCluster(3)
        cluster.create_topic("bench", args.partitions)
        kafka_mock.produce_lines(cluster.bootstrap, "bench", lines, args.partitions)
    reader = ttf.data.Reader([source], "criteo")

    def file_reader():
        start, done = time.perf_counter(), 0
        for _, labels, _ in reader.share_dataset(args.batch_size, shuffle=False):
            done += int(labels.shape[0])
        return done / (time.perf_counter() - start)

    paths = {"file reader (tf.data)": file_reader,
             "folder stream": lambda: drain(ttf.data.FolderStream(folder, poll_seconds=0.2), args.batch_size,
                                            args.rows)}
    if cluster:
        paths["kafka stream (mock cluster)"] = lambda: drain(
            ttf.data.KafkaStream(cluster.bootstrap, "bench", poll_seconds=0.2), args.batch_size, args.rows)
    rates = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, run in paths.items():
            rates[name].append(run())
    print(f"{args.rows} rows, batch {args.batch_size}, medians of {args.repeats} interleaved repetitions")
    print("| source | examples/s (median) | vs file reader |")
    print("|---|---|---|")
    base = statistics.median(rates["file reader (tf.data)"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / base:.2f}x |")
    if cluster:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
