"""Making files durable before anything records them as written: fsync of files and folders.

The one implementation for checkpoints (ttf.checkpoint) and serving versions (ttf.serving).
Remote filesystems (gs://, s3://, ...) make a file durable when it is closed: nothing to do.
"""
import os


def _local(path):
    return "://" not in path


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
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)
