"""Serving export: a trained model with ttf tables as a SavedModel of stock TensorFlow ops.

`ttf.export_for_serving(model, path)` freezes each ttf table into a sorted id vector and a
row matrix (plus the default row for ids it never saw) and writes a SavedModel whose
`serving_default` signature takes the model's input features by name. TensorFlow Serving,
or any process with plain TensorFlow, loads it without ttf's op library.
"""
from ttf.serving._export import FrozenTable, export_for_serving

__all__ = ["FrozenTable", "export_for_serving"]
