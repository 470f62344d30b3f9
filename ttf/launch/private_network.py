"""Runs a command in a private network namespace: its own loopback and no other interface.

    python ttf/launch/private_network.py -- COMMAND [ARGS...]

start_all.sh runs its local jobs (the parameter-server cluster, local Horovod ranks) this way:
TensorFlow's gRPC servers listen on 0.0.0.0 with no authentication, and inside the namespace
0.0.0.0 is loopback alone, so nothing outside the job's own processes can reach them.

The process enters a new user + network namespace (no privileges needed where the kernel allows
unprivileged user namespaces), keeps its own uid and gid (files it writes belong to the caller,
as before), brings loopback up (with the host name's address on it too), then execs COMMAND, which keeps this process's pid, signals
and exit code. It sets TTF_NETWORK for COMMAND: "private", or, where the kernel refuses
(user namespaces disabled, a container's seccomp profile), "refused: <why>" and COMMAND runs
in the caller's network as it is (the caller decides what to say).

Run it by path, not with `python -m`: it uses only the standard library, while importing the
ttf package would load TensorFlow (seconds) before every local job.
"""
import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCSIFADDR = 0x8916
SIOCSIFNETMASK = 0x891C
IFF_UP = 0x1


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def loopback_up():
    """Sets IFF_UP on `lo` through an ioctl (no `ip` command needed: a fresh Debian has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)  # struct ifreq: name, flags, padding to 40 bytes
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


class Refused(OSError):
    """The kernel refused the namespaces; this process is still where it was."""


def _sockaddr_in(address):
    return struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton(address))


def add_loopback_address(address):
    """Gives loopback the extra IPv4 `address` (an alias, lo:1, /32)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFADDR, struct.pack("16s16s8x", b"lo:1", _sockaddr_in(address)))
        fcntl.ioctl(s, SIOCSIFNETMASK, struct.pack("16s16s8x", b"lo:1", _sockaddr_in("255.255.255.255")))


def host_address():
    """The IPv4 address this host's name resolves to, when it is not a loopback one (else None)."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


def enter():
    """Moves this single-threaded process into a new user + network namespace with loopback up.

    The caller's uid and gid map to themselves. The address this host's name resolves to is
    added to loopback: Gloo (Horovod) binds to it, and it would be missing inside. Raises Refused when the kernel refuses the
    namespaces (nothing changed), OSError when a later step fails (the process is then inside a
    namespace it cannot use and must stop).
    """
    uid, gid, own_address = os.getuid(), os.getgid(), host_address()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise Refused(err, f"unshare(user + network namespace): {os.strerror(err)}")
    try:
        _write("/proc/self/setgroups", "deny")  # required before gid_map without privileges
    except FileNotFoundError:  # kernels before 3.19 have no such file
        pass
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    loopback_up()
    if own_address is not None:
        add_loopback_address(own_address)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print(f"usage: {sys.argv[0]} -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        enter()
        os.environ["TTF_NETWORK"] = "private"
    except Refused as err:
        os.environ["TTF_NETWORK"] = f"refused: {err.strerror}"
    except OSError as err:
        print(f"private_network: setting up the private network namespace failed ({err}); "
              "run without isolation (start_all.sh --no-isolation)", file=sys.stderr)
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"private_network: cannot run {command[0]!r}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
