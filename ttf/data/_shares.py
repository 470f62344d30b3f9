"""Input split into disjoint shares, and the reading position of each share.

A job with N workers (parameter-server workers or Horovod ranks) splits its input files
into N shares: a plain file is cut into pieces at line boundaries (by byte range), a gzip
file is one piece, and the pieces are dealt to the shares so their bytes are about equal.
Share i is read only by worker i, so one epoch trains each row once across the job.

A share is read with stock tf.data ops (FixedLengthRecordDataset over the piece's byte
range, which starts at a byte offset without parsing what comes before; lines cut by a
scan), in windows of `window_lines` consecutive lines. Each window's rows are permuted (a
stateless seed of (seed, epoch, piece, window start)), then cut into batches that never
straddle two windows. Every batch carries its place: `position` int64 [9] = (share, epoch,
piece, window start byte, window start line, batch index in the window, last batch of the
window (0/1), window end byte, window end line).

InputPosition (a tf.Module: plain variables, an ordinary checkpoint entry) keeps, per
share, where the next untrained batch starts: (epoch, piece, window start byte, window
start line, batches of that window already trained), updated by the training step only
after the batch trained. A share read from a restored position starts at that window
(a seek) and drops its first trained batches (the same permutation: the same rows), so a
job restarted from a checkpoint neither skips nor repeats rows.
"""
import gzip
import hashlib
import json
import sys

import numpy as np
import tensorflow as tf

POSITION_FIELDS = ("share", "epoch", "piece", "start_byte", "start_line", "batch", "last", "end_byte", "end_line")
_STATE_FIELDS = ("epoch", "piece", "start_byte", "start_line", "batches")
_CHUNK_BYTES = 1 << 20


def _newlines_before(path, offsets):
    """The number of b'\\n' before each byte offset of `offsets` (sorted ascending)."""
    counts, seen, done = [], 0, 0
    with tf.io.gfile.GFile(path, "rb") as f:
        for offset in offsets:
            while done < offset:
                block = f.read(min(1 << 24, offset - done))
                if not block:
                    break
                seen += block.count(b"\n")
                done += len(block)
            counts.append(seen)
    return counts


def _line_start_after(path, offset, size):
    """The first line start at or after byte `offset` (size when none)."""
    if offset <= 0:
        return 0
    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(offset - 1)
        while True:
            block = f.read(1 << 16)
            if not block:
                return size
            found = block.find(b"\n")
            if found >= 0:
                return min(f.tell() - len(block) + found + 1, size)


def _body_start(path, first_line):
    """Byte offset of line `first_line` (1: 0; 2: after the header line) of a plain file."""
    if first_line == 1:
        return 0
    with tf.io.gfile.GFile(path, "rb") as f:
        return len(f.readline())


def _gzip_size(path):
    size = 0
    with gzip.GzipFile(fileobj=tf.io.gfile.GFile(path, "rb"), mode="rb") as f:
        while True:
            block = f.read(1 << 24)
            if not block:
                return size
            size += len(block)


