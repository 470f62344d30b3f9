"""Local jobs listen on nothing outside the machine: ttf/launch/private_network.py (a private
user + network namespace, loopback only) and start_all.sh's local jobs run in it, checked from
outside through /proc (this test process stays in the host's network namespace)."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.jobs import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPER = os.path.join(ROOT, "ttf", "launch", "private_network.py")
START = os.path.join(ROOT, "start_all.sh")
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def isolated(*command, **kwargs):
    return subprocess.run([sys.executable, HELPER, "--", *command], capture_output=True, text=True, timeout=60,
                          **kwargs)


@pytest.fixture(scope="module")
def namespaces_allowed():
    out = isolated("sh", "-c", 'echo "$TTF_NETWORK"').stdout.strip()
    if out != "private":
        pytest.skip(f"this kernel refuses a private network namespace ({out}); start_all.sh warns instead")


def tcp_table(pid="self"):
    """{socket inode: (address hex, port)} of the TCP sockets listening in pid's network namespace."""
    table = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{name}").read().splitlines()[1:]
        except FileNotFoundError:  # no IPv6
            continue
        for line in lines:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == LISTEN:
                table[int(fields[9])] = (address, int(port, 16))
    return table


def is_loopback(address_hex):
    if len(address_hex) == 8:  # IPv4, little-endian: 127.x.x.x ends in 7F
        return address_hex.endswith("7F")
    return address_hex == "00000000000000000000000001000000"  # ::1


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # the process ended meanwhile
        pass
    return inodes


def job_listeners(pid):
    """(sockets the job's processes listen on in their own namespace, those visible from here)."""
    own, outside, here = {}, {}, tcp_table()
    for p in [pid, *descendants(pid)]:
        inodes = socket_inodes(p)
        try:
            theirs = tcp_table(p)
        except OSError:
            continue
        own.update({i: theirs[i] for i in inodes if i in theirs})
        outside.update({i: here[i] for i in inodes if i in here})
    return own, outside


# Quick: the helper itself.

def test_command_runs_with_loopback_only_and_listens_on_nothing_outside(namespaces_allowed, tmp_path):
    script = (
        "import os, socket, sys\n"
        "print(os.environ['TTF_NETWORK'], os.getuid(), os.getgid())\n"
        "print(','.join(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))\n"
        "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
        "socket.create_connection(('127.0.0.1', s.getsockname()[1]), timeout=5).close()\n"
        "print(os.fstat(s.fileno()).st_ino)\n"
        "open(sys.argv[1], 'w').write('x')\n"
        "sys.exit(7)\n")
    out = isolated(sys.executable, "-c", script, str(tmp_path / "written"))
    assert out.returncode == 7, out.stderr  # the command's exit code, through exec
    network, interfaces, inode = out.stdout.split("\n")[:3]
    assert network == f"private {os.getuid()} {os.getgid()}"
    assert interfaces == "lo"
    assert int(inode) not in tcp_table()  # its listening socket was not in this namespace
    written = os.stat(tmp_path / "written")
    assert (written.st_uid, written.st_gid) == (os.getuid(), os.getgid())


