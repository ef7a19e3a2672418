"""Wherever the console prints a reason code it says what the code means (``tasks.reasons``, issue 28),
the code itself kept visible beside it."""

from __future__ import annotations

import html

import pytest

from tasks import reasons
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.console.test_task_page import client_for, page_of, quarantined, why_of

pytestmark = pytest.mark.django_db

FAILED_CODE = "refund_needs_manual_review"


def failed(tenant):
    task = make_task(tenant)
    return advance(
        task.id, 1, State.FAILED, actor=Actor.worker("w"), trigger=Trigger.FAIL, reason_code=FAILED_CODE
    )


def shown(code: str) -> str:
    """The code and its meaning as the filter writes them (escaped as in the page)."""
    return f'<code>{code}</code> <span class="reason-meaning">{html.escape(reasons.meaning(code))}</span>'


def get(user, path: str) -> str:
    response = client_for(user).get(path)
    assert response.status_code == 200
    return response.content.decode()


def test_every_code_the_pages_can_show_has_a_meaning_to_show():
    assert reasons.meaning("step_error") and reasons.meaning(FAILED_CODE)


def test_the_why_panel_and_the_timeline_say_what_the_code_means(acme, operator):
    task = quarantined(acme, "step_error")
    page = page_of(operator, task)
    assert shown("step_error") in page
    why = why_of(page)
    assert "Reason code: step_error" in why and reasons.meaning("step_error") in html.unescape(why)


def test_the_quarantine_page_says_what_each_reason_means(acme, operator):
    quarantined(acme, "step_error")
    page = get(operator, "/console/quarantine/")
    assert page.count(shown("step_error")) >= 2  # the list of reasons and the chosen reason's card


def test_the_failed_tasks_page_says_what_each_reason_means(acme, operator):
    failed(acme)
    page = get(operator, "/console/failed/")
    assert page.count(shown(FAILED_CODE)) >= 2


def test_the_audit_history_rows_say_what_the_code_means(acme, auditor):
    task = failed(acme)
    assert shown(FAILED_CODE) in get(auditor, f"/console/audit/tasks/{task.id}/")
    assert shown(FAILED_CODE) in get(auditor, "/console/audit/")


def test_a_code_the_registry_does_not_know_is_shown_alone(acme, operator):
    task = quarantined(acme, "made_up_code")
    page = page_of(operator, task)
    assert "<code>made_up_code</code>" in page and "made_up_code</code> <span" not in page
