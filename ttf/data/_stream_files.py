"""Parquet and TFRecord files in a folder stream: each file decoded whole when the stream
reaches it (by ttf.data.Reader, in file order, no shuffle), then handed out in slices of
rows. A position in such a file is a row index among its decoded rows (with strict=False,
among the rows kept: the same rows on every decode, so a resume continues exactly)."""
import tensorflow as tf

from ttf.data import _files
from ttf.data._reader import Reader

_DECODE_BATCH = 1 << 20


def is_columnar(path):
    return _files.file_format(path) != _files.TEXT


class DecodedFile:
    """All rows of one Parquet or TFRecord file: features (as Reader yields them) and labels."""

    def __init__(self, path, schema, strict):
        self.path = path
        batches = list(Reader(path, schema, strict=strict).dataset(_DECODE_BATCH, shuffle=False))
        self.features = {k: tf.concat([f[k] for f, _ in batches], 0) for k in batches[0][0]}
        self.labels = tf.concat([l for _, l in batches], 0)
        self.rows = int(self.labels.shape[0])

    def rows_between(self, begin, end):
        return {k: v[begin:end] for k, v in self.features.items()}, self.labels[begin:end]


def concat_rows(pieces):
    """One (features, labels) of several slices (a batch across files)."""
    if len(pieces) == 1:
        return pieces[0]
    return ({k: tf.concat([f[k] for f, _ in pieces], 0) for k in pieces[0][0]},
            tf.concat([l for _, l in pieces], 0))
