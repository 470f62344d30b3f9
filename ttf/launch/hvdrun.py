"""Starts this host's ranks of a multi-host Horovod job, without ssh.

    python -m ttf.launch.hvdrun --hosts 10.0.0.1:2,10.0.0.2:2 --host-index 0 \\
        -- python models/train.py --horovod --tiacc

Run it once on every host with the same --hosts (host:ranks, in rank order); host i passes
--host-index i. Ranks are assigned as horovodrun assigns them. Host 0 also serves Horovod's
Gloo rendezvous (the HTTP key-value store horovodrun would start, no authentication) on
--rendezvous (default <host 0>:29500), listening on that address only, not on every interface;
every rank gets horovodrun's environment (HOROVOD_RANK, HOROVOD_SIZE,
HOROVOD_LOCAL_RANK, ..., HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_GLOO_IFACE), so the
command runs exactly as under `horovodrun --gloo -H ...`, with no ssh between hosts.
(`./start_all.sh --hvd --hvd-hosts ... --hvd-host-index I` runs this.)

If a rank on this host stops with an error, the other ranks here are stopped and this exits
1 with a line naming the rank; ranks on other hosts lose their peer and stop with an error too.
Exit codes: 0 every local rank finished, 1 a rank failed, 2 bad usage.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil  # a horovod dependency
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

# Seconds the ranks get to finish after a SIGTERM to this launcher (a --stream job publishes and
# checkpoints), before SIGKILL; after another rank failed, 10.
STOP_GRACE_SECONDS = 300


def interface_of(address):
    """The network interface holding IPv4 `address` on this host (for Gloo), or None."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


def loopback_hostname():
    """This host's name, when it resolves to a loopback address (else None).

    Horovod 0.28 builds the Gloo context of its process sets (every collective runs on one)
    from the address this host's name resolves to, not from HOROVOD_GLOO_IFACE: with a
    loopback address there, ranks on other hosts get 127.0.0.1 to connect to and abort."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return None
    return name if address.startswith("127.") else None


def wait_for_port(host, port, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def _parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", required=True, help="host:ranks,host:ranks of every host, in rank order")
    parser.add_argument("--host-index", type=int, required=True, help="this host's position in --hosts")
    parser.add_argument("--rendezvous", default=None,
                        help="address:port of the Gloo rendezvous server on host 0 (default <host 0>:29500)")
    parser.add_argument("--iface", default=None,
                        help="network interface Gloo uses here (default: the one holding this host's address)")
    parser.add_argument("--start-timeout", type=float, default=None,
                        help="seconds to wait for host 0's rendezvous server (default: $TTF_START_TIMEOUT, or 300)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command every rank runs")
    return parser


class _Launch:
    """This host's part of the job, from the flags: every usage error is parser.error (exit 2)."""

    def __init__(self, parser, args):
        self.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        self.host_index, self.start_timeout = args.host_index, args.start_timeout
        if self.start_timeout is None:
            try:
                self.start_timeout = float(os.environ.get("TTF_START_TIMEOUT", 300))
            except ValueError:
                parser.error(f"TTF_START_TIMEOUT must be a number of seconds, got {os.environ['TTF_START_TIMEOUT']!r}")
        if not self.command:
            parser.error("give the command each rank runs after --")
        try:
            hosts = parse_hosts(args.hosts)
        except ValueError as err:
            parser.error(f"--hosts {args.hosts!r}: {err}")
        if not 0 <= args.host_index < len(hosts):
            parser.error(f"--host-index {args.host_index} is outside the {len(hosts)} host(s) of --hosts")
        self.size = sum(h.slots for h in hosts)
        self.plan = get_host_assignments(hosts, self.size)
        self.me = hosts[args.host_index].hostname
        self.rv_host, _, self.rv_port = (args.rendezvous or f"{hosts[0].hostname}:29500").rpartition(":")
        if not self.rv_host or not self.rv_port.isdigit():
            parser.error(f"--rendezvous must be address:port, got {args.rendezvous!r}")
        try:
            self.address = socket.gethostbyname(self.me)  # --hosts may name hosts (a container network's DNS)
        except OSError as err:
            parser.error(f"host {args.host_index} of --hosts, {self.me!r}, does not resolve here ({err})")
        self.iface = args.iface or interface_of(self.address)
        if self.iface is None:
            parser.error(f"no network interface here holds {self.me} ({self.address}, host {args.host_index} of "
                         "--hosts); pass --iface")
        hostname = loopback_hostname() if len(hosts) > 1 else None
        if hostname is not None:
            parser.error(f"this host's name {hostname!r} resolves to a loopback address, and Horovod's Gloo "
                         f"connects other hosts' ranks to the address this name resolves to. Map it to "
                         f"{self.address} in /etc/hosts (e.g. `{self.address} {hostname}`; in a network namespace NS, "
                         f"/etc/netns/NS/hosts)")

    def rendezvous(self, parser):
        """Host 0 serves the rendezvous (returns its server); the others wait for it (None). False:
        host 0's never answered."""
        server = None
        if self.host_index == 0:
            try:  # listen on the rendezvous address alone: it serves anyone who reaches it
                rv_address = socket.gethostbyname(self.rv_host)
                server = RendezvousHTTPServer((rv_address, int(self.rv_port)), RendezvousHandler, 0)
            except OSError as err:
                parser.error(f"cannot serve the rendezvous on {self.rv_host}:{self.rv_port} here ({err}); "
                             "--rendezvous must name an address of host 0")
            server.init(self.plan)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            print(f"[hvdrun] Gloo rendezvous for {self.size} rank(s) listening on {rv_address}:{self.rv_port} "
                  f"(HTTP, no authentication); Gloo listens on {self.iface} ({self.address})", flush=True)
        elif not wait_for_port(self.rv_host, int(self.rv_port), self.start_timeout):
            print(f"[hvdrun] error: host 0's rendezvous server {self.rv_host}:{self.rv_port} did not answer within "
                  f"{self.start_timeout:.0f}s (--start-timeout, TTF_START_TIMEOUT); start host 0 first or check "
                  "--rendezvous", file=sys.stderr, flush=True)
            return False
        try:  # (after the wait: another container's name resolves once it runs)
            self.rv_host = socket.gethostbyname(self.rv_host)  # Horovod's rendezvous client wants an address
        except OSError as err:
            parser.error(f"the rendezvous host {self.rv_host!r} does not resolve here ({err})")
        return server

    def start_ranks(self):
        """{rank: process} of this host's ranks, each with horovodrun's environment."""
        ranks = {}
        for slot in self.plan:
            if slot.hostname != self.me:
                continue
            env = dict(os.environ, HOROVOD_HOSTNAME=slot.hostname, HOROVOD_RANK=str(slot.rank),
                       HOROVOD_SIZE=str(slot.size), HOROVOD_LOCAL_RANK=str(slot.local_rank),
                       HOROVOD_LOCAL_SIZE=str(slot.local_size), HOROVOD_CROSS_RANK=str(slot.cross_rank),
                       HOROVOD_CROSS_SIZE=str(slot.cross_size), HOROVOD_GLOO_RENDEZVOUS_ADDR=self.rv_host,
                       HOROVOD_GLOO_RENDEZVOUS_PORT=self.rv_port, HOROVOD_CONTROLLER="gloo",
                       HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=self.iface)
            ranks[slot.rank] = subprocess.Popen(self.command, env=env)
        print(f"[hvdrun] host {self.host_index} ({self.me}, {self.iface}): started rank(s) {sorted(ranks)} of "
              f"{self.size}", flush=True)
        return ranks


