"""Who gets what from every console URL: the whole URL conf × the whole cast, as one explicit table.

The test enumerates ``console.urls.urlpatterns`` itself: a page added there
without a row in ``EXPECTED`` fails (``test_every_console_url_has_a_row``, and
its own parametrized cases), and so does a path parameter nobody taught
``PARAMS`` to fill. Rows name the answer each view intends for anonymous
visitors, an operator of another tenant (``outsider``, globex) and each role of
acme; writes are POSTed with a valid body, so "allowed" means the write really
happened and "refused" that it did not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from console.urls import urlpatterns
from runtime.models import Alert, AlertKind
from tasks.models import LegalHold, Task
from tenancy.models import SavedView
from tenancy.services import saved_view_create
from tests.conftest import make_task
from tests.matrix import CAST, build_cast, member, module_transaction

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "outsider", "auditor", "operator", "approver", "admin")
USER_FIXTURES = {
    "outsider": "outsider",
    "auditor": "auditor",
    "operator": "operator",
    "approver": "approver",
    "admin": "admin_user",
}

# Answers. LOGIN: 302 to the login page. REDIRECT: 302 elsewhere (GET pages that only route).
# DONE: a POST that was carried out (302 onwards, and the write is in the database).
# PASSED: a POST past the access check (302 back to the page, not 403/404); whether it could act
# depends on the task's state, which this matrix does not vary.
LOGIN, REDIRECT, DONE, PASSED = "login", "redirect", "done", "passed"


@dataclass(frozen=True)
class Row:
    method: str
    answers: dict[str, int | str]


def row(method: str, anonymous, outsider, auditor, operator, approver, admin) -> Row:
    return Row(
        method, dict(zip(ROLES, (anonymous, outsider, auditor, operator, approver, admin), strict=True))
    )


# One row per console URL name, columns in ROLES order:
#            method  anonymous outsider  auditor  operator  approver  admin
EXPECTED: dict[str, Row] = {
    # Lists are scoped, never refused: another tenant's operator sees their own (empty) list.
    "queue": row("GET", LOGIN, 200, 200, 200, 200, 200),
    "task": row("GET", LOGIN, 404, 200, 200, 200, 200),
    # Controls: operators and admins; other roles of the tenant 403, other tenants 404.
    "task-control": row("POST", LOGIN, 404, 403, DONE, 403, DONE),
    "task-answer": row("POST", LOGIN, 404, 403, PASSED, 403, PASSED),
    "task-rerun": row("POST", LOGIN, 404, 403, PASSED, 403, PASSED),
    "task-fork": row("POST", LOGIN, 404, 403, PASSED, 403, PASSED),
    "task-compensate": row("POST", LOGIN, 404, 403, PASSED, 403, PASSED),
    # Reveal: operators and admins only; the matrix's empty form is refused past the access check.
    "task-reveal": row("POST", LOGIN, 404, 403, PASSED, 403, PASSED),
    # A legal hold: the tenant's admins place and lift it; every other role 403, other tenants 404.
    "task-legal-hold": row("POST", LOGIN, 404, 403, 403, 403, DONE),
    "landing": row("GET", LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT, REDIRECT),
    "approvals": row("GET", LOGIN, 200, 200, 200, 200, 200),
    "approval": row("GET", LOGIN, 404, 200, 200, 200, 200),
    # Deciding: approvers; a tenant role that may read the request but not decide it gets the 403 page.
    "approval-decide": row("POST", LOGIN, 404, 403, 403, DONE, 403),
    # The audit log: auditors, operators, admins (AUDIT_ROLES); approvers 403 (separation of duties).
    "audit": row("GET", LOGIN, 200, 200, 200, 403, 200),
    "audit-export": row("GET", LOGIN, 200, 200, 200, 403, 200),
    "audit-task": row("GET", LOGIN, 404, 200, 200, 403, 200),
    "audit-task-export": row("GET", LOGIN, 404, 200, 200, 403, 200),
    # Quarantine triage: QUARANTINE_ROLES; approvers have their inbox instead.
    "quarantine": row("GET", LOGIN, 200, 200, 200, 403, 200),
    # Failed-tasks triage: the same readers as quarantine; its rerun goes through the bulk preview.
    "failed": row("GET", LOGIN, 200, 200, 200, 403, 200),
    # Orphan effects (after a restore): alert readers (operators, admins, auditors), scoped to their tenants.
    "orphans": row("GET", LOGIN, 200, 200, 200, 403, 200),
    # The dashboard: every role, scoped to the reader's tenants (another tenant's operator sees theirs).
    "dashboard": row("GET", LOGIN, 200, 200, 200, 200, 200),
    # A display preference: anyone signed in, no object behind it.
    "theme": row("POST", LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT, REDIRECT),
    # The queue as CSV: scoped like the queue.
    "queue-export": row("GET", LOGIN, 200, 200, 200, 200, 200),
    # Bulk preview: operators and admins of some tenant (another tenant's operator passes the role
    # check; the bare GET without a control is a 400 form error, and the selection is scoped anyway).
    "bulk-preview": row("GET", LOGIN, 400, 403, 400, 403, 400),
    # A bulk report: its creator (the operator here), or who audits every tenant it touched.
    "bulk-report": row("GET", LOGIN, 404, 200, 200, 404, 200),
    # Past bulk operations: scoped like the reports it links to, never refused (a list may be empty).
    "bulk-list": row("GET", LOGIN, 200, 200, 200, 200, 200),
    # Saved views belong to one user: anyone signed in saves their own; only the owner (the operator
    # here) deletes one, everyone else gets 404 (it is not theirs to know about).
    "saved-view-save": row("POST", LOGIN, DONE, DONE, DONE, DONE, DONE),
    "saved-view-delete": row("POST", LOGIN, 404, 404, DONE, 404, 404),
    # The access log: auditors and admins of some tenant (tenancy.selectors.ACCESS_LOG_ROLES).
    "access": row("GET", LOGIN, 403, 200, 403, 403, 200),
    # Alerts: operators, admins and auditors read their tenants' (runtime.alerts.READ_ROLES); operators
    # and admins acknowledge and snooze; approvers 403, another tenant's alert 404.
    "alerts": row("GET", LOGIN, 200, 200, 200, 403, 200),
    "alert-acknowledge": row("POST", LOGIN, 404, 403, DONE, 403, DONE),
    "alert-snooze": row("POST", LOGIN, 404, 403, DONE, 403, DONE),
    # Task types are the deployment's: any role in any tenant reads every one (reads.task_types).
    "task-types": row("GET", LOGIN, 200, 200, 200, 200, 200),
}


def _world(acme, operator) -> SimpleNamespace:
    """Real objects of tenant acme, one per kind of path parameter.

    A task waiting for an approval, its request, and a bulk operation the
    operator started over another task (not run: its report exists from creation).
    """
    from runtime import bulk
    from tests.console.test_approvals import ask

    approval = ask(make_task(acme, objective="Matrix refund"))
    other = make_task(acme, objective="Matrix bulk target")
    operation = bulk.bulk_create(
        user=operator, control="cancel", reason="matrix", tasks=Task.objects.filter(pk=other.pk), selection={}
    )
    view = saved_view_create(operator, name="Matrix view", query="state=ready", allowed_keys=["state"])
    task = Task.objects.get(pk=approval.task_id)
    alert = Alert.objects.create(
        tenant=acme, task=task, kind=AlertKind.NO_LIVE_LEASE, cause="matrix", raised_at=timezone.now()
    )
    return SimpleNamespace(task=task, approval=approval, operation=operation, view=view, alert=alert)


@pytest.fixture(scope="module")
def shared(django_db_setup: None, django_db_blocker: Any) -> Iterator[SimpleNamespace]:
    """The cast and the world, once per module (tests/matrix.py), undone when the module ends."""
    with module_transaction(django_db_blocker):
        cast = build_cast(django_db_blocker)
        with django_db_blocker.unblock():
            cast.world = _world(cast.acme, cast.operator)
        yield cast


_acme, _globex, _operator, _approver, _auditor, _admin, _integrator, _outsider = map(member, CAST)
_world_fixture = member("world")


# How to fill each path parameter (by its name in the pattern). A parameter missing here fails.
PARAMS: dict[str, Callable[[SimpleNamespace], Any]] = {
    "task_id": lambda w: w.task.id,
    "request_id": lambda w: w.approval.id,
    "operation_id": lambda w: w.operation.id,
    "control": lambda w: "cancel",
    "fmt": lambda w: "csv",
    "view_id": lambda w: w.view.pk,
    "alert_id": lambda w: w.alert.pk,
}


# What a POST sends (a body the view accepts from a permitted user) and how to see that it acted.
def _post_body(name: str, world: SimpleNamespace) -> dict[str, Any]:
    if name == "task-control":
        return {"expected_version": world.task.state_version, "reason": "matrix", "confirm": "on"}
    if name == "approval-decide":
        return {"decision": "reject", "digest": world.approval.digest, "comment": "matrix", "confirmed": "1"}
    if name == "task-answer":
        return {"expected_version": world.task.state_version, "answer": "matrix"}
    if name == "task-rerun":
        return {"reason": "matrix"}
    if name == "task-fork":
        return {"version": 1, "reason": "matrix", "confirm": "on"}
    if name == "task-compensate":
        return {"action": "matrix", "reason": "matrix", "confirm": "on"}
    if name == "task-legal-hold":
        return {"hold": "place", "reason": "matrix"}
    if name == "theme":
        return {"theme": "dark", "next": "/console/"}
    if name == "saved-view-save":
        return {"name": "matrix", "query": "state=ready"}
    if name == "saved-view-delete":
        return {"confirm": "yes"}
    if name == "alert-acknowledge":
        return {"note": "matrix", "confirm": "on"}
    if name == "alert-snooze":
        return {"duration": "1h", "confirm": "on"}
    return {}


def _acted(name: str, world: SimpleNamespace) -> bool | None:
    """Whether the POST changed something (None: nothing to observe in the database)."""
    if name == "task-control":
        return Task.objects.get(pk=world.task.pk).state_version != world.task.state_version
    if name == "approval-decide":
        return ApprovalRequest.objects.get(pk=world.approval.pk).status != "pending"
    if name == "task-legal-hold":
        return LegalHold.objects.filter(task=world.task).exists()
    if name == "saved-view-save":
        return SavedView.objects.filter(name="matrix").exists()
    if name == "saved-view-delete":
        return not SavedView.objects.filter(pk=world.view.pk).exists()
    if name == "alert-acknowledge":
        return Alert.objects.filter(pk=world.alert.pk, acknowledged_at__isnull=False).exists()
    if name == "alert-snooze":
        return Alert.objects.filter(pk=world.alert.pk, snoozed_until__isnull=False).exists()
    return None


def _patterns() -> list[URLPattern]:
    found = []
    for entry in urlpatterns:
        assert not isinstance(entry, URLResolver), f"console.urls includes {entry}: list its pages here too"
        found.append(entry)
    return found


def _url(pattern: URLPattern, world: SimpleNamespace) -> str:
    names = list(pattern.pattern.converters)
    unknown = [name for name in names if name not in PARAMS]
    if unknown:
        pytest.fail(f"console:{pattern.name} has path parameters {unknown} that PARAMS cannot fill")
    return reverse(f"console:{pattern.name}", kwargs={name: PARAMS[name](world) for name in names})


def test_every_console_url_has_a_row():
    names = [pattern.name for pattern in _patterns()]
    assert None not in names, "every console URL needs a name (the matrix is keyed by it)"
    assert sorted(set(names) - set(EXPECTED)) == [], "console URLs without a row in EXPECTED"
    assert sorted(set(EXPECTED) - set(names)) == [], "rows in EXPECTED for URLs that are gone"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("pattern", _patterns(), ids=lambda p: p.name or str(p.pattern))
def test_the_answer_matches_the_matrix(request, pattern, role, world):
    if pattern.name not in EXPECTED:
        pytest.fail(f"console:{pattern.name} ({pattern.pattern}) has no row in EXPECTED")
    expected = EXPECTED[pattern.name]
    url = _url(pattern, world)
    client = Client()
    if role != "anonymous":
        client.force_login(request.getfixturevalue(USER_FIXTURES[role]))

    if expected.method == "GET":
        response = client.get(url)
    else:
        assert client.get(url).status_code in (302, 404, 405), "a POST endpoint answers GET without acting"
        response = client.post(url, _post_body(pattern.name, world))
    want = expected.answers[role]
    got = response.status_code
    where = response.get("Location", "")

    if want == LOGIN:
        assert got == 302 and where.startswith("/accounts/login/"), (got, where)
    elif want in (REDIRECT, DONE, PASSED):
        assert got == 302 and not where.startswith("/accounts/login/"), (got, where)
        acted = _acted(pattern.name, world)
        if want == DONE:
            assert acted in (True, None), "allowed, but the write did not happen"
    else:
        assert got == want, (got, where)
        if expected.method == "POST":
            assert _acted(pattern.name, world) in (False, None), "refused, but the write happened"
    if role == "outsider" and got == 200:
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert str(world.task.id).encode() not in body, "another tenant's task leaked into the page"
