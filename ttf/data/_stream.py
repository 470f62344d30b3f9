"""Stream sources: a folder that receives files, or a Kafka topic, read for ever.

A stream yields `StreamBatch`es: lines parsed by the same C++ op as files (`parse_lines`),
with each example's id and the position just after the batch. The position lives in
tf.Variables of the source (a tf.Module: put it in the job's tf.train.Checkpoint) and
moves only when the training loop calls `commit(batch)` after the batch's update, so a
checkpoint holds the model and the exact place in the stream that model has seen.
Restoring it resumes there: an example is trained once by the model state it ends up in
(examples trained after the last checkpoint are trained again after a restart, by the
rolled-back model, which never saw them).

Reading happens in the calling process (a Python loop; the parse is one op call per
batch). In a parameter-server job the chief reads and ships each batch to a worker; in a
Horovod job each rank reads its own share (`share`, `num_shares`), and before a checkpoint
the shares' positions are merged into every rank's variables (`share_state`,
`merge_shares`, `adopt_share`; ttf.distribute.horovod does it) (docs/streams.md).
"""
import dataclasses
import json
import os
import re
import sys
import threading
import time
import zlib

import numpy as np
import tensorflow as tf

from ttf.data._schema import load_schema

# An example id: (file sequence number or Kafka partition) << ID_SHIFT | line number or offset.
ID_SHIFT = 40
FOLDER_QUIET_SECONDS = 30.0  # a folder stream says "waiting" after this long without a new file


@dataclasses.dataclass
class StreamBatch:
    """One batch of a stream.

    Attributes:
      features, labels: as Reader.dataset yields them (labels float32 [B]).
      example_ids: int64 numpy [B]: each example's stream id (see the source's doc).
      position: the source's position after this batch (pass the batch to `commit`).
      event_time: wall-clock seconds (time.time) at which the newest example of the
        batch arrived in the stream (file mtime, Kafka message timestamp).
      bad_lines: lines of the batch skipped as bad (strict=False), counted at `commit`.
    """
    features: dict
    labels: tf.Tensor
    example_ids: np.ndarray
    position: object
    event_time: float
    bad_lines: int = 0


