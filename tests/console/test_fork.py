"""The task page's "Resume from this version" control (``tasks.forks``, issue 26), with the test client."""

from __future__ import annotations

import html

import pytest

from audit.models import TransitionEvent
from tasks import services
from tasks.models import Checkpoint, Task
from tests.api.test_fork import ended
from tests.conftest import make_task
from tests.console.test_task_page import client_for, page_of

pytestmark = pytest.mark.django_db


def post_fork(user, task: Task, version: int, **fields):
    body = {"version": version, "reason": "resume before the review", "confirm": "on", **fields}
    return client_for(user).post(f"/console/tasks/{task.id}/fork/", body, follow=True)


def messages_of(response) -> str:
    return html.unescape(response.content.decode())


def test_the_checkpoint_view_offers_the_control_naming_the_version(acme, operator):
    old = ended(acme)
    page = page_of(operator, old, checkpoint=2)
    assert "Resume from this version" in page
    assert "Yes, start a new task from checkpoint v2" in page and "Resume from v2 as a new task" in page
    assert 'name="input_amount"' in page and 'name="input_order_id"' not in page  # what the type lets change
    assert 'value="2"' in page  # the version it posts


def test_no_control_for_an_auditor_or_a_task_that_has_not_ended(acme, operator, auditor):
    assert "Resume from this version" not in page_of(auditor, ended(acme), checkpoint=2)
    assert "Resume from this version" not in page_of(operator, make_task(acme))


def test_resuming_starts_the_fork_and_both_pages_link_each_other(acme, operator):
    old = ended(acme)
    response = post_fork(operator, old, 2, input_amount="8.00")
    new = Task.objects.get(rerun_of=old)
    assert response.redirect_chain[-1][0] == f"/console/tasks/{new.id}/"
    said = messages_of(response)
    assert "Resumed from checkpoint v2" in said and "asks every approval again" in said
    assert (
        f"/console/tasks/{old.id}/?checkpoint=2#checkpoint" in said
    )  # "resumes task … from its checkpoint v2"
    assert "from its checkpoint v2" in said
    assert services.task_input(new)["amount"] == "8.00"
    assert f'href="/console/tasks/{new.id}/"' in page_of(operator, old)
    assert TransitionEvent.objects.get(task=old, trigger="fork").reason_code == "forked"


def test_unticked_confirmation_starts_nothing(acme, operator):
    old = ended(acme)
    response = post_fork(operator, old, 2, confirm="")
    assert "Tick the confirmation box: no task was started." in messages_of(response)
    assert not Task.objects.filter(rerun_of=old).exists()


def test_a_version_that_does_not_exist_is_said(acme, operator):
    old = ended(acme)
    response = post_fork(operator, old, 9)
    assert "No task started: task" in messages_of(response) and "no checkpoint at version 9" in messages_of(
        response
    )
    assert not Task.objects.filter(rerun_of=old).exists()


def test_a_tampered_checkpoint_is_said(acme, operator):
    old = ended(acme)
    row = Checkpoint.objects.get(task=old, state_version=2)
    Checkpoint.objects.filter(pk=row.pk).update(body=row.body.replace("delivered", "refunded!"))
    said = messages_of(post_fork(operator, old, 2))
    assert "this checkpoint fails verification (checkpoint_digest_mismatch" in said
    assert not Task.objects.filter(rerun_of=old).exists()


def test_a_bad_amount_is_said_and_kept_out(acme, operator):
    old = ended(acme)
    said = messages_of(post_fork(operator, old, 2, input_amount="-1"))
    assert "No task started: the input does not fit the task type (amount:" in said
    assert not Task.objects.filter(rerun_of=old).exists()


def test_roles_and_tenants(acme, auditor, approver, outsider):
    old = ended(acme)
    for user, status in ((auditor, 403), (approver, 403), (outsider, 404)):
        response = client_for(user).post(
            f"/console/tasks/{old.id}/fork/", {"version": 2, "reason": "x", "confirm": "on"}
        )
        assert response.status_code == status, user
    assert not Task.objects.filter(rerun_of=old).exists()


def test_the_form_sent_twice_starts_one_task(acme, operator):
    old = ended(acme)
    post_fork(operator, old, 2, idempotency_key="console-fork:1")
    again = post_fork(operator, old, 2, idempotency_key="console-fork:1")
    assert "This fork was already started" in messages_of(again)
    assert Task.objects.filter(rerun_of=old).count() == 1
