"""Who gets what from every URL under /api/, /console/ and /accounts/: the URL conf × every principal.

Routes are enumerated from the URL conf itself (``get_resolver``, walking every
include), with the HTTP methods each API view implements. A route or method
without a row in ``EXPECTED`` fails, so a new endpoint cannot ship without
saying who may call it; a row whose route is gone fails too. Routes outside
the three prefixes must be listed in ``OUT_OF_SCOPE`` with the reason.

Principals: anonymous; an operator of another tenant (``outsider``, globex);
acme's auditor, operator, approver, integrator and admin; and API tokens with
one scope each (read, operate, approve, integrate) of a user who is both
operator and approver in acme, so what a token may do is visibly its scopes
and its user's roles together. Tokens open no console session.

Answers follow DESIGN: anonymous API calls 401, anonymous console pages
redirect to the login; another tenant's object 404; a role (or token scope)
that does not allow the operation 403. Writes are sent with a body a permitted
caller would send; a refused write must change nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, include, path, reverse
from django.urls.resolvers import RegexPattern
from django.utils import timezone
from rest_framework.views import APIView

from approvals.models import ApprovalRequest
from runtime import bulk
from runtime.models import Alert, AlertKind
from tasks.models import Task
from tenancy.models import Role, SavedView
from tenancy.services import saved_view_create, token_create
from tests.api.conftest import create_body, waiting_for_input
from tests.conftest import make_task, make_user
from tests.console.test_approvals import ask
from tests.matrix import CAST, FAST_HASHERS, build_cast, member, module_transaction
from tests.second_factor import forget_second_factor

pytestmark = pytest.mark.django_db

PREFIXES = ("api/", "console/", "accounts/")
# Routes the matrix does not cover, each with the reason (matched as route prefixes).
OUT_OF_SCOPE = {
    "admin/": "Django's admin: staff accounts only, its own login and model permissions",
    "sandbox/": "the simulated outside systems of the demo, off in production, guarded by their own token",
    "static/": "static files: public by design",
    "": "the root only redirects to /console/",
    # /healthz and /readyz are not routes: config.health.HealthMiddleware answers them before the URL conf
    # (tests/observability/test_health.py).
    "metrics": "Prometheus scrapes: a bearer METRICS_TOKEN or an allowed network, never a session or an "
    "API token (tests/observability/test_metrics.py)",
    ".well-known/agent-card.json": "the public A2A agent card: what a caller reads before it holds a token",
    "a2a/": "A2A JSON-RPC: an API token with the integrate scope, its tenant's tasks only; one route for "
    "every method, so its own tests call the methods as each caller (tests/a2a/)",
}

PRINCIPALS = (
    "anonymous",
    "outsider",
    "auditor",
    "operator",
    "approver",
    "integrator",
    "admin",
    "token:read",
    "token:operate",
    "token:approve",
    "token:integrate",
)
USER_FIXTURES = {
    "outsider": "outsider",
    "auditor": "auditor",
    "operator": "operator",
    "approver": "approver",
    "integrator": "integrator",
    "admin": "admin_user",
}

# Symbolic answers. LOGIN: 302 to the login page. REDIRECT: 302 elsewhere.
# PASSED: past every access check (not 401/403/404/405/429, not a server error): whether the
# operation could then act depends on the object's state, which this matrix does not vary.
LOGIN, REDIRECT, PASSED = "login", "redirect", "passed"
REFUSED = (401, 403, 404, 405, 429)


def cols(*answers: int | str) -> dict[str, int | str]:
    return dict(zip(PRINCIPALS, answers, strict=True))


L, R, P = LOGIN, REDIRECT, PASSED
# A token never opens a console session: console pages see an anonymous visitor.
T = (L, L, L, L)

# fmt: off
# Columns (PRINCIPALS):                 anon outs audi oper appr intg admin | token: read oper appr intg
EXPECTED: dict[tuple[str, str], dict[str, int | str]] = {
    # --- accounts: open to everyone (a token is only an anonymous visitor there); a wrong password: the form
    ("login", "GET"):                     cols(200, 200, 200, 200, 200, 200, 200,   200, 200, 200, 200),
    ("login", "POST"):                    cols(200, 200, 200, 200, 200, 200, 200,   200, 200, 200, 200),
    ("login", "PUT"):                     cols(200, 200, 200, 200, 200, 200, 200,   200, 200, 200, 200),
    ("logout", "POST"):                   cols(L,   L,   L,   L,   L,   L,   L,     L,   L,   L,   L),
    # The second factor: a signed-in session that needs no code, or has given it (force_login), goes on
    # (an unverified one: test_a_session_without_its_second_factor_opens_only_the_accounts_pages)
    ("second-factor", "GET"):             cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("second-factor", "POST"):            cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("second-factor-enroll", "GET"):      cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("second-factor-enroll", "POST"):     cols(L,   R,   R,   R,   R,   R,   R,     *T),
    # --- API reads: any role of the tenant; lists are scoped (another tenant's operator: their own, empty)
    ("api-schema", "GET"):                cols(401, 200, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-tasks", "GET"):                 cols(401, 200, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task", "GET"):                  cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task-events", "GET"):           cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task-checkpoints", "GET"):      cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task-actions", "GET"):          cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-approvals", "GET"):             cols(401, 200, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-approval", "GET"):              cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    # Task types are the deployment's: any role in any tenant reads every one (reads.task_types.visible_to)
    ("api-task-types", "GET"):            cols(401, 200, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task-type", "GET"):             cols(401, 200, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    # --- starting and feeding tasks: operators, admins, integrators; a token needs "integrate".
    # Starting names tenant acme, which to another tenant's operator does not exist: 400 on the field.
    ("api-tasks", "POST"):                cols(401, 400, 403, 201, 403, 201, 201,   403, 403, 403, 201),
    ("api-task-input", "POST"):           cols(401, 404, 403, 200, 403, 200, 200,   403, 403, 403, 200),
    ("api-task-events-in", "POST"):       cols(401, 404, 403, P,   403, P,   P,     403, 403, 403, P),
    # --- operator controls, rerun, reveal: operators and admins; a token needs "operate"
    ("api-task-cancel", "POST"):          cols(401, 404, 403, 200, 403, 403, 200,   403, 200, 403, 403),
    ("api-task-quarantine", "POST"):      cols(401, 404, 403, 200, 403, 403, 200,   403, 200, 403, 403),
    ("api-task-escalate", "POST"):        cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-release", "POST"):         cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-retry", "POST"):           cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-retry_migration", "POST"): cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-reconcile", "POST"):       cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-rerun", "POST"):           cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-fork", "POST"):            cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-compensate", "POST"):      cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    ("api-task-reveal", "POST"):          cols(401, 404, 403, P,   403, 403, P,     403, P,   403, 403),
    # --- a legal hold: any role reads it; only the tenant's admins place or lift it (a token: "operate")
    ("api-task-legal-hold", "GET"):       cols(401, 404, 200, 200, 200, 200, 200,   200, 403, 403, 403),
    ("api-task-legal-hold", "POST"):      cols(401, 404, 403, 403, 403, 403, 200,   403, 403, 403, 403),
    # --- deciding: approvers; a token needs "approve"
    ("api-approval-decide", "POST"):      cols(401, 404, 403, 403, 200, 403, 403,   403, 403, 200, 403),
    # --- the access log: auditors and admins (the tokens' user is neither)
    ("api-access-events", "GET"):         cols(401, 403, 200, 403, 403, 403, 200,   403, 403, 403, 403),
    # --- alerts: operators, admins, auditors read (a list of their tenants'); operators and admins handle
    ("api-alerts", "GET"):                cols(401, 200, 200, 200, 403, 403, 200,   200, 403, 403, 403),
    ("api-alert-acknowledge", "POST"):    cols(401, 404, 403, 200, 403, 403, 200,   403, 200, 403, 403),
    ("api-alert-snooze", "POST"):         cols(401, 404, 403, 200, 403, 403, 200,   403, 200, 403, 403),
    # --- console (sessions only). R: a POST past the access checks (302 back to the page).
    ("console:queue", "GET"):             cols(L,   200, 200, 200, 200, 200, 200,   *T),
    ("console:task", "GET"):              cols(L,   404, 200, 200, 200, 200, 200,   *T),
    ("console:task-control", "POST"):     cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-answer", "POST"):      cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-rerun", "POST"):       cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-fork", "POST"):        cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-compensate", "POST"):  cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-reveal", "POST"):      cols(L,   404, 403, P,   403, 403, P,     *T),
    ("console:task-legal-hold", "POST"):  cols(L,   404, 403, 403, 403, 403, R,     *T),
    ("console:landing", "GET"):           cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("console:approvals", "GET"):         cols(L,   200, 200, 200, 200, 200, 200,   *T),
    ("console:approval", "GET"):          cols(L,   404, 200, 200, 200, 200, 200,   *T),
    ("console:approval-decide", "POST"):  cols(L,   404, 403, 403, R,   403, 403,   *T),
    ("console:audit", "GET"):             cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:audit-export", "GET"):      cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:audit-task", "GET"):        cols(L,   404, 200, 200, 403, 403, 200,   *T),
    ("console:audit-task-export", "GET"): cols(L,   404, 200, 200, 403, 403, 200,   *T),
    ("console:quarantine", "GET"):        cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:failed", "GET"):            cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:orphans", "GET"):           cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:dashboard", "GET"):         cols(L,   200, 200, 200, 200, 200, 200,   *T),
    ("console:theme", "POST"):            cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("console:queue-export", "GET"):      cols(L,   200, 200, 200, 200, 200, 200,   *T),
    # Bulk preview: operators and admins of some tenant (another tenant's operator passes the role check;
    # a bare GET without a control is a form error, and the selection is scoped anyway).
    ("console:bulk-preview", "GET"):      cols(L,   400, 403, 400, 403, 403, 400,   *T),
    # A bulk report: its creator (the operator), or who audits every tenant it touched.
    ("console:bulk-report", "GET"):       cols(L,   404, 200, 200, 404, 404, 200,   *T),
    ("console:bulk-list", "GET"):         cols(L,   200, 200, 200, 200, 200, 200,   *T),
    # Saved views: anyone signed in saves their own; only the owner (the operator) deletes one.
    ("console:saved-view-save", "POST"):  cols(L,   R,   R,   R,   R,   R,   R,     *T),
    ("console:saved-view-delete", "POST"): cols(L,  404, 404, R,   404, 404, 404,   *T),
    ("console:access", "GET"):            cols(L,   403, 200, 403, 403, 403, 200,   *T),
    ("console:alerts", "GET"):            cols(L,   200, 200, 200, 403, 403, 200,   *T),
    ("console:alert-acknowledge", "POST"): cols(L,  404, 403, R,   403, 403, R,     *T),
    ("console:alert-snooze", "POST"):     cols(L,   404, 403, R,   403, 403, R,     *T),
    ("console:task-types", "GET"):        cols(L,   200, 200, 200, 200, 200, 200,   *T),
}
# fmt: on


# --- the URL conf, enumerated ----------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    route: str  # the full pattern, e.g. "api/tasks/<uuid:task_id>/"
    name: str  # the reversible name, namespaced ("console:task")
    pattern: URLPattern
    methods: tuple[str, ...]  # what the view implements; () when it cannot tell (a function view)


def _walk(
    resolver: URLResolver, prefix: str = "", namespace: str = ""
) -> Iterator[tuple[str, str, URLPattern]]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            inner = ":".join(part for part in (namespace, entry.namespace or "") if part)
            yield from _walk(entry, prefix + str(entry.pattern), inner)
        else:
            name = f"{namespace}:{entry.name}" if namespace and entry.name else entry.name or ""
            yield prefix + str(entry.pattern), name, entry


def _methods(pattern: URLPattern) -> tuple[str, ...]:
    view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
    if view is None:
        return ()
    return tuple(
        method.upper()
        for method in ("get", "post", "put", "patch", "delete")
        if method in view.http_method_names and hasattr(view, method)
    )


def _routes(resolver: URLResolver | None = None) -> tuple[list[Route], list[str]]:
    """The routes under PREFIXES, and the full patterns neither under them nor in OUT_OF_SCOPE."""
    covered, unexplained = [], []
    for route, name, pattern in _walk(resolver or get_resolver()):
        if route.startswith(PREFIXES):
            covered.append(Route(route, name, pattern, _methods(pattern)))
        elif not any(route.startswith(skip) for skip in OUT_OF_SCOPE if skip) and route != "":
            unexplained.append(route)
    return covered, unexplained


def _cases(routes: list[Route] | None = None) -> list[tuple[Route, str]]:
    cases = []
    for route in _routes()[0] if routes is None else routes:
        methods = route.methods or tuple(m for (name, m) in EXPECTED if name == route.name) or ("GET",)
        cases.extend((route, method) for method in methods)
    return cases


def _without_rows(routes: list[Route]) -> list[tuple[str, str]]:
    return sorted({(route.name, method) for route, method in _cases(routes)} - set(EXPECTED))


def test_every_route_and_method_has_a_row():
    routes, unexplained = _routes()
    assert unexplained == [], "routes outside /api/, /console/, /accounts/ not listed in OUT_OF_SCOPE"
    assert all(route.name for route in routes), "every route needs a name (the matrix is keyed by it)"
    assert _without_rows(routes) == [], "routes (and methods) without a row in EXPECTED"
    wanted = {(route.name, method) for route, method in _cases(routes)}
    assert sorted(set(EXPECTED) - wanted) == [], "rows in EXPECTED for routes or methods that are gone"


def test_a_new_endpoint_or_method_without_a_row_is_reported():
    """The guard itself, on a URL conf with one endpoint nobody described and one undescribed method."""

    class MadeUpApi(APIView):
        def get(self, request: Any) -> None: ...

    class TasksWithDelete(APIView):
        def get(self, request: Any) -> None: ...

        def post(self, request: Any) -> None: ...

        def delete(self, request: Any) -> None: ...

    resolver = URLResolver(
        RegexPattern(r"^/"),
        [
            path("api/", include([path("made-up/", MadeUpApi.as_view(), name="api-made-up")])),
            path("api/tasks/", TasksWithDelete.as_view(), name="api-tasks"),
            path("healthz-made-up", MadeUpApi.as_view(), name="made-up-health"),
        ],
    )
    routes, unexplained = _routes(resolver)
    assert _without_rows(routes) == [("api-made-up", "GET"), ("api-tasks", "DELETE")]
    assert unexplained == ["healthz-made-up"]


# --- the world the requests act on -----------------------------------------------------------------


def _world(acme: Any, operator: Any) -> SimpleNamespace:
    """Real acme objects for every path parameter: a task waiting for an approval (its request
    pending), one waiting for input, a bulk operation, a saved view of the operator and an open alert."""
    approval = ask(make_task(acme, objective="Matrix refund"))
    waiting = waiting_for_input(make_task(acme, objective="Matrix input"))
    other = make_task(acme, objective="Matrix bulk target")
    operation = bulk.bulk_create(
        user=operator, control="cancel", reason="matrix", tasks=Task.objects.filter(pk=other.pk), selection={}
    )
    view = saved_view_create(operator, name="Matrix view", query="state=ready", allowed_keys=["state"])
    return SimpleNamespace(
        task=Task.objects.get(pk=approval.task_id),
        approval=approval,
        waiting=waiting,
        operation=operation,
        view=view,
        alert=_open_alert(approval.task_id),
    )


@pytest.fixture(scope="module")
def shared(django_db_setup: None, django_db_blocker: Any) -> Iterator[SimpleNamespace]:
    """The cast and the world, once per module (tests/matrix.py), undone when the module ends."""
    with module_transaction(django_db_blocker):
        cast = build_cast(django_db_blocker)
        with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHERS):
            cast.world = _world(cast.acme, cast.operator)
            cast.token_user = make_user("acme-opapprover", cast.acme, Role.OPERATOR, Role.APPROVER)
        yield cast


_acme, _globex, _operator, _approver, _auditor, _admin, _integrator, _outsider = map(member, CAST)
_world_fixture = member("world")


def _open_alert(task_id: Any) -> Alert:
    task = Task.objects.get(pk=task_id)
    return Alert.objects.create(
        tenant_id=task.tenant_id,
        task=task,
        kind=AlertKind.WAIT_PAST_DEADLINE,
        cause="matrix",
        raised_at=timezone.now(),
        state_version=task.state_version,
    )


def _task_for(name: str, world: SimpleNamespace) -> Task:
    return world.waiting if name in ("api-task-input", "console:task-answer") else world.task


PARAMS: dict[str, Callable[[str, SimpleNamespace], Any]] = {
    "task_id": lambda name, w: _task_for(name, w).id,
    "request_id": lambda name, w: w.approval.id,
    "operation_id": lambda name, w: w.operation.id,
    "control": lambda name, w: "cancel",
    "fmt": lambda name, w: "csv",
    "view_id": lambda name, w: w.view.pk,
    "alert_id": lambda name, w: w.alert.pk,
    "task_type": lambda name, w: "refund_request",
}


def _url(route: Route, world: SimpleNamespace) -> str:
    names = list(route.pattern.pattern.converters)
    unknown = [name for name in names if name not in PARAMS]
    if unknown:
        pytest.fail(f"{route.name} has path parameters {unknown} that PARAMS cannot fill")
    return reverse(route.name, kwargs={name: PARAMS[name](route.name, world) for name in names})


def _body(name: str, world: SimpleNamespace) -> dict[str, Any]:
    """What a permitted caller would send."""
    task = _task_for(name, world)
    if name == "api-tasks":
        return create_body(tenant="acme", idempotency_key="matrix")
    if name == "api-task-input":
        return {"expected_version": task.state_version, "payload": {"answer": "matrix"}}
    if name == "api-task-events-in":
        return {"event_key": "matrix", "event_type": "matrix", "payload": {}}
    if name == "api-task-rerun":
        return {"reason": "matrix"}
    if name == "api-task-fork":
        return {"version": 1, "reason": "matrix"}
    if name == "api-task-compensate":
        return {"action": "matrix", "reason": "matrix"}
    if name == "api-task-legal-hold":
        return {"hold": True, "reason": "matrix"}
    if name == "api-task-reveal":
        return {"field": "refund_card"}
    if name.startswith("api-task-"):  # an operator control
        return {"expected_version": task.state_version, "reason": "matrix"}
    if name == "api-approval-decide":
        return {"decision": "reject", "digest": world.approval.digest, "comment": "matrix"}
    if name == "console:task-control":
        return {"expected_version": task.state_version, "reason": "matrix", "confirm": "on"}
    if name == "console:task-answer":
        return {"expected_version": task.state_version, "answer": "matrix"}
    if name == "console:task-rerun":
        return {"reason": "matrix"}
    if name == "console:task-fork":
        return {"version": 1, "reason": "matrix", "confirm": "on"}
    if name == "console:task-compensate":
        return {"action": "matrix", "reason": "matrix", "confirm": "on"}
    if name == "console:task-legal-hold":
        return {"hold": "place", "reason": "matrix"}
    if name == "console:task-reveal":
        return {"field": "refund_card"}
    if name == "console:approval-decide":
        return {"decision": "reject", "digest": world.approval.digest, "comment": "matrix", "confirmed": "1"}
    if name == "console:theme":
        return {"theme": "dark", "next": "/console/"}
    if name == "console:saved-view-save":
        return {"name": "matrix", "query": "state=ready"}
    if name == "console:saved-view-delete":
        return {"confirm": "yes"}
    if name.endswith("alert-acknowledge"):
        return {"note": "matrix", "confirm": "on"}
    if name == "api-alert-snooze":
        return {"until": (timezone.now() + timedelta(hours=1)).isoformat(), "note": "matrix"}
    if name == "console:alert-snooze":
        return {"duration": "1h", "confirm": "on"}
    if name == "login":  # a wrong password: the form again, whoever asks
        return {"username": "acme-operator", "password": "not-the-password"}
    return {}


def _snapshot() -> tuple[Any, ...]:
    """Everything a write in this matrix could change (the access log aside: refusals are recorded)."""
    return (
        tuple(Task.objects.order_by("id").values_list("id", "state_version")),
        tuple(ApprovalRequest.objects.order_by("id").values_list("id", "status")),
        tuple(SavedView.objects.order_by("id").values_list("id", "name")),
        tuple(Alert.objects.order_by("id").values_list("id", "acknowledged_at", "snoozed_until")),
    )


def _client(principal: str, request: pytest.FixtureRequest, acme: Any) -> Client:
    if principal == "anonymous":
        return Client()
    if principal.startswith("token:"):
        user = request.getfixturevalue("shared").token_user  # acme-opapprover: operator and approver
        expires = timezone.now() + timedelta(hours=1)
        _, key = token_create(user, scopes=[principal.removeprefix("token:")], expires_at=expires)
        return Client(HTTP_AUTHORIZATION=f"Token {key}")
    client = Client()
    client.force_login(request.getfixturevalue(USER_FIXTURES[principal]))
    return client


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("case", _cases(), ids=lambda case: f"{case[0].name}-{case[1]}")
def test_the_answer_matches_the_matrix(request, case, principal, acme, world):
    route, method = case
    if (route.name, method) not in EXPECTED:
        pytest.fail(f"{route.name} {method} ({route.route}) has no row in EXPECTED")
    want = EXPECTED[(route.name, method)][principal]
    client = _client(principal, request, acme)
    before = _snapshot()
    response = _send(client, route, method, world)
    got, where = response.status_code, response.get("Location", "")

    if want == LOGIN:
        assert got == 302 and where.startswith("/accounts/login/"), (got, where)
    elif want == REDIRECT:
        assert got == 302 and not where.startswith("/accounts/login/"), (got, where)
    elif want == PASSED:
        assert got not in REFUSED and got < 500, (got, _text(response)[:300])
        assert not where.startswith("/accounts/login/"), where
    else:
        assert got == want, (got, where, _text(response)[:300])
    if got in REFUSED or want == LOGIN:
        assert _snapshot() == before, "refused, but something was written"
    if principal == "outsider" and got == 200:
        assert str(world.task.id) not in _text(response), "another tenant's task leaked into the answer"


def _send(client: Client, route: Route, method: str, world: SimpleNamespace) -> Any:
    url = _url(route, world)
    if method == "GET":
        return client.get(url)
    if route.name.startswith("api-"):
        return client.generic(method, url, json.dumps(_body(route.name, world)), "application/json")
    return client.generic(
        method, url, urlencode(_body(route.name, world)), "application/x-www-form-urlencoded"
    )


# What a session of an approver or admin may open before its second factor (tenancy.second_factor).
OPEN_BEFORE_THE_CODE = {"login", "logout", "second-factor", "second-factor-enroll"}


@pytest.mark.parametrize("principal", ["approver", "admin"])
@pytest.mark.parametrize(
    "case",
    [case for case in _cases() if case[0].name not in OPEN_BEFORE_THE_CODE],
    ids=lambda case: f"{case[0].name}-{case[1]}",
)
def test_a_session_without_its_second_factor_opens_only_the_accounts_pages(request, case, principal, world):
    """Password given, code not: every console page and control sends to the code page, every API
    call made with the session is 403, and nothing is written."""
    route, method = case
    client = Client()
    client.force_login(request.getfixturevalue(USER_FIXTURES[principal]))
    forget_second_factor(client)
    before = _snapshot()
    response = _send(client, route, method, world)
    got, where = response.status_code, response.get("Location", "")
    if route.name.startswith("api-"):
        assert got == 403 and "second factor" in _text(response), (got, _text(response)[:300])
    else:
        assert got == 302 and where.startswith("/accounts/second-factor/"), (got, where)
    assert _snapshot() == before, "refused, but something was written"


def _text(response: Any) -> str:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return body.decode("utf-8", "replace")


def test_a_token_with_every_scope_still_has_only_its_users_roles(acme, auditor):
    """Scopes narrow a token; they never add to what its user's roles allow."""
    task = make_task(acme)
    _, key = token_create(auditor, scopes=["read", "operate", "approve", "integrate"], expires_at=None)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get(f"/api/tasks/{task.id}/").status_code == 200
    body = json.dumps({"expected_version": task.state_version, "reason": "no"})
    assert client.post(f"/api/tasks/{task.id}/cancel/", body, "application/json").status_code == 403
    assert client.post("/api/tasks/", json.dumps(create_body()), "application/json").status_code == 403
    assert Task.objects.get(pk=task.pk).state_version == task.state_version
