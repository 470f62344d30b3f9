"""Produces a drifting synthetic stream (ttf.data.DriftingSynthetic) at a steady rate: into a
folder, one file per interval, and/or into a Kafka topic.

Folder contract (what `ttf.data.FolderStream` reads: `Job.follow("folder:DIR")`): each file is written
under a temporary name (`.<name>.tmp`, hidden), fsynced, then renamed into place, so a
reader sees whole files only; names sort in the order written:
`part-<hour, 6 digits>-<part, 3 digits>.<txt|csv>` (rows of --schema, as
ttf.data.Reader reads them). The rows of part p of hour h happen in that part's share of
[start + 3600 h, start + 3600 (h + 1)) (DriftingSynthetic.event_times): the name carries
their time, the schema has no time column. A producer restarted on the same folder
continues after its last file.

Kafka (`--kafka HOST:PORT/TOPIC`, needs `pip install confluent-kafka`): one message per row
(the row's text line, no newline), its timestamp the row's event time in milliseconds.

CLI:
    python -m ttf.data.producer --out-dir /tmp/stream --rows-per-hour 50000 --interval 10
    python -m ttf.data.producer --out-dir /tmp/stream --hours 24 --interval 0      # 24 hours at once
    python -m ttf.data.producer --kafka 127.0.0.1:9092/ctr --rows-per-hour 100000 --files-per-hour 60
    python -m ttf.data.producer -h

Exit codes: 0 done (or stopped by SIGTERM / Ctrl-C after a whole file), 1 a write failed,
2 bad usage.
"""
import argparse
import os
import re
import signal
import sys
import time

from ttf.data._drift import DriftingSynthetic
from ttf.data._synthetic import _write

_NAME = re.compile(r"^part-(\d{6})-(\d{3})\.(txt|csv)$")


def part_name(stream, hour, part):
    """The file name of part `part` of hour `hour` of `stream`'s rows."""
    return f"part-{hour:06d}-{part:03d}.{'csv' if stream.schema.delimiter == ',' else 'txt'}"


def write_part(directory, stream, hour, part, rows, parts=1, seed=0):
    """Writes part `part` (of `parts`) of simulated hour `hour`: `rows` rows under a hidden
    temporary name, fsynced, renamed into place, the folder fsynced.

    Returns:
      (path, labels float32 [rows], planted probabilities float64 [rows]).
    """
    at_hour = stream.at(hour)
    path = os.path.join(directory, part_name(stream, hour, part))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp")
    try:
        labels, probabilities = _write(temporary, rows, at_hour, at_hour.hour_seed(seed, part), None, None, False)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
    return path, labels, probabilities


def next_part(directory, files_per_hour):
    """(hour, part) after the last part file in `directory`, (0, 0) when there is none."""
    found = sorted(m.groups()[:2] for m in map(_NAME.match, os.listdir(directory)) if m)
    if not found:
        return 0, 0
    hour, part = int(found[-1][0]), int(found[-1][1]) + 1
    return (hour + 1, 0) if part >= files_per_hour else (hour, part)


