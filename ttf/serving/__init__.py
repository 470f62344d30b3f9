"""Serving export: a trained model with ttf tables as a SavedModel of stock TensorFlow ops.

`ttf.export_for_serving(model, base)` freezes each ttf table into a HashedTable (per shard: a
bucketed hash table in plain tensors, rows only, float32, float16 or int8 with a scale and
bias per row) and writes the next version `base/<N>/` of TF Serving's layout, atomically (a
temporary folder renamed into place). Its `serving_default` signature takes the model's input features by name.
TensorFlow Serving, or any process with plain TensorFlow, loads it without ttf's op library.

Online serving: `Publisher(model, base)` writes a base version and then, every few seconds,
a delta of what changed (rows touched, keys deleted, the dense weights if they changed; none
while nothing did); `DeltaFollower(base).start()` serves the newest base and applies the
deltas in place through the export's `apply_delta` signature, in a background thread woken by
inotify (polling elsewhere) (docs/serving.md). Every path goes through tf.io.gfile: local,
gs://, s3://, hdfs://, ram://.
"""
from ttf.serving._export import ServingVersion, export_for_serving, versions
from ttf.serving._frozen import FrozenTable, HashedShard, HashedTable, bucket_hash
from ttf.serving._follow import DeltaFollower
from ttf.serving._publish import Publisher, delta_folder

__all__ = ["DeltaFollower", "FrozenTable", "HashedShard", "HashedTable", "Publisher", "ServingVersion", "bucket_hash",
           "delta_folder", "export_for_serving", "versions"]
