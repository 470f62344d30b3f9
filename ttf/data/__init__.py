"""Criteo-format input and a synthetic generator of the same schema.

Elements: ({"ids": int64 [B, 26], "dense": float32 [B, 13]}, label float32 [B]); ids are
field-tagged keys ((field << 56) | value, see field_key), so all fields can share one table.
"""
from ttf.data._criteo import (CSV_HEADER, MISSING_VALUE, NUM_DENSE, NUM_FIELDS, CriteoReader, criteo_dataset,
                              field_key)
from ttf.data.synthetic import SyntheticCriteo, best_auc, synthetic_dataset, write_synthetic_criteo

__all__ = ["CSV_HEADER", "MISSING_VALUE", "NUM_DENSE", "NUM_FIELDS", "CriteoReader", "SyntheticCriteo", "best_auc",
           "criteo_dataset", "field_key", "synthetic_dataset", "write_synthetic_criteo"]
