"""Worker hosts of their own: network namespaces on veth links, a private PostgreSQL they reach over them.

A worker started with ``ip netns exec`` lives on another "host": its only way
out is its veth link to the host (``10.251.<n>.<4i+1>`` here, ``.<4i+2>`` in
namespace ``i``; one /30 per namespace). Host loopback is closed to it, so:

- the database is a ``PrivateServer`` (``initdb`` in a temporary directory,
  never the shared cluster on 5432) listening on loopback and on every link's
  host end, trusting those subnets;
- the sandbox (pytest's ``live_server`` on loopback) is reached through a
  ``Relay`` listening on each link's host end.

Faults are ``iptables`` rules (the kernel's x_tables; ``iptables`` is a Debian
package, ``scripts/ensure-partition-packages``): ``cut`` drops every packet of
the link both ways, silently, as a switch that died or a cable pulled would (no
RST, no ICMP: TCP just retransmits); ``cut_port`` drops only the TCP packets to
and from one host port (the sandbox alone unreachable). ``heal`` deletes them.
Latency is added by a ``Relay`` with a ``delay`` on the path (this kernel has
no netem qdisc).

``Network.destroy`` deletes the host's rules and the namespaces (their veth pairs
and rules go with them); it is called from fixture finalizers, so a failing test leaves nothing.
Everything here needs root and iproute2: ``unavailable`` says why not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.standby import SETTINGS, Cluster, _run, bindir

ROOT = Path(__file__).resolve().parents[2]  # manage.py's directory (no Django needed here)
PREFIX = "dwp"  # every namespace and veth of these tests starts so (interface names: 15 characters at most)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, veth, iptables)"
    if shutil.which("ip") is None:
        return "ip (iproute2) is not installed"
    if shutil.which("iptables") is None:
        return "iptables is not installed: scripts/ensure-partition-packages (make partition-test does)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.strip()}"
    return None


def iptables() -> str:
    """``iptables``, or ``iptables-legacy`` where the kernel has no nf_tables (x_tables only)."""
    for name in ("iptables", "iptables-legacy"):
        if shutil.which(name) and subprocess.run([name, "-S"], capture_output=True).returncode == 0:
            return name
    raise AssertionError("iptables does not work here (scripts/ensure-partition-packages)")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


@dataclass
class Host:
    """One namespace (a worker host) and its link: ``outer`` on the host, ``inner`` inside."""

    name: str
    outer: str  # the host end's interface
    inner: str  # the namespace's end
    host_ip: str  # the host end's address: what the namespace dials
    ip: str  # the namespace's address: what the server sees as the client
    _rules: list[tuple[list[str], list[str]]] = field(default_factory=list)  # what ``heal`` deletes

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.name, *argv, check=check)

    def cut(self) -> None:
        """Every packet of the link dropped, both ways (the namespace's processes live on)."""
        self._drop([])

    def cut_port(self, port: int) -> None:
        """Only the link's TCP packets to or from ``port`` on the host end dropped (both ways)."""
        self._drop(["-p", "tcp"], port)

    def _drop(self, match: list[str], port: int | None = None) -> None:
        # Both rules on arrival (INPUT): a packet dropped on its way out (OUTPUT) fails the sender's
        # send with EPERM at once, which no real partition does. The host's rule names this link's
        # interface alone, and ``heal`` deletes it by the same words.
        inbound = [*match, *(["--dport", str(port)] if port else [])]
        outbound = [*match, *(["--sport", str(port)] if port else [])]
        rule = (["INPUT", "-i", self.outer, *inbound, "-j", "DROP"], ["INPUT", "-i", self.inner, *outbound,
                "-j", "DROP"])  # fmt: skip
        sh(iptables(), "-I", *rule[0])
        self.run(iptables(), "-I", *rule[1])
        self._rules.append(rule)

    def heal(self) -> None:
        """Every rule ``cut`` and ``cut_port`` added deleted: the link carries everything again."""
        while self._rules:
            host_rule, inner_rule = self._rules.pop()
            sh(iptables(), "-D", *host_rule, check=False)
            self.run(iptables(), "-D", *inner_rule, check=False)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the pid is the process's own)."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)


@dataclass
class Network:
    """``count`` worker hosts, each on its own /30 link to this one."""

    subnet: int  # the third octet of 10.251.<subnet>.0/24
    hosts: list[Host] = field(default_factory=list)

    @property
    def cidr(self) -> str:
        return f"10.251.{self.subnet}.0/24"

    @classmethod
    def create(cls, count: int) -> Network:
        tag = os.getpid() % 10000
        network = cls(subnet=os.getpid() % 250 + 1)
        try:
            for i in range(count):
                host = Host(
                    name=f"{PREFIX}{tag}n{i}",
                    outer=f"{PREFIX}{tag}h{i}",
                    inner=f"{PREFIX}{tag}w{i}",
                    host_ip=f"10.251.{network.subnet}.{4 * i + 1}",
                    ip=f"10.251.{network.subnet}.{4 * i + 2}",
                )
                network.hosts.append(host)
                sh("ip", "netns", "add", host.name)
                sh("ip", "link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
                sh("ip", "link", "set", host.inner, "netns", host.name)
                sh("ip", "addr", "add", f"{host.host_ip}/30", "dev", host.outer)
                sh("ip", "link", "set", host.outer, "up")
                host.run("ip", "addr", "add", f"{host.ip}/30", "dev", host.inner)
                host.run("ip", "link", "set", host.inner, "up")
                host.run("ip", "link", "set", "lo", "up")
        except BaseException:
            network.destroy()
            raise
        return network

    def destroy(self) -> None:
        """Delete every namespace (its veth end, hence the pair, goes with it) and any pair left over."""
        for host in self.hosts:
            host.heal()  # the host's own rules first: they would outlive the namespace
            sh("ip", "netns", "del", host.name, check=False)
            sh("ip", "link", "del", host.outer, check=False)  # gone with its peer already, normally


class PrivateServer(Cluster):
    """A PostgreSQL server of its own on loopback and on each of ``listen``, trusting ``cidr``."""

    def __init__(self, directory: Path, *, listen: Sequence[str], cidr: str, settings: str = ""):
        super().__init__(directory)
        self.listen = list(listen)
        self.cidr = cidr
        self.settings = settings  # more ``-c name=value`` for the server

    @classmethod
    def create(cls, root: Path, *, listen: Sequence[str], cidr: str, settings: str = "") -> PrivateServer:
        server = cls(root / "server", listen=listen, cidr=cidr, settings=settings)
        server._mkdir()
        _run([str(bindir() / "initdb"), "-D", str(server.data), "-U", "postgres", "-A", "trust",
              "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])  # fmt: skip
        with (server.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {cidr} trust\n")
        server.start()
        return server

    def start(self) -> None:
        addresses = ",".join(["127.0.0.1", *self.listen])
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses={addresses} {SETTINGS} {self.settings}"
        )
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
              "-t", "60", "start"])  # fmt: skip

    def url_from(self, host: Host, dbname: str) -> str:
        """The URL a process in ``host`` dials."""
        return f"postgres://postgres@{host.host_ip}:{self.port}/{dbname}"


class Relay:
    """A TCP relay: connections to ``(address, port)`` for each of ``addresses`` carried to ``upstream``.

    ``delay`` (seconds, changeable at any time) holds each chunk that long before passing it on, in
    each direction: every request/answer round trip through the relay takes ``2 * delay`` longer.
    (This machine's kernel has no netem, the usual way to add latency to a link: the relay is
    where the latency goes.)
    """

    def __init__(self, addresses: Sequence[str], upstream: tuple[str, int], delay: float = 0.0):
        self.upstream = upstream
        self.delay = delay
        self.requests = 0  # chunks carried from a client to upstream: each query, near enough, one
        first = socket.create_server((addresses[0], 0))
        self.port: int = first.getsockname()[1]
        self._listeners = [first, *(socket.create_server((a, self.port)) for a in addresses[1:])]
        for listener in self._listeners:
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst, asks in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, asks), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, asks: bool) -> None:
        """Read ``src``, write ``dst`` each chunk once its ``delay`` passed (in order, by a second thread);
        ``asks``: ``src`` is the client (its chunks are counted as requests)."""
        queue: deque[tuple[float, bytes]] = deque()
        ready = threading.Condition()
        threading.Thread(target=_send_due, args=(queue, ready, dst, src), daemon=True).start()
        try:
            while data := src.recv(65536):
                if asks:
                    self.requests += 1
                with ready:
                    queue.append((time.monotonic() + self.delay, data))
                    ready.notify()
        except OSError:
            pass
        finally:
            with ready:
                queue.append((0.0, b""))  # the end: the sender closes both once it gets here
                ready.notify()

    def close(self) -> None:
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.close()


def _send_due(queue: deque[tuple[float, bytes]], ready: threading.Condition, dst: socket.socket,
              src: socket.socket) -> None:  # fmt: skip
    try:
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            if not data:
                break
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def start_worker(
    host: Host,
    *,
    database_url: str,
    sandbox_url: str,
    lease_ttl: float,
    concurrency: int,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """``manage.py run_worker --sweep`` inside ``host``; its output (stdout and stderr) on a pipe."""
    return host.popen(
        [sys.executable, "manage.py", "run_worker", "--sweep", "--idle", "0.1", "--lease-ttl", str(lease_ttl),
         "--concurrency", str(concurrency)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "SANDBOX_BASE_URL": sandbox_url,
             "CELERY_BROKER_URL": "memory://", "CONNECTOR_TIMEOUT": "2", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
