"""Schema-driven CTR input and a synthetic generator with a planted model (docs/data.md).

A Schema declares a file's columns (label, dense, categorical, multi-hot, hour stamp,
skipped); `Reader(paths, schema)` parses such files (delimited text plain or gzip, Parquet,
TFRecord of tf.train.Example; files, globs or folders of part files) in C++ inside tf.data.
Built in: `"criteo"` (13 dense, 26 categorical; the default) and `"avazu"` (22 categorical
columns, the hour stamp split into hour of day and day of week).

Elements: `({"ids": int64 [B, F], "dense": float32 [B, D], <multi-hot name>: ragged int64
[B, None]}, label float32 [B])`. ids are field-tagged keys, `(field << FIELD_SHIFT) |
value` (see field_key), so all fields can share one embedding table.

Example:
  >>> import ttf
  >>> reader = ttf.data.CriteoReader("data/criteo_sample.txt")
  >>> features, labels = next(iter(reader.dataset(batch_size=128)))
  >>> features["ids"].dtype, features["dense"].shape, labels.shape
  (tf.int64, TensorShape([128, 13]), TensorShape([128]))
"""
from ttf.data._reader import CSV_HEADER, NUM_DENSE, NUM_FIELDS, CriteoReader, Reader, criteo_dataset, parse_lines
from ttf.data._files import data_format, expand_paths, file_format
from ttf.data._shares import POSITION_FIELDS, InputPosition, plan_shares
from ttf.data._stream import ID_SHIFT, FolderStream, KafkaStream, StreamBatch, StreamSource, stream_batches, zero_features
from ttf.data._stream_open import open_stream, parse_stream_spec, read_kafka_config
from ttf.data._schema import (AVAZU, CRITEO, FIELD_SHIFT, MISSING_VALUE, SCHEMAS, Categorical, Dense, Hour, Label,
                              MultiHot, Schema, Skip, field_key, load_schema)
from ttf.data._drift import DriftingSynthetic
from ttf.data._synthetic import (Synthetic, SyntheticCriteo, best_auc, cached_synthetic, synthetic_dataset,
                                 write_synthetic, write_synthetic_criteo)

__all__ = ["AVAZU", "CRITEO", "CSV_HEADER", "FIELD_SHIFT", "MISSING_VALUE", "NUM_DENSE", "NUM_FIELDS", "SCHEMAS",
           "Categorical", "CriteoReader", "data_format", "expand_paths", "file_format", "DriftingSynthetic", "FolderStream", "ID_SHIFT", "KafkaStream", "StreamBatch",
           "StreamSource", "open_stream", "parse_stream_spec", "read_kafka_config", "stream_batches", "zero_features", "InputPosition", "POSITION_FIELDS", "Dense", "Hour", "Label", "MultiHot", "Reader", "Schema", "Skip",
           "Synthetic", "SyntheticCriteo", "best_auc", "cached_synthetic", "criteo_dataset", "field_key",
           "load_schema", "parse_lines", "plan_shares", "synthetic_dataset", "write_synthetic", "write_synthetic_criteo"]
