"""Where the data is: paths, globs and folders expanded into data files, and their format.

Every path goes through TensorFlow's file systems (tf.io.gfile), so a bucket (gs://, and
s3:// or hdfs:// through TF's plugins) reads as a local folder does. A folder is its data
files, sorted by name, as Spark, Flink or DuckDB leave them: hidden files (".*"), marker
files ("_SUCCESS", "_committed_*": any "_*") and checksums ("*.crc") are skipped.

The format of a file is its suffix: ".parquet" (Parquet), ".tfrecord" or ".tfrecords"
(TFRecord of tf.train.Example, GZIP with a further ".gz"), otherwise Parquet when the file
starts with Parquet's magic "PAR1", otherwise delimited text (plain, or gzip by ".gz").
"""
import os

import tensorflow as tf

TEXT, PARQUET, TFRECORD = "text", "parquet", "tfrecord"
_GLOB_CHARS = "*?["


def _is_data_file(name):
    return not (name.startswith(".") or name.startswith("_") or name.endswith(".crc"))


def _folder_files(folder):
    names = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(folder))
    files = [os.path.join(folder, n) for n in names if _is_data_file(n)]
    return [f for f in files if not tf.io.gfile.isdir(f)]


def expand_paths(paths):
    """The data files of `paths` (a path or a list of them): each a file, a glob, or a folder.

    Raises:
      ValueError: no paths, or a glob or folder without data files.
      FileNotFoundError: a path that does not exist.

    Example:
      >>> import ttf
      >>> ttf.data.expand_paths("data/criteo_sample.txt")
      ['data/criteo_sample.txt']
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for path in map(os.fspath, paths):
        if any(c in path for c in _GLOB_CHARS):
            found = [f for f in sorted(tf.io.gfile.glob(path))
                     if _is_data_file(os.path.basename(f)) and not tf.io.gfile.isdir(f)]
            if not found:
                raise ValueError(f"no data files match {path}")
            files += found
        elif tf.io.gfile.isdir(path):
            found = _folder_files(path)
            if not found:
                raise ValueError(f"folder {path} holds no data files (hidden, '_*' and '*.crc' files are skipped)")
            files += found
        elif tf.io.gfile.exists(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"data file not found: {path}")
    if not files:
        raise ValueError("a Reader needs at least one file")
    return files


def file_format(path):
    """"parquet", "tfrecord" or "text": by the suffix (after a ".gz"), else by Parquet's magic."""
    name = path[:-3] if path.endswith(".gz") else path
    if name.endswith(".parquet"):
        if path.endswith(".gz"):
            raise ValueError(f"{path}: a gzip-compressed Parquet file is not readable in place; Parquet compresses "
                             "its own pages: give the .parquet file")
        return PARQUET
    if name.endswith((".tfrecord", ".tfrecords")):
        return TFRECORD
    if not path.endswith(".gz"):
        with tf.io.gfile.GFile(path, "rb") as f:
            if f.read(4) == b"PAR1":
                return PARQUET
    return TEXT


def data_format(files):
    """The one format of all `files`. Raises ValueError when they mix formats."""
    formats = {}
    for f in files:
        formats.setdefault(file_format(f), f)
    if len(formats) > 1:
        named = ", ".join(f"{fmt} ({example})" for fmt, example in formats.items())
        raise ValueError(f"the data files mix formats: {named}; give one format per job (one --data, one "
                         "--eval-data)")
    return next(iter(formats))
