"""The job runtime: `Job` (_job.py) over a topology (ttf.distribute.topology), its two
loops, `fit` and `follow`, with their after-step hooks (_loops.py), its set-up checks
(_checks.py), a user's own tf.data pipeline split into input shares (_user_data.py), its
configuration (`JobConfig`, `PublishConfig`: _config.py) and the signal stop (_stop.py).
"""
from ttf.distribute.job._config import JobConfig, PublishConfig
from ttf.distribute.job._job import Job, sigmoid_cross_entropy, tier_progress
from ttf.distribute.job._stop import StopOnSignal

__all__ = ["Job", "JobConfig", "PublishConfig", "StopOnSignal", "sigmoid_cross_entropy", "tier_progress"]
