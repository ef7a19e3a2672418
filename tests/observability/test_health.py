"""``/healthz`` and ``/readyz``: what a load balancer or an orchestrator is told, and when.

Readiness is tested against the real failures: the database at a port nothing
listens on, a migration recorded as not applied, a broker that refuses
connections.
"""

from __future__ import annotations

import copy
import json
import socket

import pytest
from django.db import connections
from django.db.migrations.recorder import MigrationRecorder

from config import health

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def forget_health():
    health.forget()
    yield
    health.forget()


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answer(response) -> dict:
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    return json.loads(response.content)


def test_healthz_says_ok_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert answer(response) == {"status": "ok", "checks": {"process": "ok"}}


def test_readyz_is_ready_when_database_migrations_and_broker_are(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    # The test settings keep the embedded file broker: nothing to reach.
    assert answer(response) == {
        "status": "ready",
        "checks": {"database": "ok", "migrations": "ok", "broker": "skipped"},
    }


def test_probes_are_answered_whatever_the_host_and_over_plain_http(client, settings):
    """A probe addresses the pod by IP over plain HTTP: no 400 for the host, no 301 to https."""
    settings.ALLOWED_HOSTS = ["console.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    for path in ("/healthz", "/readyz", "/readyz/"):
        assert client.get(path, HTTP_HOST="10.1.2.3:8000").status_code == 200, path
    assert (
        client.get("/console/", HTTP_HOST="10.1.2.3:8000").status_code == 400
    )  # everything else still checks


def test_probes_answer_only_reads(client):
    response = client.post("/readyz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
    assert client.head("/healthz").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_when_the_database_is_unreachable(client):
    connection = connections["default"]
    saved = copy.deepcopy(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = closed_port()
    # Straight to that port: not through a pool an in-process worker may have left configured.
    connection.settings_dict["OPTIONS"] = {k: v for k, v in saved["OPTIONS"].items() if k != "pool"}
    try:
        response = client.get("/readyz")
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert response.status_code == 503
    assert answer(response) == {
        "status": "not ready",
        "checks": {"database": "unreachable", "migrations": "not checked", "broker": "skipped"},
    }
    health.forget()
    assert client.get("/readyz").status_code == 200  # and ready again once it answers


def test_readyz_is_503_while_a_migration_is_not_applied(client):
    latest = MigrationRecorder.Migration.objects.filter(app="tasks").order_by("-id").first()
    latest.delete()  # as if the deployment's newest migration had not been run yet
    response = client.get("/readyz")
    assert response.status_code == 503
    assert answer(response)["checks"]["migrations"] == "pending"

    MigrationRecorder.Migration.objects.create(app=latest.app, name=latest.name)  # `migrate` ran
    health.forget()
    assert client.get("/readyz").status_code == 200


def test_a_positive_migration_answer_is_kept_and_the_plan_not_read_again(client):
    calls = []

    def plan():
        calls.append(1)
        return []

    assert health.check_migrations(plan) == "ok"
    assert health.check_migrations(plan) == "ok"
    assert calls == [1]


def test_readyz_is_503_when_a_configured_broker_does_not_answer(client, settings):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{closed_port()}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert answer(response)["checks"] == {"database": "ok", "migrations": "ok", "broker": "unreachable"}


def test_probes_arriving_together_share_one_check(client, django_assert_max_num_queries):
    client.get("/readyz")
    with django_assert_max_num_queries(0):
        for _ in range(5):
            assert client.get("/readyz").status_code == 200
