"""Files through TensorFlow's file systems (tf.io.gfile: local, gs://, s3://, hdfs://, ram://,
...), made durable before anything records them as written.

The one implementation for checkpoints (ttf.checkpoint) and serving versions (ttf.serving).
A local path gets fsync of files and folders, and a folder written elsewhere and renamed into
place appears whole (rename(2) is atomic). Other schemes make a file durable when it is closed
(nothing to fsync), but renaming a folder there is a copy of each object (gs://, s3://) or
not supported at all (ram://): a folder is written in place and a marker file written last
says it is whole (`renames_folders`).
"""
import os

import tensorflow as tf


def absolute_path(path):
    """A local path made absolute here (the chief), so every task reads the same folder; a URL
    (gs://, s3://, hdfs://, ram://) as it is."""
    if path is None or "://" in path:
        return path
    return os.path.abspath(path)


def _local(path):
    return "://" not in os.fspath(path)


def renames_folders(path):
    """True where a folder renamed into place appears whole (a local file system)."""
    return _local(path)


def fsync_path(path):
    """fsyncs one file or folder (a no-op on a remote filesystem)."""
    if not _local(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """fsyncs every file and folder under `path` (a no-op on a remote filesystem)."""
    if not _local(path):
        return
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def remove_tree(path):
    """Removes the folder `path` and everything under it, if it exists (any scheme)."""
    if not tf.io.gfile.exists(path):
        return
    try:
        tf.io.gfile.rmtree(path)
    except tf.errors.NotFoundError:  # ram:// removes everything, then reports the emptied folder missing
        pass


def write_text(path, text):
    """Writes `text` to the file `path` and makes it durable (any scheme)."""
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)
    fsync_path(path)


def read_text(path):
    """The text of the file `path` (any scheme)."""
    with tf.io.gfile.GFile(path) as f:
        return f.read()


def copy_tree_marker_last(source, destination, last):
    """Copies the folder `source` to `destination` (created), every file but those named in
    `last` first, then those in `last`'s order: on a file system without atomic folder renames,
    a reader that waits for the last of them never sees part of the folder."""
    relative = []
    for folder, _, files in tf.io.gfile.walk(source):
        for name in files:
            path = os.path.join(folder, name)
            # ram:// lists "a.b/c" also as a file ".b" of folder "a": only files that exist
            if not tf.io.gfile.isdir(path) and tf.io.gfile.exists(path):
                relative.append(os.path.relpath(path, source))
    ordered = sorted(f for f in relative if f not in last) + [f for f in last if f in relative]
    for name in ordered:
        target = os.path.join(destination, name)
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(os.path.join(source, name), target, overwrite=True)


def move_into_place(temporary, final, last):
    """Makes the written folder `temporary` appear whole as `final`: fsynced and renamed where
    folders rename atomically, else copied with the files named in `last` last (then removed)."""
    if renames_folders(final):
        fsync_tree(temporary)
        tf.io.gfile.rename(temporary, final)
        fsync_path(os.path.dirname(final))
    else:
        copy_tree_marker_last(temporary, final, last)
        remove_tree(temporary)
