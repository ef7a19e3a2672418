"""RabbitMQ as the broker: what an ``amqp://`` ``CELERY_BROKER_URL`` turns on, and what it leaves alone.

Settings only, in ``make test`` (no server): ``config/settings.py`` is run
afresh with the environment given, and a Celery app of its own is built from
what it set, as ``config/celery.py`` builds the real one. A real three-node
cluster with a node killed mid-run is ``make cluster-test`` (``test_rabbitmq.py``).
"""

from __future__ import annotations

import runpy
import socket
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from amqp import spec
from amqp.serialization import dumps
from celery import Celery
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Connection
from kombu.exceptions import OperationalError

from config import broker

SETTINGS = Path(__file__).resolve().parents[2] / "config" / "settings.py"
NODES = "amqp://app:pw@mq1:5672/durable;amqp://app:pw@mq2:5672/durable;amqp://app:pw@mq3:5672/durable"


def celery_app(monkeypatch, tmp_path, url: str, region: str = "eu") -> Celery:
    """A Celery app configured from the settings module as loaded with ``CELERY_BROKER_URL=url`` (and
    ``WORKER_REGION=region``); the environment is the test's own until it ends."""
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    monkeypatch.setenv("WORKER_REGION", region)
    monkeypatch.setenv("VAR_DIR", str(tmp_path))
    monkeypatch.setenv("DEBUG", "1")
    monkeypatch.delenv("CELERY_BROKER_KEY_PREFIX", raising=False)
    loaded = runpy.run_path(str(SETTINGS))
    app = Celery("settings-under-test", set_as_current=False)
    app.config_from_object(SimpleNamespace(**loaded), namespace="CELERY")
    return app


def published(app: Celery, **options) -> dict:
    """Where ``app`` would publish a doorbell for region eu (as ``tasks.doorbell.ring`` sends it)."""
    sent: dict = {}

    def capture(producer, name, message, **kw):
        if "queue" in kw:  # straight to the queue: its exchange and key
            sent.update(exchange=kw["queue"].exchange.name, routing_key=kw["queue"].routing_key)
        else:
            sent.update(exchange=kw["exchange"].name, routing_key=kw["routing_key"])

    app.amqp.send_task_message = capture
    app.send_task("tasks.run_task", args=["t-1"], queue="region.eu", retry=False, **options)
    return sent


@pytest.mark.parametrize("url", [NODES, "pyamqp://guest@127.0.0.1//"])
def test_an_amqp_broker_gets_quorum_queues_for_every_region_and_the_audit_queue(monkeypatch, tmp_path, url):
    app = celery_app(monkeypatch, tmp_path, url)
    for name in ("region.eu", "region.us", "audit"):  # its own region, another's doorbells, the anchor job
        queue = app.amqp.queues[name]
        assert queue.queue_arguments == {"x-queue-type": "quorum"}, name
        assert queue.durable
    assert app.amqp.router.route({}, "audit.anchor")["queue"].name == "audit"
    assert app.conf.task_default_queue == "region.eu"


def test_an_amqp_broker_confirms_publishes_and_keeps_one_doorbell_per_pool_process(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, NODES)
    assert app.conf.broker_transport_options["confirm_publish"] is True
    # The worker sees quorum queues, so it asks for a per-consumer prefetch (no global QoS, which quorum
    # queues refuse), still one message per pool process.
    assert app.conf.worker_detect_quorum_queues is True
    assert detect_quorum_queues(app, "amqp") == (True, "region.eu")
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.broker_connection_retry_on_startup is True


