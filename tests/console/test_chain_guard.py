"""The task page and the audit chain: links to the history and the export, a broken chain shown, and
every state-changing post on a broken-chain task refused unless it confirms the break (server-side)."""

from __future__ import annotations

import html

import pytest
from django.test import Client

from tasks.models import Task
from tasks.states import State
from tests.audit.owner import task_with_history, triggers_off
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def break_chain(task: Task, version: int = 2) -> None:
    """Edit an event's reason in place, as someone with database access but no chain key could."""
    with triggers_off("audit_transitionevent") as cursor:
        cursor.execute(
            "UPDATE audit_transitionevent SET reason = 'edited' WHERE task_id = %s AND state_version = %s",
            [task.id, version],
        )


def page(user, task: Task) -> str:
    return html.unescape(client_for(user).get(f"/console/tasks/{task.id}/").content.decode())


def cancel(user, task: Task, **extra: str):
    data = {
        "expected_version": task.state_version,
        "reason": "customer asked",
        "scope": "task",
        "confirm": "on",
    }
    return client_for(user).post(f"/console/tasks/{task.id}/cancel/", {**data, **extra}, follow=True)


def test_operators_and_auditors_get_links_to_the_history_and_its_export(operator, auditor, approver, acme):
    task = make_task(acme)
    history = f"/console/audit/tasks/{task.id}/"
    for user in (operator, auditor):
        shown = page(user, task)
        assert f'href="{history}"' in shown and f'href="{history}export.json"' in shown
        assert f'href="{history}export.csv"' in shown
    assert history not in page(approver, task)  # approvers hold no audit role: no link to a 403
    assert client_for(approver).get(history).status_code == 403


def test_an_intact_chain_shows_no_badge_and_needs_no_confirmation(operator, acme):
    task = make_task(acme)
    shown = page(operator, task)
    assert "Chain broken" not in shown and "confirm_broken_chain" not in shown
    assert "Cancel applied" in cancel(operator, task).content.decode()


def test_a_broken_chain_is_shown_on_the_task_page_with_the_confirmation_in_each_control(operator, acme):
    task = task_with_history(acme, steps=2)
    break_chain(task)
    shown = page(operator, task)
    assert "Chain broken</strong> at v2" in shown
    assert 'name="confirm_broken_chain" value="v2" required' in shown
    assert "I know this task's audit chain is broken at v2" in shown


def test_a_control_on_a_broken_chain_task_without_the_confirmation_is_refused(operator, acme):
    task = task_with_history(acme, steps=2)
    break_chain(task)
    refused = html.unescape(cancel(operator, task).content.decode())
    assert "Nothing changed: this task's audit chain is broken at v2" in refused
    assert Task.objects.get(pk=task.pk).state == State.READY
    wrong = html.unescape(cancel(operator, task, confirm_broken_chain="v1").content.decode())
    assert "Nothing changed" in wrong and Task.objects.get(pk=task.pk).state == State.READY

    done = cancel(operator, task, confirm_broken_chain="v2").content.decode()
    assert "Cancel applied" in done and Task.objects.get(pk=task.pk).state != State.READY


@pytest.mark.parametrize("path", ["quarantine/", "answer/", "rerun/", "compensate/"])
def test_every_state_changing_post_on_a_broken_chain_task_is_refused_first(operator, acme, path):
    task = task_with_history(acme, steps=1)
    break_chain(task)
    before = (Task.objects.count(), Task.objects.get(pk=task.pk).state_version)
    response = client_for(operator).post(
        f"/console/tasks/{task.id}/{path}",
        {"expected_version": 2, "reason": "r", "answer": "a", "idempotency_key": "k", "confirm": "on"},
        follow=True,
    )
    assert "this task's audit chain is broken at v2" in html.unescape(response.content.decode())
    assert (Task.objects.count(), Task.objects.get(pk=task.pk).state_version) == before
