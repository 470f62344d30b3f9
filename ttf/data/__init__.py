"""Criteo-format input and a synthetic generator of the same schema (docs/data.md).

Elements of every dataset here: `({"ids": int64 [B, 26], "dense": float32 [B, 13]},
label float32 [B])`. ids are field-tagged keys, `(field << FIELD_SHIFT) | value` (see
field_key), so all fields can share one embedding table; dense = log(1 + max(x, 0)).

Example:
  >>> import ttf
  >>> reader = ttf.data.CriteoReader("data/criteo_sample.txt")
  >>> features, labels = next(iter(reader.dataset(batch_size=128)))
  >>> features["ids"].dtype, features["dense"].shape, labels.shape
  (tf.int64, TensorShape([128, 13]), TensorShape([128]))
"""
from ttf.data._criteo import (CSV_HEADER, FIELD_SHIFT, MISSING_VALUE, NUM_DENSE, NUM_FIELDS, CriteoReader,
                              criteo_dataset, field_key)
from ttf.data.synthetic import SyntheticCriteo, best_auc, synthetic_dataset, write_synthetic_criteo

__all__ = ["CSV_HEADER", "FIELD_SHIFT", "MISSING_VALUE", "NUM_DENSE", "NUM_FIELDS", "CriteoReader", "SyntheticCriteo",
           "best_auc", "criteo_dataset", "field_key", "synthetic_dataset", "write_synthetic_criteo"]
