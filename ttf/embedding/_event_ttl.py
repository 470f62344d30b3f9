"""Event-time TTL: evict the rows whose last update trained only examples older than
`ttl_seconds` of event time (the stream's clock, not the machine's).

A table row records the table step of its last update, not a time. So the job notes, now and
then, each shard's table step beside the newest event time trained so far (`observe`); at
`evict`, the newest note whose event time is at least `ttl_seconds` older than the newest event
time gives, per shard, a step: rows last updated before it trained only examples older than the
cut-off, and go (TtfTableEvict, on each shard's own device). Evictions reach a checkpoint's
delta and a published delta as deleted keys, like any eviction. Coarse by design: a row is
evicted at most one note interval late, never early. The notes live in the process: after a
restart, rows older than the TTL wait one more TTL (kept, not lost).
"""
import bisect
import math


class EventTimeTTL:
    """Evicts the rows of `layers` not updated within `ttl_seconds` of event time.

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
