"""Checkpoints with deltas: a full checkpoint every `full_every` saves, and in between
only the table rows touched since the previous save (plus the ids evicted since, as
deletions, and the whole dense state, which is small).

Every file is a tf.train.Checkpoint of the same object graph; a delta holds, for each ttf
embedding, `delta_*` tensors instead of the logical table, so it can never be mistaken for
a full checkpoint. Restore = the chain's full checkpoint, then each delta in order:
bit-identical to the model at the last save (rows, slots, counts, last-seen steps,
candidates, dense weights, optimizer state, step), into any sharding.
"""
from ttf.checkpoint import _format  # noqa: F401  (registers the sharded table format)
from ttf.checkpoint._manager import CheckpointManager

__all__ = ["CheckpointManager"]