class StreamSource(tf.Module):
    """What both sources share: parsing, waiting, the stop flag and the progress dict.

    `progress` is a dict the source keeps current, for progress lines and summaries:
    examples (committed, over every run restored into this one), bad_lines and empty_files
    (skipped by this run: strict=False's bad lines, a folder's empty files), examples_per_sec (since the
    previous `update_progress` call), lag_seconds (now minus the arrival time of the newest
    committed example, 0 when nothing is waiting), lag_messages (examples or messages
    waiting; the folder source: lines not known, -1), lag_bytes (folder: bytes waiting;
    Kafka: -1), waiting (True while the stream has nothing to read).
    """

    def __init__(self, schema, strict, poll_seconds, name):
        super().__init__(name=name)
        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds}")
        self.schema = load_schema(schema)
        self.strict = strict
        self.poll_seconds = poll_seconds
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="examples")
        # Skipped input of this run: bad lines counted at commit (a batch read again after a
        # rollback counts once), empty files as they are passed over (a folder stream).
        self.bad_lines = self.empty_files = 0
        self.stop_event = threading.Event()
        self._waiting_since, self._said_waiting = None, False
        self.progress = dict(examples=0, examples_per_sec=0.0, lag_seconds=0.0, lag_messages=-1, lag_bytes=-1,
                             waiting=False, bad_lines=0, empty_files=0)
        self._last_progress = (time.monotonic(), None)
        self._last_event_time = None
        self._block = True
        self._merged_examples = 0  # `examples` as the shares last agreed it (merge_shares, adopt_share)
        # Called (no arguments) at every poll while a blocking next_batch finds nothing to read:
        # a job publishes its last trained rows while the stream is idle (ttf.distribute.Job sets it).
        self.on_idle = None

    def stop(self):
        """Makes a waiting `next_batch` return None (e.g. from a SIGTERM handler)."""
        self.stop_event.set()

    def _parse(self, lines, where, numbers):
        from ttf.data._reader import parse_lines  # pylint: disable=import-outside-toplevel
        features, labels, bad = parse_lines(lines, where, numbers, schema=self.schema, strict=self.strict)
        return features, labels, int(bad)

    def next_batch(self, batch_size, block=True):
        """The next batch of up to `batch_size` examples, or None once `stop()` was called
        (or, with block=False, when the stream stayed empty for one poll interval).

        Waits (polling every poll_seconds) while the stream is empty; once it holds some
        examples it waits at most one poll interval more to fill the batch, so a slow stream
        still trains promptly (a batch may then have fewer rows).
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self._block = block
        lines, ids, wheres, numbers, event_time, position = self._read(batch_size)
        if not lines:
            return None
        features, labels, bad = self._parse(lines, wheres, numbers)
        if bad:
            # A skipped bad line has no row: keep the ids of the rows parsed (the op keeps order).
            ids = ids[:0]  # unknown which were dropped; ids are for audits, exact only when strict
        return StreamBatch(features, labels, np.asarray(ids, np.int64), position, event_time, bad)

    def commit(self, batch):
        """Records that `batch` was trained: the position moves past it (call after the update)."""
        if batch.position is None:  # empty_batch: nothing was read
            return
        self._assign(batch.position)
        self.examples.assign_add(int(tf.size(batch.labels)))
        self.bad_lines += batch.bad_lines
        self._last_event_time = batch.event_time

    def empty_batch(self):
        """A batch of no examples, for a share that had nothing to read while the others had
        (a synchronous job's rank still takes the step); committing it changes nothing."""
        return StreamBatch(zero_features(self.schema, rows=0), tf.zeros([0], tf.float32), np.zeros([0], np.int64),
                           None, 0.0)

    # -- shares: several processes read one stream, one share each; a checkpoint holds them all

    def share_state(self):
        """This share's committed position and the examples it trained since the shares last
        agreed (JSON-able): what merge_shares needs from every share."""
        return {"share": self.share, "num_shares": self.num_shares, "position": self._share_position(),
                "examples": int(self.examples.numpy()) - self._merged_examples}

    @property
    def merged_examples(self):
        """Examples every share had trained when the shares last agreed (merge_shares, adopt_share)."""
        return self._merged_examples

    def merge_shares(self, states):
        """Every share's share_state, in share order -> this source's variables hold the
        position of the whole stream and the examples every share trained, so a checkpoint
        written from any one share resumes them all (call it on every share before a save)."""
        if [s["share"] for s in states] != list(range(self.num_shares)):
            raise ValueError(f"merge_shares needs the states of shares 0..{self.num_shares - 1} in order, got shares "
                             f"{[s['share'] for s in states]}")
        self._merge_positions([s["position"] for s in states])
        self._merged_examples += sum(s["examples"] for s in states)
        self.examples.assign(self._merged_examples)

    def adopt_share(self):
        """After restoring a checkpoint (every share restores the same one, written by one of
        them after merge_shares): this share takes its own part of the merged position.

        Raises:
          ValueError: the checkpoint's position cannot be split into this many shares (a
            folder read by another number of shares; see FolderStream)."""
        self._adopt()
        self._merged_examples = int(self.examples.numpy())
        self._rewind()

    def rewind(self):
        """Drops what was read past the committed position: the next batch starts at the
        committed position again. Call it after restoring a checkpoint into a stream that
        has been read (a job rolling back to its last checkpoint)."""
        self._rewind()

    @property
    def last_event_time(self):
        """The event time (seconds) of the newest committed batch's newest example, or None."""
        return self._last_event_time

    def update_progress(self):
        """Refreshes and returns `progress` (asks the stream head for the lag: call it at
        progress-line time, not every step)."""
        now, examples = time.monotonic(), int(self.examples.numpy())
        then, before = self._last_progress
        if before is not None and now > then:
            self.progress["examples_per_sec"] = (examples - before) / (now - then)
        self._last_progress = (now, examples)
        self.progress.update(examples=examples, bad_lines=self.bad_lines, empty_files=self.empty_files)
        self.progress.update(self._lag())
        pending = self.progress["lag_messages"] > 0 or self.progress["lag_bytes"] > 0
        self.progress["lag_seconds"] = (max(0.0, time.time() - self._last_event_time)
                                        if pending and self._last_event_time is not None else 0.0)
        return self.progress

    def _say_waiting(self, why, after=0.0):
        """Marks the stream waiting; says so once it has waited `after` seconds (a folder
        stream caught up with its producer waits between files: not worth a line each time)."""
        now = time.monotonic()
        if not self.progress["waiting"]:
            self._waiting_since, self._said_waiting = now, False
        self.progress["waiting"] = True
        if not self._said_waiting and now - self._waiting_since >= after:
            print(f"[stream] waiting: {why}", file=sys.stderr, flush=True)
            self._said_waiting = True

    def _idle(self):
        if self.on_idle is not None:
            self.on_idle()

    def _say_resumed(self):
        if self.progress["waiting"] and self._said_waiting:
            print("[stream] resumed", file=sys.stderr, flush=True)
        self.progress["waiting"] = False


class FolderStream(StreamSource):
    """A directory that receives files, each read once, in name order.

    The contract: a producer writes a file under a hidden or `.tmp` name and renames it into
    place when complete (a rename within one filesystem is atomic), so a file seen here never
    grows; names sort in arrival order (e.g. `part-000123.tsv` or a UTC time stamp). Files
    whose names start with "." or end in ".tmp" are ignored; so is a file whose name sorts
    before the one being read (it arrived too late: a warning names it). Files are plain
    text of the schema (no gzip); a header line is skipped when the schema has one.

    Position (checkpointed): the file being read, the byte offset and 1-based number of its
    next line, and the file's sequence number among this share's files (0 for the first file
    read). Example id: `(sequence * num_shares + share) << ID_SHIFT | line number` (one share:
    `sequence << ID_SHIFT | line`), unique over the shares. With several shares, merge_shares
    also records every share's position (`share_positions`, JSON), and a checkpoint resumes
    only with the same number of shares (a file's share is its name's crc32 % num_shares, so
    another count would move files that are half read between shares); a Kafka stream
    resumes in any number.

    Args:
      directory: the folder.
      schema: a Schema, "criteo", "avazu" or a JSON file.
      share, num_shares: read only files whose name's crc32 % num_shares == share.
      strict: fail on a bad line (naming file and line) or skip and count it.
      poll_seconds: how often an empty folder is listed again.
    """

    def __init__(self, directory, schema="criteo", share=0, num_shares=1, strict=True, poll_seconds=1.0,
                 name="folder_stream"):
        super().__init__(schema, strict, poll_seconds, name)
        if not os.path.isdir(directory):
            raise ValueError(f"stream folder not found: {directory}")
        if not 0 <= share < num_shares:
            raise ValueError(f"share must be in [0, {num_shares}), got {share}")
        self.directory, self.share, self.num_shares = directory, share, num_shares
        self.file = tf.Variable("", trainable=False, name="file")
        self.offset = tf.Variable(0, dtype=tf.int64, trainable=False, name="offset")
        self.line = tf.Variable(1, dtype=tf.int64, trainable=False, name="line")
        self.sequence = tf.Variable(-1, dtype=tf.int64, trainable=False, name="sequence")
        self.share_positions = tf.Variable("", trainable=False, name="share_positions")  # JSON: merge_shares
        self._reading = None  # (name, offset, line, sequence) read ahead of the committed position
        self._listed = None  # names seen by the last listing (None: not listed yet)

    def _files_after(self, name):
        names = sorted(n for n in os.listdir(self.directory)
                       if not n.startswith(".") and not n.endswith(".tmp")
                       and zlib.crc32(n.encode()) % self.num_shares == self.share)
        later = [n for n in names if n > name]
        if self._listed is not None:  # a name new since the last listing that sorts before the current file
            for late in sorted(set(names) - self._listed):
                if late < name and len(self._listed) < 1_000_000:
                    print(f"[stream] warning: {late} arrived after {name} was read and sorts before it: not read "
                          f"(names must sort in arrival order)", file=sys.stderr, flush=True)
        self._listed = set(names)
        return later

    def _committed(self):
        return (self.file.numpy().decode(), int(self.offset.numpy()), int(self.line.numpy()),
                int(self.sequence.numpy()))

    def _rewind(self):
        self._reading = None

    def _assign(self, position):
        name, offset, line, sequence = position
        self.file.assign(name)
        self.offset.assign(offset)
        self.line.assign(line)
        self.sequence.assign(sequence)

    def _share_position(self):
        return list(self._committed())

    def _merge_positions(self, positions):
        self.share_positions.assign(json.dumps({"num_shares": self.num_shares, "positions": positions}))

    def _adopt(self):
        saved = self.share_positions.numpy().decode()
        if saved:
            merged = json.loads(saved)
            shares = merged["num_shares"]
        else:  # written by one process, or before any merge
            merged, shares = None, 1
        started = self._committed()[0] != ""
        if shares != self.num_shares and (started or merged is not None):
            raise ValueError(
                f"the checkpoint's folder stream position ({self.directory}) was written by a job of {shares} "
                f"share(s) (ranks), this job reads it in {self.num_shares}: a folder's files are split over the "
                f"shares by name, so resume with {shares} rank(s) (a Kafka stream resumes in any number)")
        if merged is not None:
            self._assign(merged["positions"][self.share])

    def _read(self, batch_size):
        name, offset, line, sequence = self._reading or self._committed()
        lines, ids, wheres, numbers, event_time = [], [], [], [], 0.0
        deadline = None
        while len(lines) < batch_size:
            path = os.path.join(self.directory, name) if name else None
            size = os.path.getsize(path) if path and os.path.exists(path) else 0
            if path and offset < size:
                with open(path, "rb") as f:
                    f.seek(offset)
                    while len(lines) < batch_size:
                        raw = f.readline()
                        if not raw:
                            break
                        offset += len(raw)
                        text = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
                        if line == 1 and self._is_header(text):
                            line += 1
                            continue
                        if text:
                            lines.append(text)
                            ids.append(((sequence * self.num_shares + self.share) << ID_SHIFT) | line)
                            wheres.append(path)
                            numbers.append(line)
                        line += 1
                event_time = max(event_time, os.path.getmtime(path))
                continue
            later = self._files_after(name)
            if later and path and size == 0 and offset == 0:
                self.empty_files += 1
                print(f"[stream] skipped the empty file {path} ({self.empty_files} so far)", file=sys.stderr,
                      flush=True)
            if later:  # the current file is done (renamed into place whole): the next one
                name, offset, line, sequence = later[0], 0, 1, sequence + 1
                continue
            if lines:
                if deadline is None:
                    deadline = time.monotonic() + self.poll_seconds
                if time.monotonic() >= deadline:
                    break
            elif not self._block:  # empty: give up after one poll interval
                if deadline is None:
                    deadline = time.monotonic() + self.poll_seconds
                elif time.monotonic() >= deadline:
                    return [], [], [], [], 0.0, None
            else:
                self._say_waiting(f"no new file in {self.directory} for {FOLDER_QUIET_SECONDS:g} s", FOLDER_QUIET_SECONDS)
                self._idle()
            if self.stop_event.wait(self.poll_seconds if not lines else min(self.poll_seconds, 0.05)):
                if not lines:
                    return [], [], [], [], 0.0, None
                break
        self._say_resumed()
        self._reading = (name, offset, line, sequence)
        return lines, ids, wheres, numbers, event_time, (name, offset, line, sequence)

    def _is_header(self, text):
        header = self.schema.header
        if header is False:
            return False
        first = re.split(r"[\t,]" if self.schema.delimiter == "auto" else re.escape(self.schema.delimiter),
                         text, maxsplit=1)[0]
        return first == self.schema.columns[0].name

    def describe(self):
        """The committed position in words (for a resume line)."""
        name, offset, line, sequence = self._committed()
        return (f"file {name} (file {sequence} read), byte {offset}, line {line}" if name else "not started") + \
            f"; {int(self.examples.numpy())} examples trained"

    def _lag(self):
        name, offset, _, _ = self._committed()
        path = os.path.join(self.directory, name)
        waiting = (os.path.getsize(path) - offset) if name and os.path.exists(path) else 0
        waiting += sum(os.path.getsize(os.path.join(self.directory, n)) for n in self._files_after(name))
        return dict(lag_bytes=waiting, lag_messages=-1)


class KafkaStream(StreamSource):
    """A Kafka topic through confluent-kafka: one message is one line of the schema.

    The consumer is `assign()`ed its partitions at explicit offsets from this object's
    variables (never a consumer group's committed offsets; nothing is committed to Kafka),
    so a restored checkpoint resumes at exactly the next message after the last one trained.
    Partition p is read by share p % num_shares. While the brokers cannot be reached the
    source waits, says so in one line, and says "resumed" when messages flow again.

    Position (checkpointed): `offsets`, int64 [partitions], the next offset of each partition
    (-1: from its beginning). Example id: `partition << ID_SHIFT | offset`.

    Args:
      bootstrap: "host:port[,host:port]" of the brokers.
      topic: the topic (it must exist; its partitions are looked up at start).
      schema, strict, poll_seconds: as FolderStream.
      share, num_shares: which partitions this process reads.
      config: extra confluent-kafka consumer settings (e.g. security).
    """

    def __init__(self, bootstrap, topic, schema="criteo", share=0, num_shares=1, strict=True, poll_seconds=1.0,
                 config=None, name="kafka_stream"):
        super().__init__(schema, strict, poll_seconds, name)
        try:
            import confluent_kafka  # pylint: disable=import-outside-toplevel
        except ImportError as err:
            raise ImportError("a kafka stream needs confluent-kafka: pip install confluent-kafka") from err
        if not 0 <= share < num_shares:
            raise ValueError(f"share must be in [0, {num_shares}), got {share}")
        self._kafka = confluent_kafka
        self.topic, self.share, self.num_shares = topic, share, num_shares
        settings = {"bootstrap.servers": bootstrap, "group.id": "ttf-unused", "enable.auto.commit": False,
                    "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
                    "error_cb": self._on_error, "log_level": 2, **(config or {})}
        self._consumer = confluent_kafka.Consumer(settings)
        self.partitions = self._partition_count()
        # Shape [None]: a checkpoint of a topic with another partition count still restores.
        self.offsets = tf.Variable(np.full([self.partitions], -1, np.int64), shape=tf.TensorShape([None]),
                                   trainable=False, name="offsets")
        self._mine = [p for p in range(self.partitions) if p % num_shares == share]
        self._assigned = None  # offsets the consumer was assigned at (after a restore: new ones)
        self._next = None  # offsets read ahead of the committed ones
        self._error = None

    def _on_error(self, err):
        self._error = err  # the client retries by itself: the reading loop reports the wait

    def _partition_count(self):
        while True:
            try:
                topics = self._consumer.list_topics(self.topic, timeout=10).topics
                found = topics.get(self.topic)
                if found is not None and found.error is None and found.partitions:
                    return len(found.partitions)
                why = found.error if found is not None else "no metadata"
            except self._kafka.KafkaException as err:
                why = err
            self._say_waiting(f"kafka topic {self.topic!r} not available ({why}); retrying")
            if self.stop_event.wait(self.poll_seconds):
                raise RuntimeError(f"stopped while waiting for kafka topic {self.topic!r}")

    def _committed(self):
        saved = self.offsets.numpy()
        offsets = np.full([self.partitions], -1, np.int64)
        offsets[:min(len(saved), self.partitions)] = saved[:self.partitions]
        if len(saved) > self.partitions:
            raise ValueError(f"the checkpoint's stream position has {len(saved)} partitions of topic {self.topic!r}, "
                             f"which now has {self.partitions}: partitions cannot be removed")
        return offsets

    def _assign(self, position):
        self.offsets.assign(position)

    def _share_position(self):
        committed = self._committed()
        return {str(p): int(committed[p]) for p in self._mine}

    def _merge_positions(self, positions):
        merged = self._committed()
        for position in positions:
            for p, offset in position.items():
                merged[int(p)] = offset
        self.offsets.assign(merged)

    def _adopt(self):
        pass  # the offsets of every partition: any number of shares takes its partitions from them

    def _rewind(self):
        self._next = None  # _ensure_assigned seeks every partition back to the committed offsets

    def _ensure_assigned(self):
        committed = self._committed()
        if self._assigned is not None and (self._next is not None):
            return
        start = [self._kafka.TopicPartition(self.topic, p, int(committed[p]) if committed[p] >= 0
                                            else self._kafka.OFFSET_BEGINNING) for p in self._mine]
        self._consumer.assign(start)
        self._assigned, self._next = committed.copy(), committed.copy()

    def _read(self, batch_size):
        self._ensure_assigned()
        nxt = self._next.copy()
        lines, ids, numbers, event_time = [], [], [], 0.0
        deadline, idle_until = None, time.monotonic() + self.poll_seconds
        while len(lines) < batch_size:
            wait = self.poll_seconds if not lines else max(0.0, deadline - time.monotonic())
            messages = self._consumer.consume(batch_size - len(lines), timeout=min(wait, 0.2))
            for message in messages:
                if message.error() is not None:
                    if message.error().code() == self._kafka.KafkaError._PARTITION_EOF:  # pylint: disable=protected-access
                        continue
                    self._say_waiting(f"kafka: {message.error()}")
                    continue
                partition, offset = message.partition(), message.offset()
                if 0 <= nxt[partition] < offset:  # never silent: messages deleted before they were trained
                    print(f"[stream] warning: kafka topic {self.topic!r} partition {partition}: offsets "
                          f"{nxt[partition]}..{offset - 1} are gone (deleted by the topic's retention or compaction "
                          f"before they were trained: {offset - nxt[partition]} message(s) not trained); continuing "
                          f"at {offset}", file=sys.stderr, flush=True)
                nxt[partition] = offset + 1
                _, stamp = message.timestamp()
                event_time = max(event_time, stamp / 1000.0 if stamp > 0 else time.time())
                for text in (message.value() or b"").decode("utf-8", "replace").splitlines():
                    if text:
                        lines.append(text)
                        ids.append((partition << ID_SHIFT) | offset)
                        numbers.append(offset)
            if messages:
                self._error = None
                self._say_resumed()
            elif not lines and self._error is not None:
                self._say_waiting(f"kafka brokers unreachable ({self._error}); the client retries")
            if not lines and self._block:
                self._idle()
            if lines and deadline is None:
                deadline = time.monotonic() + self.poll_seconds
            if lines and time.monotonic() >= deadline:
                break
            if self.stop_event.is_set() or (not self._block and not lines and time.monotonic() >= idle_until):
                if not lines:
                    return [], [], [], [], 0.0, None
                break
        self._next = nxt
        return lines, ids, f"kafka:{self.topic}", numbers, event_time, nxt.copy()

    def describe(self):
        """The committed position in words (for a resume line)."""
        offsets = ", ".join(f"{p}: {o}" for p, o in enumerate(self._committed()) if o >= 0)
        return (f"next offsets {{{offsets}}}" if offsets else "not started") + \
            f"; {int(self.examples.numpy())} examples trained"

    def _lag(self):
        committed, waiting = self._committed(), 0
        for p in self._mine:
            try:
                low, high = self._consumer.get_watermark_offsets(self._kafka.TopicPartition(self.topic, p),
                                                                 timeout=1, cached=False)
            except self._kafka.KafkaException:
                return dict(lag_messages=-1, lag_bytes=-1)  # brokers unreachable: unknown
            waiting += max(0, high - (committed[p] if committed[p] >= 0 else low))
        return dict(lag_messages=int(waiting), lag_bytes=-1)

    def close(self):
        self._consumer.close()


def parse_stream_spec(spec):
    """`folder:DIR` -> ("folder", DIR); `kafka:HOST:PORT[,HOST:PORT]/TOPIC` -> ("kafka", (bootstrap, topic)).

    Raises:
      ValueError: a malformed spec (naming the expected form), a missing folder, or
        (kafka) confluent-kafka not installed.
    """
    kind, _, rest = spec.partition(":")
    if kind == "folder" and rest:
        if not os.path.isdir(rest):
            raise ValueError(f"stream folder not found: {rest}")
        return "folder", rest
    if kind == "kafka" and "/" in rest and rest.split("/", 1)[0] and rest.split("/", 1)[1]:
        try:
            import confluent_kafka  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        except ImportError as err:
            raise ValueError("a kafka stream needs confluent-kafka: pip install confluent-kafka") from err
        return "kafka", tuple(rest.split("/", 1))
    raise ValueError(f"a stream must be folder:DIR or kafka:HOST:PORT/TOPIC, got {spec!r}")


def read_kafka_config(path):
    """A Kafka client properties file (`key=value` lines, `#` comments: librdkafka's names,
    e.g. security.protocol=SASL_SSL, ssl.ca.location, sasl.mechanisms, sasl.username,
    sasl.password) -> {key: value}, passed to the consumer as they are.

    Raises:
      ValueError: a line that is not `key=value`, naming the file and line.
    """
    config = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{path}:{number}: expected key=value (a Kafka client property), got {line!r}")
            config[key.strip()] = value.strip()
    return config


def open_stream(spec, schema="criteo", share=0, num_shares=1, strict=True, poll_seconds=1.0, kafka_config=None):
    """A stream source from a spec (parse_stream_spec). Create it where its variables must
    live: in a parameter-server job under the strategy's scope, after connecting.
    kafka_config: extra consumer settings ({name: value}, e.g. TLS and SASL; see
    read_kafka_config), for a kafka spec only.

    Example:
      >>> import ttf
      >>> stream = ttf.data.open_stream("folder:/tmp")  # then stream.next_batch(4096), stream.commit(batch)
    """
    kind, where = parse_stream_spec(spec)
    if kind == "folder":
        if kafka_config:
            raise ValueError(f"Kafka settings were given for a folder stream ({spec}): drop them")
        return FolderStream(where, schema, share, num_shares, strict, poll_seconds)
    return KafkaStream(where[0], where[1], schema, share, num_shares, strict, poll_seconds, config=kafka_config)


def zero_features(schema, rows=2):
    """Features of `rows` all-zero examples of `schema` (to build a model's variables before
    the first batch of a stream arrives)."""
    from ttf.data._reader import _features  # pylint: disable=import-outside-toplevel
    schema = load_schema(schema)
    empty = [tf.zeros([0], tf.int64)] * len(schema.multi_hot)
    lengths = [tf.zeros([rows], tf.int64)] * len(schema.multi_hot)
    return _features(schema, tf.zeros([rows, schema.num_fields], tf.int64),
                     tf.zeros([rows, schema.num_dense], tf.float32), empty, lengths)


def stream_batches(stream, batch_size, stop=None, max_steps=None):
    """Batches of `stream` until `stop.requested` (a StopOnSignal or anything with that
    attribute), `max_steps` batches, or for ever. Commit each batch after its update."""
    taken = 0
    while not (stop is not None and stop.requested) and (max_steps is None or taken < max_steps):
        batch = stream.next_batch(batch_size)
        if batch is None:
            return
        taken += 1
        yield batch
