"""The rolling-window AUC, per-table row counts and the scalar writer (see ttf.summary)."""
import glob
import numbers
import os

import numpy as np
import tensorflow as tf

from ttf.data._synthetic import best_auc

# Tags ttf.distribute.Job writes (docs/tensorboard.md); other parts of a job add their own.
LOSS = "train/loss"
AUC = "train/auc_window"
EXAMPLES_PER_SEC = "train/examples_per_sec"
BF16_SHARE = "train/bf16_share"
SKIPPED_STEPS = "train/skipped_steps"
BAD_LINES = "input/bad_lines"

# What tf.summary.scalar (from the tensorboard package) tags a scalar with: TensorBoard's
# scalars plugin, content version 0. Written through tf.summary.write, which is in
# TensorFlow itself, so writing needs no tensorboard install (only viewing does).
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars", content=b""))


class RollingAUC(tf.Module):
    """The AUC over the most recent `capacity` training rows.

    `record(labels, logits)` runs inside the training step, on the predictions the loss is
    computed on: it writes the rows' (label, sigmoid(logit)) into a ring of `capacity`
    slots (two float32 variables), so the cost per step is one scatter of B values and no
    host transfer. `auc()` reads the ring on the host (capacity x 8 bytes) when a summary
    is written. A model's own training predictions come before its update, so this is
    the AUC the model had on rows it had not yet trained on: progressive validation.

    Create it where the job's variables live (under a ParameterServerStrategy's scope the
    ring sits on a parameter server and every worker writes into it; rows that two workers
    write at once may overwrite each other's slots, which only changes which recent rows
    are counted). A tf.Module: put it in the job's tf.train.Checkpoint (ttf.distribute.Job
    does, as `auc_window`) and a resumed job continues the window it had, so its AUC equals
    that of a run never interrupted.

    Args:
      capacity: rows in the window (> 0; default 65536: 512 KiB of ring).

    Raises:
      ValueError: capacity <= 0.
    """

    def __init__(self, capacity=65_536):
        if capacity <= 0:
            raise ValueError(f"RollingAUC capacity must be > 0, got {capacity}")
        super().__init__(name="rolling_auc")
        self.capacity = int(capacity)
        # NaN marks a slot never written (and a skipped step's non-finite prediction): auc() drops them.
        self._probs = tf.Variable(tf.fill([self.capacity], float("nan")), trainable=False, name="rolling_auc_probs")
        self._labels = tf.Variable(tf.zeros([self.capacity]), trainable=False, name="rolling_auc_labels")
        self._rows = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="rolling_auc_rows")

    def record(self, labels, logits):
        """Adds a batch: labels [B] (0/1) and logits [B] or [B, 1] (any float dtype).
        Returns the rows recorded so far (int64 scalar), once the batch is in the ring."""
        labels = tf.reshape(tf.cast(tf.stop_gradient(labels), tf.float32), [-1])
        probs = tf.sigmoid(tf.reshape(tf.cast(tf.stop_gradient(logits), tf.float32), [-1]))
        batch = tf.size(labels, out_type=tf.int64)
        keep = tf.minimum(batch, self.capacity)  # a batch larger than the ring keeps its last rows
        labels, probs = labels[batch - keep:], probs[batch - keep:]
        rows = self._rows.assign_add(batch, read_value=True)
        slots = tf.math.floormod(rows - keep + tf.range(keep), self.capacity)[:, None]
        with tf.control_dependencies([self._probs.scatter_nd_update(slots, probs),
                                      self._labels.scatter_nd_update(slots, labels)]):
            return tf.identity(rows)

    def rows(self):
        """Rows recorded so far (all of them, not only those still in the window)."""
        return int(self._rows.numpy())

    def auc(self):
        """AUC over the rows in the window; NaN while it holds one class only (or nothing)."""
        probs, labels = self._probs.numpy(), self._labels.numpy()
        present = np.isfinite(probs)
        probs, labels = probs[present], labels[present]
        positives = int((labels > 0.5).sum())
        if positives == 0 or positives == len(labels):
            return float("nan")
        return best_auc(labels, probs)


