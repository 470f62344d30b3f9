"""TensorBoard scalars for training jobs (`ttf.distribute.Job` with `JobConfig(logdir=...)`, or your own loop).

Three parts, usable alone:

- `RollingAUC(capacity)`: a ring of the (label, probability) pairs of the most recent
  training rows, filled inside the training step from the predictions the loss is computed
  on (no extra forward pass; one small scatter per step), read on the host only when a
  summary is written. Its AUC is the AUC over the last `capacity` rows trained.
- `table_scalars(layers)`: rows per ttf table (and per tier, for tables that report
  tiers), each shard's count computed where the shard lives: only numbers travel.
- `JobSummary(logdir)`: writes scalars with `tf.summary` into event files TensorBoard
  reads. `scalars(values, step)` is the one entry point: any dict of tag -> number, so
  other parts of a job (stream lag, the last published sequence) add their own tags.
  In a cluster only one process writes (`writer=False` elsewhere: every call is a no-op).

The tag names ttf.distribute.Job writes are the constants below (docs/tensorboard.md).

Example:
  >>> import tempfile, numpy as np, tensorflow as tf, ttf
  >>> window = ttf.summary.RollingAUC(capacity=8)
  >>> int(window.record(tf.constant([0., 1., 0., 1.]), tf.constant([-2., 1., -1., 2.])))  # rows so far
  4
  >>> window.auc()
  1.0
  >>> with ttf.summary.JobSummary(tempfile.mkdtemp()) as summary:
  ...     summary.scalars({ttf.summary.LOSS: 0.45, ttf.summary.AUC: window.auc()}, step=1)
"""
from ttf.summary._scalars import (AUC, BAD_LINES, BF16_SHARE, EXAMPLES_PER_SEC, LOSS, SKIPPED_STEPS, JobSummary, RollingAUC,
                                  read_scalars, table_scalars)

__all__ = ["AUC", "BAD_LINES", "BF16_SHARE", "EXAMPLES_PER_SEC", "LOSS", "SKIPPED_STEPS", "JobSummary", "RollingAUC",
           "read_scalars", "table_scalars"]
