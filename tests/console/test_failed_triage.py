"""Failed-tasks triage and bulk rerun: failed tasks by reason, newest first, scoped to the user's tenants;
a rerun of every task failed for a reason, or of ticked rows, through the bulk preview — each a new task
linked to the failed one, never a second rerun of the same task by one operation."""

from __future__ import annotations

import pytest
from django.test import Client

from console import failed as failed_views
from runtime import bulk
from runtime.models import BulkResult, Outcome
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def failed(tenant, code: str, **overrides) -> Task:
    task = make_task(tenant, **overrides)
    return advance(
        task.id, 1, State.FAILED, actor=Actor.worker("t"), trigger=Trigger.FAIL, reason=f"gave up: {code}",
        reason_code=code,
    )  # fmt: skip


def test_failed_tasks_are_counted_per_reason_and_listed_newest_first(operator, acme, globex, monkeypatch):
    monkeypatch.setattr(failed_views, "PAGE", 2)
    declined = [failed(acme, "refund_declined").id for _ in range(3)]
    failed(acme, "order_not_found")
    failed(globex, "refund_declined")  # another tenant's: neither counted nor listed
    make_task(acme)  # not failed
    client = client_for(operator)

    first = client.get("/console/failed/")
    assert first.status_code == 200
    assert [(row["code"], row["n"]) for row in first.context["counts"]] == [
        ("refund_declined", 3),
        ("order_not_found", 1),
    ]
    seen, params = [], {"reason": "refund_declined"}
    while True:
        page = client.get("/console/failed/", params).context["page"]
        seen += [task.id for task in page.tasks]
        if page.next_cursor is None:
            break
        params = {"reason": "refund_declined", "before": str(page.next_cursor)}
    assert seen == declined[::-1]


def test_an_auditor_reads_the_list_without_the_rerun_and_an_approver_has_none(auditor, approver, acme):
    failed(acme, "refund_declined")
    page = client_for(auditor).get("/console/failed/")
    assert page.status_code == 200 and page.context["total"] == 1
    assert 'value="rerun"' not in page.content.decode()
    assert client_for(approver).get("/console/failed/").status_code == 403


def test_the_triage_list_runs_a_bounded_number_of_queries(operator, acme, django_assert_max_num_queries):
    for n in range(40):
        failed(acme, "refund_declined" if n % 2 else f"reason_{n % 5}")
    client = client_for(operator)
    with django_assert_max_num_queries(6):  # 5 for the page, 1 for the navigation's alerts badge
        response = client.get("/console/failed/", {"reason": "refund_declined"})
    assert len(response.context["page"].tasks) == 20


def test_an_operator_reruns_every_task_failed_for_a_reason(operator, acme):
    declined = [failed(acme, "refund_declined") for _ in range(2)]
    other = failed(acme, "order_not_found")
    client = client_for(operator)
    page = client.get("/console/failed/", {"reason": "refund_declined"}).content.decode()
    assert 'name="filter_reason" value="refund_declined"' in page and 'value="rerun"' in page

    selection = {"control": "rerun", "target": "all", "state": "failed", "filter_reason": "refund_declined"}
    preview = client.get("/console/bulk/new/", selection)
    assert preview.status_code == 200 and preview.context["count"] == 2
    assert "run again as a new task" in preview.content.decode()
    confirmed = client.post("/console/bulk/new/", {**selection, "reason": "the payment system is back"})
    assert confirmed.status_code == 302

    reruns = Task.objects.filter(rerun_of__isnull=False)
    assert sorted(t.rerun_of_id for t in reruns) == sorted(t.id for t in declined)
    assert {t.state for t in reruns} == {State.READY}
    assert {Task.objects.get(pk=t.pk).state_version for t in declined} == {2}  # the failed tasks: untouched
    assert not Task.objects.filter(rerun_of=other).exists()
    results = BulkResult.objects.filter(operation__control="rerun")
    assert {r.outcome for r in results} == {Outcome.APPLIED}
    assert all(r.detail.startswith("rerun as task ") for r in results)


def test_a_rerun_settled_again_finds_the_first_rerun_instead_of_starting_a_second(operator, acme):
    task = failed(acme, "refund_declined")
    operation = bulk.bulk_create(
        user=operator, control="rerun", reason="back up", tasks=Task.objects.filter(pk=task.pk), selection={}
    )
    result = operation.results.get()
    first = bulk._apply(operation, result, operator)  # a runner that died before recording its result
    again = bulk._apply(operation, result, operator)  # and the one that took the operation over
    assert (first.outcome, again.outcome) == (Outcome.APPLIED, Outcome.UNCHANGED)
    assert Task.objects.filter(rerun_of=task).count() == 1
    assert again.detail == first.detail.replace("rerun as", "already rerun as")


def test_a_rerun_of_a_task_that_is_not_finished_is_refused_and_nothing_starts(operator, acme):
    running = make_task(acme)
    operation = bulk.bulk_create(
        user=operator, control="rerun", reason="x", tasks=Task.objects.filter(pk=running.pk), selection={}
    )
    bulk.bulk_run(operation.id, runner="t")
    result = operation.results.get()
    assert result.outcome == Outcome.REFUSED and "can be rerun" in result.detail
    assert not Task.objects.filter(rerun_of=running).exists()