def table_scalars(layers):
    """{tag: number} of the ttf tables of `layers` (objects with `.tables`, e.g.
    FusedEmbedding, DynamicEmbedding), over the shards in this process's reach:

      tables/<layer>/rows          keys holding a row
      tables/<layer>/rows_evicted  rows evicted by the capacity / TTL policy so far
      tables/<layer>/rows_<tier>   rows in each tier, for tables whose shards report tiers
                                   (a `tier_rows()` method returning {tier name: rows})

    Each count is computed on the shard's own device (its parameter server): only numbers
    travel. Eager only. On Horovod each rank counts its own shards: add the ranks' dicts
    (e.g. `hvd.allgather_object`) for the job's totals.
    """
    values = {}
    for layer in layers:
        tables = getattr(layer, "tables", None)
        if not tables:
            continue
        prefix = f"tables/{layer.name}/"
        totals = {"rows": 0, "rows_evicted": 0}
        for table in tables:
            with tf.device(table._resource_device):  # pylint: disable=protected-access
                totals["rows"] += int(table.size())
                totals["rows_evicted"] += int(table.stats()[4])
                tier_rows = getattr(table, "tier_rows", None)
                for tier, rows in (tier_rows() if tier_rows else {}).items():
                    totals[f"rows_{tier}"] = totals.get(f"rows_{tier}", 0) + int(rows)
        values.update({prefix + name: count for name, count in totals.items()})
    return values


class JobSummary:
    """Writes scalars to TensorBoard event files under `logdir` (`tf.summary`).

    Args:
      logdir: the folder (created when missing). `tensorboard --logdir DIR` shows it.
      writer: False on every process but the one that writes (a cluster's chief, Horovod
        rank 0): then `scalars` does nothing, so every process can call it alike.

    Example:
      >>> import tempfile, ttf
      >>> logdir = tempfile.mkdtemp()
      >>> with ttf.summary.JobSummary(logdir) as summary:
      ...     summary.scalars({"stream/lag_seconds": 1.5, "publish/sequence": 7}, step=100)
      >>> ttf.summary.read_scalars(logdir)["publish/sequence"]
      [(100, 7.0)]
    """

    def __init__(self, logdir, writer=True):
        self.logdir = os.fspath(logdir)
        self._writer = None
        if writer:
            os.makedirs(self.logdir, exist_ok=True)
            with tf.device("/cpu:0"):  # this process's own CPU, also on a cluster's chief
                self._writer = tf.summary.create_file_writer(self.logdir)

    def scalars(self, values, step):
        """Writes each `tag: number` of the dict `values` at `step` and flushes, so a job
        being watched shows it at once. None values are left out; NaN is written as NaN.

        Raises:
          TypeError: a tag that is not a string or a value that is not a number.
        """
        if self._writer is None:
            return
        for tag, value in values.items():
            if not isinstance(tag, str) or not (value is None or isinstance(value, (numbers.Real, np.number))):
                raise TypeError(f"JobSummary.scalars takes {{str tag: number}}, got {tag!r}: {value!r}")
        with tf.device("/cpu:0"), self._writer.as_default(step=int(step)):
            for tag, value in values.items():
                if value is not None:
                    tf.summary.write(tag, tf.constant(float(value), tf.float32), metadata=_SCALAR_METADATA)
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_scalars(logdir):
    """{tag: [(step, value), ...]} of the scalars in the event files under `logdir` (in
    file then write order): what TensorBoard shows, for tests and scripts."""
    found = {}
    for path in sorted(glob.glob(os.path.join(os.fspath(logdir), "**", "events.out.tfevents.*"), recursive=True)):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                found.setdefault(value.tag, []).append((int(event.step), number))
    return found