class HungNode:
    """An AMQP "node" on loopback that completes the handshake, opens channels, turns confirms on, declares
    and binds, and then confirms no publish while keeping the connection open: a RabbitMQ node SIGSTOPped
    (or a frozen VM) as the client published. It records the heartbeat each client asked for (its
    Tune-Ok) and counts the publishes."""

    def __init__(self, *, confirms: bool = False) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.confirms = confirms  # a node that answers: each publish confirmed (Basic.Ack)
        self.heartbeats: list[int] = []
        self.published = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(client,), daemon=True).start()

    @staticmethod
    def _method(channel: int, sig: tuple[int, int], argsig: str = "", args: tuple = ()) -> bytes:
        payload = struct.pack(">HH", *sig) + (dumps(argsig, args) if argsig else b"")
        return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"

    def _talk(self, client: socket.socket) -> None:
        def read(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = client.recv(n - len(data))
                if not chunk:
                    raise ConnectionError
                data += chunk
            return data

        with client:
            try:
                read(8)  # the protocol header
                start = (0, 9, {"capabilities": {"publisher_confirms": True}}, "PLAIN", "en_US")
                client.sendall(self._method(0, spec.Connection.Start, "ooFSS", start))
                while not self.stop.is_set():
                    kind, channel, size = struct.unpack(">BHI", read(7))
                    payload = read(size + 1)[:-1]
                    if kind != 1:
                        continue
                    sig = struct.unpack(">HH", payload[:4])
                    if sig == spec.Connection.StartOk:
                        client.sendall(self._method(0, spec.Connection.Tune, "BlB", (2047, 131072, 60)))
                    elif sig == spec.Connection.TuneOk:
                        self.heartbeats.append(struct.unpack(">H", payload[10:12])[0])
                    elif sig == spec.Connection.Open:
                        client.sendall(self._method(0, spec.Connection.OpenOk, "s", ("",)))
                    elif sig == spec.Channel.Open:
                        client.sendall(self._method(channel, spec.Channel.OpenOk, "s", ("",)))
                    elif sig == spec.Confirm.Select:
                        client.sendall(self._method(channel, spec.Confirm.SelectOk))
                    elif sig == spec.Exchange.Declare:
                        client.sendall(self._method(channel, spec.Exchange.DeclareOk))
                    elif sig == spec.Queue.Declare:
                        name = payload[7 : 7 + payload[6]].decode()  # after the ids and a reserved short
                        client.sendall(self._method(channel, spec.Queue.DeclareOk, "sll", (name, 0, 0)))
                    elif sig == spec.Queue.Bind:
                        client.sendall(self._method(channel, spec.Queue.BindOk))
                    elif sig == spec.Basic.Publish:
                        self.published += 1  # and its confirm never sent, unless the node answers
                        if self.confirms:
                            ack = self._method(channel, spec.Basic.Ack, "Lb", (self.published, False))
                            client.sendall(ack)
            except (ConnectionError, OSError):
                return

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@pytest.fixture
def hung_node():
    node = HungNode()
    yield node
    node.close()


def test_a_doorbell_published_to_a_node_that_stopped_answering_fails_within_broker_socket_timeout(
    monkeypatch, tmp_path, hung_node
):
    # It used to wait forever: py-amqp reads without a timeout, and a publish waits for its confirm.
    monkeypatch.setenv("BROKER_SOCKET_TIMEOUT", "1")
    app = celery_app(monkeypatch, tmp_path, f"amqp://guest:guest@127.0.0.1:{hung_node.port}//")
    outcome: list[BaseException | None] = []

    def publish() -> None:
        try:
            with app.connection_for_write() as conn:
                app.send_task("tasks.run_task", args=["t-1"], queue="region.eu", retry=False, connection=conn)
        except Exception as exc:  # what tasks.doorbell.ring logs, leaving the task to the sweep
            outcome.append(exc)
        else:
            outcome.append(None)

    started = time.monotonic()
    publishing = threading.Thread(target=publish, daemon=True)
    publishing.start()
    publishing.join(timeout=20)
    assert outcome, "the publish still waits for a node that answers nothing"
    # Its confirm never came: the socket read timed out, and kombu raised it as a connection error.
    assert hung_node.published == 1
    assert isinstance(outcome[0], OperationalError), outcome
    assert isinstance(outcome[0].__cause__, TimeoutError), outcome[0].__cause__
    assert time.monotonic() - started < 10
    # A web (or beat) process's connection asks for no AMQP heartbeat: it drains nothing between
    # publishes, so it could not answer the node's. Workers' connections do (below).
    assert hung_node.heartbeats == [0]


class SilentNode:
    """A node that accepts the TCP connection (the kernel does, for a SIGSTOPped RabbitMQ) and never
    answers the AMQP handshake."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        held = []
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            held.append(client)  # kept open, read by no one

    def close(self) -> None:
        self.server.close()


def test_a_doorbell_whose_first_node_hangs_is_published_on_the_next_one(monkeypatch, tmp_path):
    # It used to fail at the first node, ring after ring: kombu spent its whole connection budget (the
    # handshake timeout) on that node's handshake and never tried the next one listed.
    monkeypatch.setenv("BROKER_SOCKET_TIMEOUT", "1")
    silent, answering = SilentNode(), HungNode(confirms=True)
    try:
        app = celery_app(
            monkeypatch,
            tmp_path,
            f"amqp://guest:guest@127.0.0.1:{silent.port}//;amqp://guest:guest@127.0.0.1:{answering.port}//",
        )
        started = time.monotonic()
        app.send_task("tasks.run_task", args=["t-1"], queue="region.eu", retry=False)  # as the doorbell
        assert silent.accepted == 1 and answering.published == 1
        assert time.monotonic() - started < 5  # one handshake timeout (1 s), then the next node
        # The pooled connection stays on the node that answered: the next ring does not wait again.
        started = time.monotonic()
        app.send_task("tasks.run_task", args=["t-2"], queue="region.eu", retry=False)
        assert answering.published == 2 and silent.accepted == 1
        assert time.monotonic() - started < 1
    finally:
        silent.close()
        answering.close()


def test_an_amqp_worker_heartbeats_and_bounds_every_socket_wait(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, NODES)
    options = app.conf.broker_transport_options
    assert options["read_timeout"] == options["write_timeout"] == 5.0  # BROKER_SOCKET_TIMEOUT
    assert app.conf.broker_connection_timeout == 5.0  # the AMQP handshake of a node accepting, not answering
    # Celery's worker consumer (and its event dispatcher) connects with broker_heartbeat; nothing else does.
    assert app.conf.broker_heartbeat == 10
    # Every option above reaches amqp.Connection (kombu's pyamqp transport passes its options through).
    reached: dict = {}

    class Recorder:
        def __init__(self, **kwargs):
            reached.update(kwargs)
            raise ConnectionRefusedError

    monkeypatch.setattr("kombu.transport.pyamqp.Transport.Connection", Recorder)
    worker = app.connection_for_read(heartbeat=app.conf.broker_heartbeat)
    with pytest.raises(ConnectionRefusedError):
        worker.transport.establish_connection()
    assert reached["read_timeout"] == reached["write_timeout"] == reached["connect_timeout"] == 5.0
    assert reached["heartbeat"] == 10.0


def test_every_node_listed_is_a_failover_target(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, NODES)
    connection = Connection(app.conf.broker_url)
    assert [url.split("@")[1] for url in connection.alt] == [
        "mq1:5672/durable",
        "mq2:5672/durable",
        "mq3:5672/durable",
    ]
    assert connection.failover_strategy is not None


def test_a_countdown_goes_through_rabbitmqs_native_delayed_delivery(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, NODES)
    assert app.conf.broker_native_delayed_delivery_queue_type == "quorum"
    # Topic exchanges: native delayed delivery cannot route through direct ones.
    assert app.amqp.queues["region.eu"].exchange.type == "topic"
    delayed = published(app, countdown=5)
    assert delayed["exchange"] == "celery_delayed_27"
    assert delayed["routing_key"].endswith(".1.0.1.region.eu")  # 5 in binary, then the queue's key
    assert published(app) == {"exchange": "region.eu", "routing_key": "region.eu"}


def test_delayed_delivery_is_set_up_through_the_node_the_worker_is_on_not_every_node_listed(
    monkeypatch, tmp_path
):
    app = celery_app(monkeypatch, tmp_path, NODES)
    assert app.conf.worker_consumer == "config.broker:Consumer"
    assert "config.broker:DelayedDelivery" in broker.Consumer.Blueprint.default_steps
    assert (
        "celery.worker.consumer.delayed_delivery:DelayedDelivery"
        not in broker.Consumer.Blueprint.default_steps
    )
    on = Connection(app.conf.broker_url)
    on.maybe_switch_next()  # the worker failed over from mq1 to mq2
    tried: list[str] = []
    step = broker.DelayedDelivery.__new__(broker.DelayedDelivery)
    monkeypatch.setattr(step, "_setup_delayed_delivery", lambda c, url: tried.append(url), raising=False)
    step.start(SimpleNamespace(app=app, connection=on))
    assert tried == ["amqp://app:pw@mq2:5672/durable"]


def test_an_amqp_worker_publishes_no_events_skips_mingle_and_takes_no_remote_control(monkeypatch, tmp_path):
    # Its event loop published a worker-heartbeat event every 2 s and waited for the confirm: a hung node
    # held it there, and Mingle's broadcast the same way after each reconnect (config/broker.py).
    app = celery_app(monkeypatch, tmp_path, NODES)
    assert app.conf.worker_consumer == "config.broker:Consumer"
    made = broker.Consumer(
        lambda *a: None,
        app=app,
        hostname="w@h",
        pool=None,
        hub=None,
        controller=SimpleNamespace(use_eventloop=True),
        worker_options={"without_heartbeat": False, "without_gossip": False, "without_mingle": False},
        task_events=False,
    )
    enabled = {name.rsplit(".", 1)[1]: step.enabled for name, step in made.blueprint.steps.items()}
    assert enabled["Heart"] is enabled["Events"] is enabled["Gossip"] is enabled["Mingle"] is False
    assert enabled["Connection"] is enabled["Tasks"] is enabled["DelayedDelivery"] is True
    # Nor remote control: its exclusive pidbox queue, left on a hung node, was refused on a survivor.
    assert app.conf.worker_enable_remote_control is False


def test_redis_keeps_classic_queues_and_its_visibility_timeout(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, "redis://127.0.0.1:6379/0")
    assert app.amqp.queues["region.eu"].queue_arguments is None
    assert app.amqp.queues["audit"].queue_arguments is None
    assert app.amqp.queues["region.eu"].exchange.type == "direct"
    assert app.conf.broker_transport_options == {"visibility_timeout": 300.0}
    assert app.conf.broker_heartbeat == 120  # Celery's default: the amqp settings stay amqp's
    assert app.conf.broker_connection_timeout == 4  # Celery's default
    assert app.conf.worker_enable_remote_control is True
    assert detect_quorum_queues(app, "redis") == (False, "")
    assert app.conf.worker_consumer == "celery.worker.consumer:Consumer"


def test_the_embedded_filesystem_broker_is_unchanged(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, "filesystem://")
    assert app.amqp.queues["region.eu"].queue_arguments is None
    assert app.conf.broker_transport == "config.broker:Transport"
    assert app.conf.worker_pool == "threads"
    assert app.conf.broker_transport_options["data_folder_in"] == str(tmp_path / "broker" / "queue")