def plan_shares(paths, first_lines, num_shares):
    """Splits the files into `num_shares` lists of pieces with about equal bytes.

    A piece is a dict: path, compression ("" or "GZIP"), size (the file's bytes, uncompressed),
    begin / end (a byte range starting and ending at line starts), first_line (the 1-based
    number of the line at begin). Plain files are cut at line boundaries; a gzip file is one
    piece (it cannot be entered in the middle without decompressing what is before).
    """
    if num_shares < 1:
        raise ValueError(f"num_shares must be >= 1, got {num_shares}")
    files = []
    for path, first_line in zip(paths, first_lines):
        gz = path.endswith(".gz")
        size = _gzip_size(path) if gz else tf.io.gfile.stat(path).length
        begin = _body_start(path, first_line) if not gz else None
        files.append((path, gz, size, begin, first_line))
    total = sum(size for _, _, size, _, _ in files)
    target = max(1, -(-total // num_shares))
    pieces = []
    for path, gz, size, begin, first_line in files:
        if gz:
            # The header (if any) is skipped by line count when reading: begin = header bytes.
            header = 0
            if first_line == 2:
                with gzip.GzipFile(fileobj=tf.io.gfile.GFile(path, "rb"), mode="rb") as f:
                    header = len(f.readline())
            pieces.append(dict(path=path, compression="GZIP", size=size, begin=header, end=size, first_line=first_line))
            continue
        cuts = max(1, min(num_shares, round((size - begin) / target))) if num_shares > 1 else 1
        bounds = [begin] + [_line_start_after(path, begin + (size - begin) * k // cuts, size) for k in range(1, cuts)]
        bounds = sorted(set(bounds)) + [size]
        lines = _newlines_before(path, bounds[:-1]) if len(bounds) > 2 else [first_line - 1]
        for (b, e), before in zip(zip(bounds[:-1], bounds[1:]), lines):
            if e > b:
                pieces.append(dict(path=path, compression="", size=size, begin=b, end=e, first_line=before + 1))
    # Largest piece first to the share with the fewest bytes; each share reads its pieces in file order.
    shares, loads = [[] for _ in range(num_shares)], [0] * num_shares
    order = sorted(range(len(pieces)), key=lambda i: -(pieces[i]["end"] - pieces[i]["begin"]))
    for i in order:
        share = loads.index(min(loads))
        shares[share].append(i)
        loads[share] += pieces[i]["end"] - pieces[i]["begin"]
    return [[pieces[i] for i in sorted(share)] for share in shares]


def layout_id(shares):
    """A short fingerprint of a split (files, sizes, byte ranges): a position is only valid in it."""
    text = json.dumps([[(p["path"], p["size"], p["begin"], p["end"]) for p in share] for share in shares])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _lines_of_piece(path, compression, size, begin, end, start_line):
    """(starts int64 [k], ends int64 [k], numbers int64 [k], lines string [k]) per chunk of
    the byte range [begin, end) of one file, begin at a line start."""
    length = end - begin
    full = length // _CHUNK_BYTES * _CHUNK_BYTES
    tail = length - full
    main = tf.data.FixedLengthRecordDataset(path, _CHUNK_BYTES, header_bytes=begin,
                                            footer_bytes=size - begin - full, compression_type=compression,
                                            buffer_size=_CHUNK_BYTES)
    # The tail (shorter than a chunk); with tail 0 its region is empty and it yields nothing.
    rest = tf.data.FixedLengthRecordDataset(path, tf.maximum(tail, 1), header_bytes=begin + full,
                                            footer_bytes=size - end, compression_type=compression)
    chunks = (main.concatenate(rest).map(lambda c: (c, False))
              .concatenate(tf.data.Dataset.from_tensors((tf.constant(""), True))))

    def cut(state, element):
        leftover, offset, line = state
        chunk, last = element
        parts = tf.strings.split(leftover + chunk, "\n")
        n = tf.size(parts)
        tail_line = parts[n - 1]
        # The last part is a line only at the end of the piece (a last line without "\n").
        keep = n - 1 + tf.cast(last & (tf.strings.length(tail_line) > 0), tf.int32)
        lines = parts[:keep]
        sizes = tf.cast(tf.strings.length(lines), tf.int64) + 1
        ends = tf.minimum(offset + tf.cumsum(sizes), end)
        starts = offset + tf.cumsum(sizes, exclusive=True)
        numbers = line + tf.range(tf.cast(keep, tf.int64))
        consumed = tf.reduce_sum(tf.cast(tf.strings.length(parts[: n - 1]), tf.int64) + 1)
        new_state = (tf.where(last, "", tail_line), offset + consumed, line + tf.cast(n - 1, tf.int64))
        lines = tf.strings.regex_replace(lines, "\r$", "")  # as TextLineDataset: CRLF files too
        return new_state, (starts, ends, numbers, lines)

    return chunks.scan((tf.constant(""), tf.cast(begin, tf.int64), tf.cast(start_line, tf.int64)), cut)


def share_dataset(share_pieces, share_index, parse_window, batch_size, *, seed, num_epochs, start=None,
                  window_lines=65_536, keep_line=None):
    """Batches of one share: (features, labels, position int64 [9]) (see the module doc).

    Args:
      share_pieces: this share's pieces (plan_shares()[share_index]).
      parse_window: fn(path, line numbers [n], lines [n], permute seed [2]) -> (features, labels):
        parses one window and permutes its rows.
      batch_size: rows per batch (a window's last batch may be smaller).
      seed, num_epochs (None: forever): as Reader.dataset.
      start: None, or this share's saved state (epoch, piece, start byte, start line, batches).
      keep_line: optional fn(line numbers) -> bool mask of lines to keep (the held-out split).
    """
    epoch0, piece0, byte0, line0, skip0 = (0, 0, None, None, 0) if start is None else [int(v) for v in start]
    if num_epochs is not None and epoch0 >= num_epochs:
        return None  # this share is done
    table = {k: [p[k] for p in share_pieces] for k in ("path", "compression", "size", "begin", "end", "first_line")}

    def piece_batches(epoch, piece, begin, line, skip):
        path, compression = tf.gather(table["path"], piece), tf.gather(table["compression"], piece)
        size, end = tf.gather(tf.constant(table["size"], tf.int64), piece), tf.gather(tf.constant(table["end"],
                                                                                                     tf.int64), piece)
        lines = _lines_of_piece(path, compression, size, begin, end, line)
        windows = lines.rebatch(window_lines)

        def batches(starts, ends, numbers, text):
            info = tf.stack([tf.cast(share_index, tf.int64), epoch, piece, starts[0], numbers[0]])
            end_info = tf.stack([ends[-1], numbers[-1] + 1])
            if keep_line is not None:
                mask = keep_line(numbers)
                numbers, text = tf.boolean_mask(numbers, mask), tf.boolean_mask(text, mask)
            permute_seed = tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + epoch, piece * (1 << 40) + starts[0]])
            features, labels = parse_window(path, numbers, text, permute_seed)
            count = tf.cast(tf.size(labels), tf.int64)
            last = (count + batch_size - 1) // batch_size - 1

            def with_position(index, element):
                position = tf.concat([info, [index, tf.cast(index == last, tf.int64)], end_info], 0)
                return element[0], element[1], position

            return tf.data.Dataset.from_tensors((features, labels)).rebatch(batch_size).enumerate().map(with_position)

        out = windows.filter(lambda s, e, n, t: tf.size(n) > 0).flat_map(batches)
        return out.skip(skip)  # batches of a restored window trained before its checkpoint

    def epoch_batches(epoch, first_piece, first_byte, first_line, first_skip):
        count = len(share_pieces)
        pieces = tf.data.Dataset.range(first_piece, count)
        begins = tf.constant(table["begin"], tf.int64)
        lines = tf.constant(table["first_line"], tf.int64)

        def one(piece):
            restored = tf.equal(piece, first_piece) & (first_byte >= 0)
            begin = tf.where(restored, first_byte, tf.gather(begins, piece))
            line = tf.where(restored, first_line, tf.gather(lines, piece))
            return piece_batches(epoch, piece, begin, line, tf.where(restored, first_skip, 0))

        return pieces.flat_map(one)

    if not share_pieces:
        return None
    restored = byte0 is not None
    first = epoch_batches(tf.constant(epoch0, tf.int64), piece0, tf.constant(byte0 if restored else -1, tf.int64),
                          tf.constant(line0 if restored else -1, tf.int64), tf.constant(skip0, tf.int64))
    later_epochs = (tf.data.Dataset.range(epoch0 + 1, num_epochs) if num_epochs is not None
                    else tf.data.Dataset.range(epoch0 + 1, sys.maxsize))
    later = later_epochs.flat_map(lambda e: epoch_batches(e, 0, tf.constant(-1, tf.int64), tf.constant(-1, tf.int64),
                                                          tf.constant(0, tf.int64)))
    return first.concatenate(later)


class InputPosition(tf.Module):
    """Where each share of a job's input continues, and the examples trained: a checkpoint entry.

    Put it in the job's tf.train.Checkpoint (`tf.train.Checkpoint(model=..., input_position=pos)`)
    and call `record(position, rows)` in the training step after the batch's update (ttf's
    Reader.dataset(..., share=...) yields the position with every batch). In a
    parameter-server job create it under the strategy's scope: its variables then live on a
    parameter server, and each worker's step records its own share.

    Args:
      num_shares: shares of the split (workers or ranks of the job; 1 for one process).

    Attributes:
      states: one int64 [5] variable per share: (epoch, piece, window start byte, window start
        line, batches of that window trained); start byte -1: the share has not started.
      counts: one int64 scalar variable per share: rows trained from it, over all runs.
      layout: string variable: the fingerprint of the split the state belongs to.
    One variable per share, not one shared matrix: workers update their shares concurrently.
    """

    def __init__(self, num_shares, name="input_position"):
        super().__init__(name=name)
        self.num_shares = num_shares
        initial = np.array([0, 0, -1, -1, 0], np.int64)
        self.states = [tf.Variable(initial, trainable=False, name=f"state_{i}") for i in range(num_shares)]
        self.counts = [tf.Variable(0, dtype=tf.int64, trainable=False, name=f"examples_{i}") for i in range(num_shares)]
        self.layout = tf.Variable("", trainable=False, name="layout")

    def record(self, position, rows):
        """Notes that the batch at `position` (int64 [9]) with `rows` rows was trained (in a
        tf.function too). Returns the update op."""
        position = tf.convert_to_tensor(position, tf.int64)
        share = position[0]
        last = position[6] > 0
        # After a window's last batch the share continues at the window's end; otherwise in it.
        state = tf.where(last, tf.stack([position[1], position[2], position[7], position[8], 0]),
                         tf.stack([position[1], position[2], position[3], position[4], position[5] + 1]))
        rows = tf.cast(rows, tf.int64)

        def update(i):
            def branch():
                with tf.control_dependencies([self.states[i].assign(state), self.counts[i].assign_add(rows)]):
                    return tf.identity(share)  # a tensor (tf.function returns no ops), after both updates
            return branch

        return tf.switch_case(tf.cast(share, tf.int32), [update(i) for i in range(self.num_shares)])

    @property
    def state(self):
        """int64 [num_shares, 5]: every share's state (a read)."""
        return tf.stack([v.read_value() for v in self.states])

    @property
    def examples(self):
        """int64 [num_shares]: rows trained from each share (a read)."""
        return tf.stack([v.read_value() for v in self.counts])

    def assign(self, state, examples):
        """Sets every share's state [num_shares, 5] and examples [num_shares] (Horovod: the gathered ones)."""
        for i in range(self.num_shares):
            self.states[i].assign(state[i])
            self.counts[i].assign(examples[i])

    def start_of(self, share, layout):
        """The saved state of `share` for reading in `layout` (layout_id), or None: not started,
        or saved for another split (then a warning names the reason)."""
        saved = self.layout.numpy().decode()
        state = self.state.numpy()[share]
        if saved and saved != layout:
            print(f"[data] warning: the checkpoint's input position belongs to another split of the input (files, "
                  f"sizes or worker count changed: {saved} != {layout}); share {share} reads its input from the start",
                  file=sys.stderr, flush=True)
            return None
        return None if state[2] < 0 else state

    def examples_trained(self):
        """Rows trained, summed over the shares and over every run restored into this one."""
        return int(np.sum(self.examples.numpy()))