def supervise(ranks, server):
    """Waits for this host's ranks; a failed one stops the others here. Returns the exit code."""

    def stop_all(*_):
        for proc in ranks.values():
            if proc.poll() is None:
                proc.terminate()

    signalled = []

    def on_sigterm(*_):  # a user's stop: a stream job's ranks publish and checkpoint first (STOP_GRACE_SECONDS)
        signalled.append(True)
        stop_all()
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    failed = None
    try:
        while any(p.poll() is None for p in ranks.values()):
            for rank, proc in ranks.items():
                code = proc.poll()
                if code not in (None, 0) and failed is None:
                    failed = (rank, code)
                    why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                    print(f"[hvdrun] error: rank {rank} stopped ({why}); stopping the other ranks on this host. "
                          "Restart every host with the same --checkpoint-dir to resume.", file=sys.stderr, flush=True)
                    stop_all()
            time.sleep(0.5)
    except KeyboardInterrupt:
        stop_all()
        return 130
    finally:
        deadline = time.time() + (STOP_GRACE_SECONDS if signalled else 10)
        for proc in ranks.values():
            try:
                proc.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
        if server is not None:
            server.shutdown()
    if failed is None:
        failed = next(((r, p.returncode) for r, p in ranks.items() if p.returncode != 0), None)
        if failed:
            print(f"[hvdrun] error: rank {failed[0]} failed (exit code {failed[1]})", file=sys.stderr, flush=True)
    return 1 if failed else 0


def main(argv=None):
    parser = _parser()
    launch = _Launch(parser, parser.parse_args(argv))
    server = launch.rendezvous(parser)
    if server is False:
        return 1
    return supervise(launch.start_ranks(), server)


if __name__ == "__main__":
    sys.exit(main())
