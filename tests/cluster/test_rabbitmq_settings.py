"""RabbitMQ as the broker: what an ``amqp://`` ``CELERY_BROKER_URL`` turns on, and what it leaves alone.

Settings only, in ``make test`` (no server): ``config/settings.py`` is run
afresh with the environment given, and a Celery app of its own is built from
what it set, as ``config/celery.py`` builds the real one. A real three-node
cluster with a node killed mid-run is ``make cluster-test`` (``test_rabbitmq.py``).
"""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Connection

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
    assert app.conf.broker_transport_options == {"confirm_publish": True}
    # The worker sees quorum queues, so it asks for a per-consumer prefetch (no global QoS, which quorum
    # queues refuse), still one message per pool process.
    assert app.conf.worker_detect_quorum_queues is True
    assert detect_quorum_queues(app, "amqp") == (True, "region.eu")
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.broker_connection_retry_on_startup is True


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


def test_redis_keeps_classic_queues_and_its_visibility_timeout(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, "redis://127.0.0.1:6379/0")
    assert app.amqp.queues["region.eu"].queue_arguments is None
    assert app.amqp.queues["audit"].queue_arguments is None
    assert app.amqp.queues["region.eu"].exchange.type == "direct"
    assert app.conf.broker_transport_options == {"visibility_timeout": 300.0}
    assert detect_quorum_queues(app, "redis") == (False, "")
    assert app.conf.worker_consumer == "celery.worker.consumer:Consumer"


def test_the_embedded_filesystem_broker_is_unchanged(monkeypatch, tmp_path):
    app = celery_app(monkeypatch, tmp_path, "filesystem://")
    assert app.amqp.queues["region.eu"].queue_arguments is None
    assert app.conf.broker_transport == "config.broker:Transport"
    assert app.conf.worker_pool == "threads"
    assert app.conf.broker_transport_options["data_folder_in"] == str(tmp_path / "broker" / "queue")
