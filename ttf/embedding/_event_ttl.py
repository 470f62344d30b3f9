"""Event-time TTL: evict the rows whose last update trained only examples older than
`ttl_seconds` of event time (the stream's clock, not the machine's).

A table row records the table step of its last update, not a time. So the job notes, now and
then, each shard's table step beside the newest event time trained so far (`observe`); at
`evict`, the newest note whose event time is at least `ttl_seconds` older than the newest event
time gives, per shard, a step: rows last updated before it trained only examples older than the
cut-off, and go (TtfTableEvict, on each shard's own device). Evictions reach a checkpoint's
delta and a published delta as deleted keys, like any eviction. Coarse by design: a row is
evicted at most one note interval late, never early.

The notes are part of the job's checkpoint (put the EventTimeTTL in the tf.train.Checkpoint,
as ttf.distribute.Job does): a restart from a checkpoint makes the same eviction decisions as a
run that was never interrupted. Restored into another number of shards, each note keeps the
smallest step of its shards for every shard: rows may then go up to one TTL late, never early.
"""
import bisect
import math
import warnings

import tensorflow as tf


class EventTimeTTL(tf.__internal__.tracking.Trackable):
    """Evicts the rows of `layers` not updated within `ttl_seconds` of event time.

    A checkpointable object: its notes, the newest event time and the eviction count are
    saved with the tf.train.Checkpoint it is put in (a few numbers per note: one note per
    `observe`, dropped once older than the TTL).

    Example:
      >>> import ttf, tensorflow as tf
      >>> layer = ttf.DynamicEmbedding(4)
      >>> ttl = ttf.embedding.EventTimeTTL([layer], ttl_seconds=3600)
      >>> ttl.observe(event_time=1_700_000_000.0)   # after a committed batch or a progress line
      >>> ttl.evict()                                # rows removed (0: nothing is an hour old yet)
      0
    """

    def __init__(self, layers, ttl_seconds):
        if not (isinstance(ttl_seconds, (int, float)) and math.isfinite(ttl_seconds) and ttl_seconds > 0):
            raise ValueError(f"ttl_seconds must be a number > 0, got {ttl_seconds!r}")
        self.shards = [table for layer in layers for table in layer.tables]
        self.ttl_seconds = float(ttl_seconds)
        self.newest = -math.inf  # the newest event time observed
        self._times, self._steps = [], []  # notes: event time (non-decreasing) -> each shard's table step
        self.evicted = 0  # rows removed so far

    def observe(self, event_time):
        """Notes each shard's table step beside the newest event time trained so far."""
        self.newest = max(self.newest, float(event_time))
        steps = [int(shard.stats()[2]) for shard in self.shards]
        if self._times and self._times[-1] == self.newest:
            self._steps[-1] = steps
        else:
            self._times.append(self.newest)
            self._steps.append(steps)

    def evict(self):
        """Removes the rows older than the TTL; returns how many. Drops the notes it no longer needs."""
        at = bisect.bisect_right(self._times, self.newest - self.ttl_seconds) - 1
        if at < 0:
            return 0
        # A row updated at table step s has last-seen s: those up to the note's step go.
        removed = sum(int(shard.evict(step + 1, 0)) for shard, step in zip(self.shards, self._steps[at]))
        del self._times[:at], self._steps[:at]  # the cut-off only moves forward
        self.evicted += removed
        return removed

    # -- checkpoint: the notes as tensors (times float64 [N], steps int64 [N, shards])

    def _serialize_to_tensors(self):
        steps = tf.constant(self._steps, tf.int64) if self._steps else tf.zeros([0, len(self.shards)], tf.int64)
        return {"times": tf.constant(self._times, tf.float64, shape=[len(self._times)]),
                "steps": steps, "newest": tf.constant(self.newest, tf.float64),
                "evicted": tf.constant(self.evicted, tf.int64)}

    def _restore_from_tensors(self, restored_tensors):
        times = [float(t) for t in restored_tensors["times"].numpy()]
        steps = restored_tensors["steps"].numpy().reshape([len(times), -1])
        if steps.shape[1] != len(self.shards):
            # Another topology: a row's shard is not known, so each note keeps the smallest step of its
            # shards for every shard (rows evicted late, never early).
            warnings.warn(f"EventTimeTTL: the checkpoint's notes are of {steps.shape[1]} shards, this job has "
                          f"{len(self.shards)}; each note keeps its smallest step, so old rows may stay up to one "
                          "TTL longer")
            steps = steps.min(axis=1, keepdims=True).repeat(len(self.shards), axis=1) if len(times) else \
                steps.reshape([0, len(self.shards)])
        self._times, self._steps = times, [[int(s) for s in row] for row in steps]
        self.newest = float(restored_tensors["newest"].numpy())
        self.evicted = int(restored_tensors["evicted"].numpy())
        return tf.no_op()
