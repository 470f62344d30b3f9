"""A drifting synthetic stream: the planted model and the id population change by the hour.

`DriftingSynthetic` is `Synthetic` (same schema, Zipf popularity, planted logistic model)
at a simulated hour:

- Weights drift: a key's planted weight moves between independent anchor weights,
  `cos(pi/2 f) * a_p + sin(pi/2 f) * a_(p+1)` with `p + f = hour * drift_rate`, so its
  variance stays `key_weight_std^2` and it is unrelated to its old value after
  `1 / drift_rate` hours.
- Ids turn over: each popularity rank of each field holds an id for a while, then hands its
  popularity to a brand-new id (`new_id_rate` of the ranks per hour, staggered), so new ids
  appear at a steady rate and the ids they replace go cold for ever.
- Event time: the rows of hour h happen in [start_time + 3600 h, start_time + 3600 (h + 1));
  `event_times(h, n)` spreads n rows evenly over it. The Criteo schema has no time column,
  so the time travels beside the rows: in the producer's file names (the hour) and as the
  Kafka message timestamp (ttf.data.producer).

Everything is a pure function of (model_seed, seed, hour): `hour_rows(h, n)` gives the same
rows in any process, and hour h can be drawn without drawing the hours before it.

Example:
  >>> from ttf.data import DriftingSynthetic, best_auc
  >>> import numpy as np
  >>> stream = DriftingSynthetic(vocab_per_field=1000, drift_rate=1 / 24, new_id_rate=0.02)
  >>> first, later = stream.hour_rows(0, 5000), stream.hour_rows(24, 5000)
  >>> seen = float(np.isin(later["ids"][:, 0], first["ids"][:, 0]).mean())  # rows of hour 24 whose field-0 id was seen
  >>> 0.35 < seen < 0.55  # 24 hours at 2% of the ranks per hour: about half the rows carry new ids
  True
  >>> best_auc(later["label"], later["probability"]) > 0.8
  True
"""
import dataclasses
import math

import numpy as np

from ttf.data._synthetic import Synthetic, _mix64, _unit_normal

_WEIGHT_SALT, _ID_SALT, _STAGGER_SALT = np.uint64(0x5EED0001), np.uint64(0x5EED0002), np.uint64(0x5EED0003)


@dataclasses.dataclass(frozen=True)
class DriftingSynthetic(Synthetic):
    """`Synthetic` whose planted weights and ids change with the simulated `hour`.

    Args (beyond Synthetic's):
      drift_rate: planted-weight anchors per hour, >= 0 (0: weights fixed; 1/24: a key's
        weight is unrelated to its value a day earlier). Default 1/24.
      new_id_rate: share of each field's popularity ranks that move to a new id per hour,
        in [0, 1] (0: the ids never change). Default 0.02.
      hour: the simulated hour of the rows `generate` draws (>= 0); `at(hour)` sets it.
      start_time: Unix seconds at which hour 0 starts (default 2026-01-01T00:00:00Z).

    Raises:
      ValueError: a value out of range.
    """

    drift_rate: float = 1 / 24
    new_id_rate: float = 0.02
    hour: int = 0
    start_time: int = 1_767_225_600

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.drift_rate) and self.drift_rate >= 0):
            raise ValueError(f"drift_rate must be a finite number >= 0, got {self.drift_rate}")
        if not 0.0 <= self.new_id_rate <= 1.0:
            raise ValueError(f"new_id_rate must be in [0, 1], got {self.new_id_rate}")
        if self.hour < 0:
            raise ValueError(f"hour must be >= 0, got {self.hour}")

    def at(self, hour):
        """This stream at another simulated hour."""
        return dataclasses.replace(self, hour=int(hour))

    def hour_rows(self, hour, num_rows, seed=0):
        """The num_rows rows of simulated hour `hour` (a dict as Synthetic.generate returns,
        plus event_time int64 [N]). Each hour has its own sample seed, derived from (seed, hour)."""
        stream = self.at(hour)
        sample = stream.generate(num_rows, seed=stream.hour_seed(seed))
        sample["event_time"] = stream.event_times(num_rows)
        return sample

    def hour_seed(self, seed=0, part=0):
        """The sample seed of (this hour, part) of a stream of sample seed `seed`."""
        return int(_mix64(np.array([(seed << 40) ^ (self.hour << 12) ^ part], np.uint64))[0] >> np.uint64(1))

    def event_times(self, num_rows, part=0, parts=1):
        """int64 [num_rows]: Unix seconds of the rows of part `part` of `parts` of this hour,
        spread evenly over the part's share of the hour, in row order."""
        first = self.start_time + 3600 * self.hour + 3600 * part // parts
        return first + (np.arange(num_rows, dtype=np.int64) * (3600 // parts)) // max(num_rows, 1)

    def key_weights(self, ids):
        """Planted weight of each field-tagged key at this hour."""
        position = self.hour * self.drift_rate
        anchor = math.floor(position)
        turn = (position - anchor) * math.pi / 2
        weights = math.cos(turn) * self._anchor_weights(ids, anchor)
        if turn:
            weights += math.sin(turn) * self._anchor_weights(ids, anchor + 1)
        return weights

    def _anchor_weights(self, ids, anchor):
        salt = _mix64(np.array([self.model_seed], np.uint64) ^ _WEIGHT_SALT ^ np.uint64(anchor << 20))
        return self.key_weight_std * _unit_normal(_mix64(ids.astype(np.uint64) ^ salt))

    def _population(self, field, ranks):
        """Rank r of a field holds id generation g = floor(hour * new_id_rate + u_r), u_r a
        fixed uniform per (field, rank) that staggers the hand-overs; the value written is a
        32-bit hash of (field, rank, g)."""
        salt = _mix64(np.array([((self.model_seed & 0xFFFFFFFF) << 16) ^ field], np.uint64))
        keyed = _mix64(ranks.astype(np.uint64) ^ salt)
        stagger = (_mix64(keyed ^ _STAGGER_SALT) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        generation = np.floor(self.hour * self.new_id_rate + stagger).astype(np.uint64)
        return (_mix64(_mix64(keyed ^ _ID_SALT) ^ generation) >> np.uint64(32)).astype(np.int64)
