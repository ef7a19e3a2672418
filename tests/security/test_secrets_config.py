"""Credentials are configured apart from URLs (issue 12, item 2).

A URL carrying ``user:pass@`` stops every process at start-up, naming the
variable but never the secret; connectors and the model authenticate with a
bearer header; approvers' evidence links come from a public base and cannot
climb out of ``/records/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalRequest
from approvals.selectors import evidence_url
from config import external
from ledger.connectors.http import HTTPConnector
from runtime.llm import OpenAICompatibleModel
from tasks import checkpoints, decisions, registry
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-s3cret"


# --- start-up ----------------------------------------------------------------------------------


def start(extra: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (default: django.setup(), what the web server and Celery do) in a fresh process."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CONNECTOR_", "MODEL_", "SANDBOX_"))
    }
    env.update({"DEBUG": "1", "SECRET_KEY": "x" * 50, "DJANGO_SETTINGS_MODULE": "config.settings", **extra})
    argv = list(command) or [sys.executable, "-c", "import django; django.setup(); print('started')"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_model_url_with_a_credential_stops_the_process_naming_the_variable_not_the_secret():
    refused = start({"MODEL_URL": f"https://svc:{SECRET}@model.example/v1"})
    assert refused.returncode != 0 and "started" not in refused.stdout
    assert "MODEL_URL holds a user name or password" in refused.stderr
    assert "MODEL_API_KEY" in refused.stderr
    assert SECRET not in refused.stderr + refused.stdout


def test_the_same_process_starts_with_the_credential_moved_to_its_own_variable():
    started = start({"MODEL_URL": "https://model.example/v1", "MODEL_API_KEY": SECRET})
    assert started.returncode == 0, started.stderr
    assert "started" in started.stdout


def test_management_commands_refuse_a_connector_url_with_a_credential():
    refused = start(
        {"CONNECTOR_ORDERS_URL": f"http://svc:{SECRET}@orders.example"},
        sys.executable,
        "manage.py",
        "check",
    )
    assert refused.returncode != 0
    assert "CONNECTOR_ORDERS_URL holds a user name or password" in refused.stderr
    assert "CONNECTOR_ORDERS_TOKEN" in refused.stderr
    assert SECRET not in refused.stderr + refused.stdout


@pytest.mark.parametrize(
    "variable",
    ["MODEL_URL", "SANDBOX_BASE_URL", "CONNECTOR_PAYMENTS_URL", "CONNECTOR_ORDERS_PUBLIC_URL"],
)
def test_every_configured_url_with_user_info_is_refused(variable):
    with pytest.raises(ImproperlyConfigured, match=variable) as refused:
        external.refuse_credentials_in_urls({variable: f"https://user:{SECRET}@host.example/base"})
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    ["https://host.example/base?next=a@b", "http://127.0.0.1:8000/sandbox", "https://host.example/u@x"],
)
def test_an_at_sign_outside_the_authority_is_not_a_credential(url):
    external.refuse_credentials_in_urls({"MODEL_URL": url, "CONNECTOR_ORDERS_URL": url})


def test_each_connector_variable_is_read_under_its_own_suffix():
    environ = {
        "CONNECTOR_ORDERS_URL": "https://orders.example",
        "CONNECTOR_ORDERS_PUBLIC_URL": "https://orders.example/ui",
        "CONNECTOR_ORDERS_TOKEN": SECRET,
        "CONNECTOR_ORDERS_HEADERS": '{"X-Tenant": "acme"}',
        "CONNECTOR_TIMEOUT": "5",
    }
    assert external.connector_values(environ, "_URL") == {"orders": "https://orders.example"}
    assert external.connector_values(environ, "_PUBLIC_URL") == {"orders": "https://orders.example/ui"}
    assert external.connector_values(environ, "_TOKEN") == {"orders": SECRET}
    assert external.connector_headers(environ) == {"orders": {"X-Tenant": "acme"}}


@pytest.mark.parametrize("text", ["not json", '["X-Key"]', '{"X-Key": 1}', '{"X-Key": "a\\r\\nX-Evil: 1"}'])
def test_connector_headers_that_are_not_an_object_of_strings_are_refused(text):
    with pytest.raises(ImproperlyConfigured, match="CONNECTOR_ORDERS_HEADERS must be a JSON object"):
        external.connector_headers({"CONNECTOR_ORDERS_HEADERS": text})


# --- connectors and the model authenticate by header -------------------------------------------


def serving(monkeypatch, answer: httpx.Response) -> list[httpx.Request]:
    """The shared client records each request and answers a POST with ``answer``, a GET with 404."""
    asked: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return answer if request.method == "POST" else httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(handle))
    monkeypatch.setattr("config.http.client", lambda: client)
    return asked


def test_a_connector_sends_its_token_as_a_bearer_header_and_its_headers(monkeypatch, settings):
    settings.CONNECTOR_URLS = {"payments": "https://pay.example/api"}
    settings.CONNECTOR_TOKENS = {"payments": SECRET}
    settings.CONNECTOR_HEADERS = {"payments": {"X-Tenant": "acme"}}
    asked = serving(monkeypatch, httpx.Response(201, json={"id": "p-1", "status": "succeeded"}))
    connector = HTTPConnector("payments")
    connector.dispatch("k-1", {"amount": "1.00"})
    connector.lookup("k-1")
    connector.read("R-1")
    assert [request.headers["Authorization"] for request in asked] == [f"Bearer {SECRET}"] * 3
    assert {request.headers["X-Tenant"] for request in asked} == {"acme"}
    assert asked[0].headers["Idempotency-Key"] == "k-1"
    assert all(SECRET not in str(request.url) and not request.url.userinfo for request in asked)


def test_a_connector_left_on_the_sandbox_sends_the_sandbox_token(monkeypatch, settings):
    settings.CONNECTOR_URLS = {}
    settings.CONNECTOR_TOKENS = {}
    settings.SANDBOX_BASE_URL = "http://sandbox.example/sandbox"
    settings.SANDBOX_TOKEN = "sandbox-token-123"
    asked = serving(monkeypatch, httpx.Response(404))
    assert HTTPConnector("orders").read("A-1") is None
    assert str(asked[0].url) == "http://sandbox.example/sandbox/orders/records/A-1"
    assert asked[0].headers["Authorization"] == "Bearer sandbox-token-123"


def test_the_sandbox_token_never_goes_to_a_system_of_its_own(monkeypatch, settings):
    settings.CONNECTOR_URLS = {"orders": "https://orders.example"}
    settings.CONNECTOR_TOKENS = {}
    settings.SANDBOX_TOKEN = "sandbox-token-123"
    asked = serving(monkeypatch, httpx.Response(404))
    HTTPConnector("orders").read("A-1")
    assert "Authorization" not in asked[0].headers


@pytest.mark.parametrize(("record_id", "path"), [("..", "%2E%2E"), (".", "%2E"), ("a/../b", "a%2F..%2Fb")])
def test_a_record_id_is_one_path_segment_even_when_it_is_a_dot_segment(
    monkeypatch, settings, record_id, path
):
    settings.CONNECTOR_URLS = {"orders": "https://orders.example/api"}
    asked = serving(monkeypatch, httpx.Response(404))
    HTTPConnector("orders").read(record_id)
    assert asked[0].url.raw_path.decode() == f"/api/records/{path}"


def test_the_model_key_travels_as_a_bearer_header_not_in_the_url():
    asked: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"model": "m", "choices": [{"message": {"content": "ok"}}]})

    model = OpenAICompatibleModel(
        base_url="https://model.example/v1", model="m", api_key=SECRET, transport=httpx.MockTransport(handle)
    )
    model.complete(prompt_id="p", system="s", facts={})
    assert asked[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert SECRET not in str(asked[0].url)


def test_a_model_url_with_a_credential_is_refused_by_the_client_too():
    with pytest.raises(ValueError, match="user name or password") as refused:
        OpenAICompatibleModel(base_url=f"https://svc:{SECRET}@model.example/v1", model="m")
    assert SECRET not in str(refused.value)


# --- evidence links on the approval page --------------------------------------------------------


def test_an_evidence_link_comes_from_the_public_base_with_its_id_quoted(settings):
    settings.CONNECTOR_URLS = {"orders": "http://orders.internal:9000/api"}
    settings.CONNECTOR_PUBLIC_URLS = {"orders": "https://orders.example.com/ui/"}
    ref = {"system": "orders", "record_id": "A 1/2?x#y"}
    assert evidence_url(ref) == "https://orders.example.com/ui/records/A%201%2F2%3Fx%23y"


def test_an_evidence_link_without_a_public_base_is_the_connector_url(settings):
    settings.CONNECTOR_URLS = {"orders": "https://orders.example/api/"}
    settings.CONNECTOR_PUBLIC_URLS = {}
    assert evidence_url({"system": "orders", "record_id": "A-1"}) == "https://orders.example/api/records/A-1"


@pytest.mark.parametrize("record_id", ["..", "."])
def test_a_dot_segment_record_id_gets_no_link_out_of_records(settings, record_id):
    # Browsers resolve even "%2E%2E" as "..": the only safe link is none.
    settings.CONNECTOR_URLS = {"orders": "https://orders.example/api"}
    assert evidence_url({"system": "orders", "record_id": record_id}) == ""


def ask_approval(task, record_id: str) -> ApprovalRequest:
    """Advance a refund to its approval step, resting on order ``record_id``, the way a worker does."""
    worker = Actor.worker("tests")
    kind = registry.get(task.task_type)
    now = timezone.now()
    progress = checkpoints.Progress(
        step="approve",
        facts={
            **kind.initial_facts(task.input),
            "order_status": "delivered",
            "order_total": "100.00",
            "refund_card": "visa-4242",
        },
        evidence=[
            checkpoints.EvidenceRef(system="orders", record_id=record_id, record_version="1", fetched_at=now)
        ],
    )
    task = advance(
        task.id, task.state_version, State.READY, actor=worker, trigger=Trigger.STEP, progress=progress
    )
    decision = approvals.request_decision(task, kind, kind.step("approve"), progress, now=now)
    decisions.commit(task, decision, actor=worker)
    return ApprovalRequest.objects.filter(task=task).latest("created_at")


@pytest.mark.django_db
@pytest.mark.parametrize("record_id", ["A-102", ".."])
def test_the_approval_page_links_evidence_without_credentials_and_inside_records(
    settings, acme, approver, operator, record_id
):
    settings.CONNECTOR_URLS = {"orders": "http://orders.internal:9000/api"}
    settings.CONNECTOR_TOKENS = {"orders": SECRET}
    settings.CONNECTOR_PUBLIC_URLS = {"orders": "https://orders.example.com"}
    request = ask_approval(make_task(acme, owner=operator), record_id)
    client = Client()
    client.force_login(approver)
    page = client.get(f"/console/approvals/{request.pk}/").content.decode()
    assert SECRET not in page and "orders.internal" not in page
    if record_id == "A-102":
        assert 'href="https://orders.example.com/records/A-102"' in page
    else:
        assert "https://orders.example.com" not in page  # no link at all, just the reference
        assert "orders/.." in page
