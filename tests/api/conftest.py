"""Helpers shared by the task API suites (imported explicitly, like ``tests.conftest``)."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import REFUND_INPUT, progress

TASKS = "/api/tasks/"
HISTORY = ("events", "checkpoints", "actions")


def url(task: Task, suffix: str = "") -> str:
    return f"{TASKS}{task.id}/" + (f"{suffix}/" if suffix else "")


def post_json(client, path: str, body: Any):
    return client.post(path, json.dumps(body), content_type="application/json")


def post_raw(client, path: str, raw: bytes | str, content_type: str = "application/json"):
    return client.post(path, raw, content_type=content_type)


def create_body(**overrides) -> dict[str, Any]:
    body = {"task_type": "refund_request", "objective": "Refund order A-1", "input": dict(REFUND_INPUT)}
    body.update(overrides)
    return body


def control_body(version: int = 1, **overrides) -> dict[str, Any]:
    return {"expected_version": version, "reason": "customer asked", **overrides}


def no_raise(client):
    """Let a server error come back as a 500 response instead of an exception in the test."""
    client.raise_request_exception = False
    return client


def cursor(querystring: str) -> str:
    """A cursor DRF can decode (base64 of a query string) carrying any position."""
    return base64.b64encode(querystring.encode()).decode()


def in_waiting_retry(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.WAITING_RETRY,
        actor=Actor.worker("w1"),
        trigger=Trigger.ATTEMPT_FAILED,
        wait_deadline=timezone.now() + timedelta(hours=1),
    )


def waiting_for_input(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.WAITING_INPUT,
        actor=Actor.worker("w1"),
        trigger=Trigger.REQUEST_INPUT,
        progress=progress("ask_customer"),
        wait_deadline=timezone.now() + timedelta(days=1),
    )
