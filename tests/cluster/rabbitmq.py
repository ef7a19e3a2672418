"""A RabbitMQ cluster of three nodes on loopback, for the broker's failover test (``test_rabbitmq.py``).

Each node is a real ``rabbitmq-server`` (the installed 3.10) under a name of its
own (``hr<n>-<token>@localhost``), with its AMQP and distribution ports picked
free, its data, logs, pid file, config and environment file in this run's
directory, and no plugins. The shared node (``rabbit@localhost`` on 5672, run
by the system as user ``rabbitmq``) is never touched: our nodes read neither
``/etc/rabbitmq/rabbitmq-env.conf`` nor its cookie. They share a cookie of
their own, found through ``HOME`` (Erlang reads ``$HOME/.erlang.cookie``) by
the servers and by every ``rabbitmqctl`` call alike. epmd (4369) is shared with
the system's node, which is fine: it only maps names to ports.

Nodes two and three join the first (``stop_app``, ``join_cluster``,
``start_app``). ``Node.kill`` SIGKILLs a node's whole process group (the
machine is gone); ``Node.pause`` SIGSTOPs it (the machine hangs: its sockets
stay open, nothing answers) and ``Node.restore`` SIGCONTs it; ``Cluster.heal``
restarts whatever a test left down; ``Cluster.destroy`` kills
whatever is left, whatever the test did.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # the real script: /usr/sbin's would su rabbitmq
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
NODES = 3


def unavailable() -> str | None:
    """Why no cluster can be started here, or None."""
    if not SERVER.exists() or not CTL.exists():
        return "rabbitmq-server is not installed (apt-get install rabbitmq-server; make cluster-test checks)"
    if shutil.which("erl") is None:
        return "Erlang (erl) is not on PATH"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Node:
    name: str  # hr1-<token>@localhost
    port: int  # AMQP
    dist_port: int  # Erlang distribution (clustering, rabbitmqctl)
    root: Path  # the cluster's directory: HOME (the cookie), the env file
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    paused: bool = False

    @property
    def short(self) -> str:
        return self.name.split("@", 1)[0]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        base = self.root / self.short
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(self.root),  # $HOME/.erlang.cookie: the cluster's own cookie
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),  # not /etc's (NODENAME, …)
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins-expand"),
            "RABBITMQ_LOGS": str(base / "log" / "node.log"),
            # Erlang distribution on loopback only, as the system's node does.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> None:
        base = self.root / self.short
        for sub in ("mnesia", "log"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            # The machine is shared: no alarm because three nodes and the system's together look big.
            "vm_memory_high_watermark.absolute = 512MB\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        (base / "advanced.config").write_text("[].\n")
        with (base / "log" / "console.log").open("ab") as console:
            self.process = subprocess.Popen(
                [str(SERVER)],
                cwd=base,
                env=self.env(),
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes beam and its helpers with it
            )

    def ctl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """``rabbitmqctl -n <this node> args…`` with the cluster's cookie; its stdout."""
        done = subprocess.run(
            [str(CTL), "-n", self.name, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"rabbitmqctl -n {self.name} {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def wait_started(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                # The CLI is an Erlang VM of its own: on a loaded machine it takes seconds just to start.
                done = subprocess.run(
                    [str(CTL), "-n", self.name, "await_startup", "--timeout", "30"],
                    env=self.env(),
                    capture_output=True,
                    timeout=90,
                )
            except subprocess.TimeoutExpired:
                continue
            if done.returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError(f"{self.name} did not start within {timeout}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        """Running and answering: a paused node is neither asked nor counted."""
        return self.process is not None and self.process.poll() is None and not self.paused

    def pause(self) -> None:
        """SIGSTOP the node's process group: a hung machine, whose connections stay open unanswered."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def restore(self) -> None:
        """SIGCONT what ``pause`` stopped."""
        if self.process is not None and self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGCONT)
            self.paused = False

    def kill(self) -> None:
        """SIGKILL the node's process group: beam, its port helpers, the start script."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.paused = False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def log_tail(self, chars: int = 4000) -> str:
        text = ""
        for log in sorted((self.root / self.short / "log").glob("*.log")):
            text += f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}\n"
        return text


@dataclass
class Cluster:
    root: Path
    nodes: list[Node]

    def url(self, order: list[Node] | None = None) -> str:
        """The broker URL naming every node, ``;``-separated (kombu fails over along the list)."""
        return ";".join(node.url for node in order or self.nodes)

    def alive(self) -> list[Node]:
        return [node for node in self.nodes if node.alive()]

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def queues(self) -> dict[str, dict]:
        """Every queue as a live node sees it: type, leader, members, messages."""
        ask = self.alive()[0]
        out = ask.ctl("list_queues", "--formatter", "json", "-q", "name", "type", "leader", "members",
                      "online", "messages")  # fmt: skip
        return {row["name"]: row for row in json.loads(out or "[]")}

    def running_nodes(self) -> list[str]:
        status = json.loads(self.alive()[0].ctl("cluster_status", "--formatter", "json"))
        return sorted(status.get("running_nodes", []))

    def heal(self, timeout: float = 180) -> None:
        """Every node running and in the cluster again: a killed or paused one restarted (its data kept:
        it rejoins as itself)."""
        for node in self.nodes:
            if node.paused:  # resumed, it would stay partitioned from the others (RabbitMQ's default
                node.kill()  # cluster_partition_handling, ignore): restarted instead, as a killed one
            if not node.alive():
                node.start()
        for node in self.nodes:
            node.wait_started()
        deadline = time.monotonic() + timeout
        while len(self.running_nodes()) < len(self.nodes):
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster not healed: {self.running_nodes()}")
            time.sleep(0.5)

    def destroy(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def create(root: Path, count: int = NODES) -> Cluster:
    """Start ``count`` nodes and join them into one cluster; on any failure, kill what started."""
    root.mkdir(parents=True, exist_ok=True)
    cookie = root / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(20).upper())
    cookie.chmod(0o400)  # Erlang refuses a cookie others can read
    (root / "rabbitmq-env.conf").write_text("")
    (root / "enabled_plugins").write_text("[].\n")
    token = secrets.token_hex(3)
    nodes = [Node(f"hr{n}-{token}@localhost", free_port(), free_port(), root) for n in range(1, count + 1)]
    cluster = Cluster(root, nodes)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_started()
        first = nodes[0]
        for node in nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app")
        deadline = time.monotonic() + 60
        while len(cluster.running_nodes()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster incomplete: {cluster.running_nodes()}")
            time.sleep(0.5)
    except BaseException:
        cluster.destroy()
        raise
    return cluster