def test_a_socket_on_all_addresses_is_unreachable_from_outside(namespaces_allowed):
    proc = subprocess.Popen([sys.executable, HELPER, "--", sys.executable, "-c",
                             "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen();"
                             "print(s.getsockname()[1], flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        own, outside = job_listeners(proc.pid)
        assert [p for _, p in own.values()] == [port] and not outside
        with pytest.raises(ConnectionRefusedError):
            __import__("socket").create_connection(("127.0.0.1", port), timeout=5)
    finally:
        proc.kill()
        proc.wait()


def test_a_refused_namespace_runs_the_command_saying_why(namespaces_allowed):
    # A user namespace with no uid mapping may not create another one: a real refusal by the kernel.
    out = subprocess.run(["unshare", "--user", "--", sys.executable, HELPER, "--", "sh", "-c",
                          'echo "$TTF_NETWORK"'], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"unshare --user is not available here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused: unshare(user + network namespace): Operation not permitted"


def test_the_host_names_address_is_reachable_inside(namespaces_allowed):
    # Gloo binds to the address the host's name resolves to: enter() puts it on loopback.
    script = (
        "import socket, sys\n"
        f"sys.path.insert(0, {os.path.dirname(HELPER)!r})\n"
        "import private_network as pn\n"
        "pn.enter()\n"
        "pn.add_loopback_address('10.231.99.7')\n"
        "s = socket.socket(); s.bind(('10.231.99.7', 0)); s.listen()\n"
        "socket.create_connection(s.getsockname(), timeout=5).close()\n"
        "own = pn.host_address()\n"
        "if own: socket.socket().bind((own, 0))\n"
        "print('ok', own)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


def test_usage_error_without_a_command():
    out = subprocess.run([sys.executable, HELPER], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stderr


# Slow: start_all.sh's local jobs, watched from outside until their servers listen, then Ctrl-C.

def run_and_watch(args, expected_listeners, timeout=240):
    """Starts start_all.sh and watches its processes' listening sockets until it trains and at
    least `expected_listeners` were seen, then interrupts it (Ctrl-C); returns (the sockets it
    listened on in its namespace, those visible from here, its output, its exit code)."""
    proc = subprocess.Popen([START, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    own, outside, deadline = {}, {}, time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            now_own, now_outside = job_listeners(proc.pid)
            own.update(now_own)
            outside.update(now_outside)
            if len(own) >= expected_listeners and any("[train] step" in line for line in lines):
                break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # say what the job was doing, and what was left running
            left = subprocess.run(["ps", "-o", "stat=,pid=,ppid=,args=", "-s", str(proc.pid)], capture_output=True,
                                  text=True).stdout
            raise AssertionError(f"start_all.sh did not stop within 120 s of Ctrl-C; still running:\n{left}\n"
                                 f"its output:\n{''.join(lines)[-4000:]}") from None
        reader.join(timeout=10)
        out = "".join(lines)
        for _ in range(10):  # processes still alive in the job's session (zombies being reaped do not count)
            left = [line for line in subprocess.run(["ps", "-o", "stat=,pid=,args=", "-s", str(proc.pid)],
                                                    capture_output=True, text=True).stdout.splitlines()
                    if not line.startswith("Z")]
            if not left:
                break
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)])  # this test's own session only
    assert len(own) >= expected_listeners, f"saw {own} listening; output:\n{out[-3000:]}"
    assert not left, f"processes left after Ctrl-C: {left}"
    return own, outside, out, proc.returncode


CLUSTER = ["--tiacc", "--fm", "--data", "sample", "--batch-size", "16", "--steps", "100000"]


@pytest.mark.slow
def test_local_cluster_listens_on_nothing_outside_its_namespace(namespaces_allowed):
    own, outside, out, code = run_and_watch(CLUSTER, expected_listeners=4)  # 1 ps, 2 workers, the chief
    assert not outside, f"listening in the host's network: {outside}"
    assert "[start_all] listening: ps 0 port" in out and "private network namespace" in out, out[-3000:]
    assert "warning: not isolated" not in out
    assert code == 130 and "interrupted: stopping every process" in out, out[-3000:]


@pytest.mark.slow
def test_no_isolation_listens_on_every_address_and_says_so_in_one_line():
    # The control for the test above: the same check sees the servers when they are in this network.
    own, outside, out, code = run_and_watch([*CLUSTER, "--workers", "1", "--no-isolation"], expected_listeners=3)
    assert len(outside) >= 3 and any(not is_loopback(a) for a, _ in outside.values()), outside
    warning = [line for line in out.splitlines() if "warning: not isolated (--no-isolation)" in line]
    assert len(warning) == 1 and all(f"port {p}" in warning[0] for _, p in own.values()), out[-3000:]
    assert code == 130


@pytest.mark.slow
def test_local_horovod_job_listens_on_nothing_outside_its_namespace(namespaces_allowed):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed (./scripts/setup_horovod.sh)")
    # horovodrun's rendezvous server, listening all along (Gloo's listeners close once the ranks
    # are connected, so a poll may or may not see them; any it sees are checked too).
    own, outside, out, code = run_and_watch(["--hvd", *CLUSTER], expected_listeners=1)
    assert not outside, f"listening in the host's network: {outside}"
    assert "private network namespace" in out, out[-3000:]
    assert code == 130