class KafkaSink:
    """Sends rows to a Kafka topic (confluent-kafka), one message per row, timestamped."""

    def __init__(self, address):
        try:
            from confluent_kafka import Producer  # pylint: disable=import-outside-toplevel
        except ImportError as err:
            raise SystemExit("[producer] error: --kafka needs confluent-kafka: pip install confluent-kafka") from err
        bootstrap, _, self.topic = address.partition("/")
        if not bootstrap or not self.topic:
            raise SystemExit(f"[producer] error: --kafka takes HOST:PORT/TOPIC, got {address!r}")
        self.failed = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    def _delivered(self, err, _message):
        if err is not None:
            self.failed.append(str(err))

    def send(self, lines, event_times):
        for line, event_time in zip(lines, event_times):
            while True:
                try:
                    self.producer.produce(self.topic, value=line, timestamp=int(event_time) * 1000,
                                          on_delivery=self._delivered)
                    break
                except BufferError:  # the client's queue is full: wait for deliveries (bounded memory)
                    self.producer.poll(0.5)
            self.producer.poll(0)
        if self.producer.flush(60) > 0 or self.failed:
            raise OSError(f"Kafka topic {self.topic}: messages not delivered ({(self.failed or ['flush timed out'])[0]})")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ttf.data.producer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DriftingSynthetic()
    p.add_argument("--out-dir", default=None, help="folder the part files are renamed into (created when missing)")
    p.add_argument("--kafka", default=None, help="HOST:PORT/TOPIC: also (or only) send each row as a message")
    p.add_argument("--rows-per-hour", type=int, default=50_000, help="rows per simulated hour (default 50000)")
    p.add_argument("--files-per-hour", type=int, default=1,
                   help="parts each simulated hour is cut into, one per interval (default 1)")
    p.add_argument("--interval", type=float, default=10.0,
                   help="seconds between parts (a steady rate: the clock, not the write time, sets the next one); "
                        "0 writes as fast as it can (default 10)")
    p.add_argument("--hours", type=int, default=0, help="stop after this many simulated hours; 0 runs until "
                                                        "SIGTERM / Ctrl-C (default 0)")
    p.add_argument("--schema", default="criteo", help="criteo (default), avazu or a JSON schema file")
    p.add_argument("--vocab-per-field", type=int, default=100_000, help="popularity ranks per field (default 100000)")
    p.add_argument("--drift-rate", type=float, default=defaults.drift_rate,
                   help="planted-weight anchors per simulated hour: 1/24 (default) makes a key's weight unrelated "
                        "to its value a day before; 0 keeps the model fixed")
    p.add_argument("--new-id-rate", type=float, default=defaults.new_id_rate,
                   help=f"share of each field's ranks handed to a new id per simulated hour (default "
                        f"{defaults.new_id_rate})")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    p.add_argument("--model-seed", type=int, default=defaults.model_seed,
                   help=f"seed of the planted model (default {defaults.model_seed})")
    args = p.parse_args(argv)
    if not args.out_dir and not args.kafka:
        p.error("give --out-dir DIR and/or --kafka HOST:PORT/TOPIC")
    for name in ("rows_per_hour", "files_per_hour"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.interval < 0 or args.hours < 0:
        p.error("--interval and --hours must be >= 0")
    if args.rows_per_hour < args.files_per_hour:
        p.error("--rows-per-hour must be at least --files-per-hour (each part holds a row or more)")
    try:
        stream = DriftingSynthetic(vocab_per_field=args.vocab_per_field, drift_rate=args.drift_rate,
                                   new_id_rate=args.new_id_rate, model_seed=args.model_seed, schema=args.schema)
    except ValueError as err:
        p.error(str(err))
    sink = KafkaSink(args.kafka) if args.kafka else None
    directory = args.out_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ttf_producer_{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    hour, part = next_part(directory, args.files_per_hour) if args.out_dir else (0, 0)
    stopping = []
    previous = {sig: signal.signal(sig, lambda *_: stopping.append(True)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _produce(args, stream, sink, directory, hour, part, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _produce(args, stream, sink, directory, hour, part, stopping):
    """Writes parts until --hours or a stop signal; returns the exit code."""
    base = args.rows_per_hour // args.files_per_hour
    print(f"[producer] from hour {hour} part {part}: {args.rows_per_hour:,} rows per simulated hour in "
          f"{args.files_per_hour} part(s), one every {args.interval:g}s, to "
          + " and ".join(x for x in (args.out_dir, args.kafka and f"kafka {args.kafka}") if x), flush=True)
    start, written = time.monotonic(), 0
    while not stopping and (args.hours == 0 or hour < args.hours):
        rows = base + (1 if part < args.rows_per_hour % args.files_per_hour else 0)
        began = time.monotonic()
        try:
            path, labels, _ = write_part(directory, stream, hour, part, rows, args.files_per_hour, args.seed)
            if sink:
                with open(path, "rb") as f:
                    lines = f.read().splitlines()[1 if stream.schema.header is True else 0:]
                sink.send(lines, stream.at(hour).event_times(rows, part, args.files_per_hour))
                if not args.out_dir:
                    os.remove(path)
        except OSError as err:
            print(f"[producer] error: {err}", file=sys.stderr, flush=True)
            return 1
        print(f"[producer] hour {hour} part {part}: {rows:,} rows ({labels.mean():.3f} positive) "
              f"in {time.monotonic() - began:.1f}s" + (f" -> {os.path.basename(path)}" if args.out_dir else ""),
              flush=True)
        written += 1
        hour, part = (hour + 1, 0) if part + 1 >= args.files_per_hour else (hour, part + 1)
        delay = start + written * args.interval - time.monotonic()
        while delay > 0 and not stopping:  # sleep in slices so SIGTERM ends the wait promptly
            time.sleep(min(delay, 0.2))
            delay = start + written * args.interval - time.monotonic()
    if not args.out_dir:
        os.rmdir(directory)
    print(f"[producer] {'stopped' if stopping else 'done'}: {written} part(s) written", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
