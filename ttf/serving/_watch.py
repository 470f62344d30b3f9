"""FolderWatch: wakes a waiting thread when a file or folder appears in watched folders.

Linux inotify through ctypes on libc (no dependency) where the folder is on a local
filesystem; elsewhere (another OS, a network or FUSE filesystem, whose remote writers raise no
local event, a gs://, s3://, hdfs:// or ram:// path of tf.io.gfile) it polls. Either way `wait` also returns after its timeout, so a missed event
(an inotify queue overflow) costs one interval, never a stall.
"""
import ctypes
import ctypes.util
import os
import select
import sys

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
# Filesystems whose changes made on another host raise no inotify event here.
REMOTE_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "afs",
                      "fuse")


def filesystem_type(path):
    """The type of the filesystem holding `path` (/proc/self/mountinfo), or None if unknown."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                mount = fields[4].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[fields.index("-") + 1]
    except (OSError, ValueError, IndexError):
        return None
    return kind


class FolderWatch:
    """Watches folders for entries created, renamed in or written; `kind` says how:
    "inotify", or "polling (<why>)".

    Args:
      folder: a folder of the filesystem to watch (decides inotify or polling).
      mode: "auto" (inotify where possible) or "polling".
    """

    def __init__(self, folder, mode="auto"):
        if mode not in ("auto", "polling"):
            raise ValueError(f"FolderWatch: mode must be 'auto' or 'polling', got {mode!r}")
        self._fd, self._watches = None, {}  # folder -> watch descriptor
        self._wake_read, self._wake_write = os.pipe()  # close() wakes a waiting thread at once
        self.kind = "polling (asked for)" if mode == "polling" else self._start_inotify(folder)

    def _start_inotify(self, folder):
        if "://" in folder:
            return f"polling ({folder.split('://')[0]}:// is not a local filesystem)"
        if not sys.platform.startswith("linux"):
            return f"polling ({sys.platform} has no inotify)"
        kind = filesystem_type(folder)
        if kind is None or kind.split(".")[0] in REMOTE_FILESYSTEMS:
            return f"polling ({folder} is on {kind or 'an unknown filesystem'}: no events from other hosts)"
        try:
            self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError) as error:
            return f"polling (no inotify in libc: {error})"
        if fd < 0:
            return f"polling (inotify_init1: {os.strerror(ctypes.get_errno())})"
        self._fd = fd
        return "inotify"

    def watch(self, folders):
        """Watches exactly `folders` (those that exist); a no-op when polling."""
        if self._fd is None:
            return
        folders = {os.path.realpath(f) for f in folders if os.path.isdir(f)}
        for folder in set(self._watches) - folders:
            self._libc.inotify_rm_watch(self._fd, self._watches.pop(folder))
        for folder in folders - set(self._watches):
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE)
            if wd >= 0:  # a folder removed meanwhile: the next watch() retries
                self._watches[folder] = wd

    def wait(self, timeout):
        """Returns True when something happened in a watched folder, False after `timeout`
        seconds (polling: always after the timeout) or once close() was called."""
        ready = select.select([self._wake_read] + ([self._fd] if self._fd is not None else []), [], [], timeout)[0]
        if self._fd in ready and self._fd is not None:
            try:
                while os.read(self._fd, 65536):  # drain: one wake-up for any number of events
                    pass
            except BlockingIOError:
                pass
            return True
        return False

    def close(self):
        """Wakes a waiting thread and releases the inotify descriptor (once)."""
        if self._wake_write is None:
            return
        os.write(self._wake_write, b"x")
        os.close(self._wake_write)
        self._wake_write = None

    def release(self):
        """After the waiting thread is done: closes the remaining descriptors."""
        for fd in (self._fd, self._wake_read):
            if fd is not None:
                os.close(fd)
        self._fd = self._wake_read = None
