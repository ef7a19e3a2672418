"""The dashboard (``/console/dashboard/``): every role reads it, each only about its own tenants.

A small world in acme (tasks in several states, one waiting two hours, one
effect in doubt, two decided approvals with known latencies) and one task in
globex; the page must show acme's numbers to acme's people, globex's to
globex's operator, within a fixed number of queries, with no inline style.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalRequest
from ledger.models import Action, DispatchState
from runtime import controls, rollups
from runtime.models import ModelUsage
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.console.test_approvals import ask

pytestmark = pytest.mark.django_db

ROLES = ("operator", "approver", "auditor", "admin_user", "integrator", "outsider")
QUERY_CEILING = (
    24  # measured 19-23 with a cold cache (the shared reading's 8 and the usage table's 1), plus room
)


@pytest.fixture(autouse=True)
def fresh_readings(settings):
    settings.METRICS_CACHE_SECONDS = 0


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(acme, globex, operator, approver):
    now = timezone.now()
    waiting = make_task(acme, objective="Waits for the customer")
    Task.objects.filter(pk=waiting.pk).update(
        state=State.WAITING_INPUT,
        wait_deadline=now + timedelta(days=1),
        state_entered_at=now - timedelta(hours=2),
    )
    held = make_task(acme, objective="Held by an operator")
    controls.task_control(
        held, "quarantine", user=operator, roles=frozenset({"operator"}), expected_version=1, reason="look"
    )
    doubtful = make_task(acme, task_type="pay_invoice", objective="Pay INV-9",
                         input={"invoice_id": "INV-9", "amount": "5.00", "currency": "EUR"})  # fmt: skip
    Action.objects.create(
        task=doubtful, step="pay", idempotency_key="dashboard-doubt-1", connector="payments", effect={},
        effect_digest="0" * 64, dispatch_state=DispatchState.UNKNOWN,
        unknown_since=now - timedelta(minutes=7), created_at=now, updated_at=now,
    )  # fmt: skip
    for minutes in (10, 30):
        request = ask(make_task(acme, owner=operator, objective=f"Refund after {minutes}"))
        approvals.approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
        ApprovalRequest.objects.filter(pk=request.pk).update(
            created_at=ApprovalRequest.objects.get(pk=request.pk).decided_at - timedelta(minutes=minutes)
        )
    other = make_task(globex, objective="Globex private work")
    return {"waiting": waiting, "held": held, "doubtful": doubtful, "other": other}


def page(user) -> str:
    """The page after a recount (the beat's job: the page itself reads the stored reading only)."""
    rollups.refresh()
    response = client_for(user).get("/console/dashboard/")
    assert response.status_code == 200
    return response.content.decode()


def cell_after(html: str, label: str) -> list[str]:
    """The numbers in the table row whose header links to ``label``'s state badge."""
    inside = r"(?:(?!</tr>).)*?"  # within one row
    row = re.search(rf'<tr>\s*<th scope="row">{inside}>{re.escape(label)}</span>{inside}</tr>', html, re.S)
    assert row, label
    return re.findall(r'<td class="num[^"]*">(?:<strong>)?(\d+)', row.group(0))


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_the_dashboard_in_a_bounded_number_of_queries(
    role, request, world, django_assert_max_num_queries
):
    client = client_for(request.getfixturevalue(role))
    rollups.refresh()
    with django_assert_max_num_queries(QUERY_CEILING):
        response = client.get("/console/dashboard/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Dashboard</h1>" in html
    assert 'aria-current="page">Dashboard</a>' in html


def test_the_query_count_does_not_grow_with_the_tasks(world, acme, operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(operator)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/console/dashboard/").status_code == 200
        return len(captured)

    few = queries()
    now = timezone.now()
    for n in range(30):
        task = make_task(acme, objective=f"More {n}")
        Task.objects.filter(pk=task.pk).update(
            state=State.WAITING_EXTERNAL, wait_deadline=now + timedelta(hours=n + 1)
        )
    assert queries() == few


def test_before_the_first_recount_the_page_says_so_and_reads_no_count(world, operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        html = client_for(operator).get("/console/dashboard/").content.decode()
    assert "No reading yet" in html
    grouped = [q["sql"] for q in captured if "GROUP BY" in q["sql"] and 'FROM "tasks_task"' in q["sql"]]
    assert grouped == []  # no count of the tasks table in the request


def test_the_counts_are_the_stored_readings_until_the_next_recount(world, acme, operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    rollups.refresh()
    make_task(acme, task_type="pay_invoice", objective="Pay INV-10",
              input={"invoice_id": "INV-10", "amount": "5.00", "currency": "EUR"})  # fmt: skip
    with CaptureQueriesContext(connection) as captured:
        html = client_for(operator).get("/console/dashboard/").content.decode()
    assert cell_after(html, "Ready") == ["1", "0", "1"]  # as of the recount
    assert not [q["sql"] for q in captured if "GROUP BY" in q["sql"] and 'FROM "tasks_task"' in q["sql"]]
    assert cell_after(page(operator), "Ready") == ["2", "0", "2"]  # the next recount has it


def test_the_dashboard_shows_only_the_readers_tenants(world, operator, outsider):
    mine, theirs = page(operator), page(outsider)
    assert str(world["waiting"].id).replace("-", "")[-8:] in mine
    assert str(world["waiting"].id).replace("-", "")[-8:] not in theirs
    assert "dashboard-doubt-1" in mine and "dashboard-doubt-1" not in theirs
    assert cell_after(theirs, "Ready") == ["1", "1"]  # globex's one task: refund_request, total
    assert "Quarantined" not in theirs


def test_the_dashboard_counts_tasks_by_state_and_type(world, operator):
    html = page(operator)
    # Columns: pay_invoice, refund_request, total.
    assert cell_after(html, "Quarantined") == ["0", "1", "1"]
    assert cell_after(html, "Waiting Input") == ["0", "1", "1"]
    assert cell_after(html, "Ready") == ["1", "0", "1"]


def test_waiting_tasks_land_in_their_age_bucket(world, operator):
    html = page(operator)
    ages = html[html.index('id="ages-h"') :]
    # Buckets ≤1m … ≤7d, >7d, then the total: two hours old is in ≤4h.
    assert cell_after(ages, "Waiting Input") == ["0", "0", "0", "0", "1", "0", "0", "0", "0", "1"]


def test_the_oldest_waits_and_unknown_outcomes_link_to_their_tasks(world, operator):
    html = page(operator)
    assert f'href="/console/tasks/{world["waiting"].id}/"' in html
    assert "2.0 h" in html  # how long it has waited
    assert f'href="/console/tasks/{world["doubtful"].id}/"' in html
    assert "dashboard-doubt-1" in html and "7 min" in html
    assert "<strong>1</strong> unknown outcome " in html


def test_approval_latency_is_the_median_and_p90_of_the_last_day(world, operator):
    html = page(operator)
    assert "<strong>20 min</strong> median approval wait" in html
    assert "(p90 28 min; 2 decided in 24 h)" in html


def test_the_transition_rate_counts_this_hour(world, operator):
    html = page(operator)
    # Every task's start, the quarantine, the approvals' moves: all in the last hour.
    last_hour = int(re.search(r"<strong>(\d+)</strong> transitions? in the last hour", html).group(1))
    assert last_hour >= 8
    assert 'class="spark-line"' in html


def test_charts_use_no_inline_style_and_no_script(world, operator):
    html = page(operator)
    assert "style=" not in html
    assert "<script>" not in html and "<script " not in html.split("</head>")[1]


def test_the_live_refresh_gets_the_changing_block_only(world, operator):
    response = client_for(operator).get("/console/dashboard/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "HX-Request" in response["Vary"]
    assert html.lstrip().startswith('<div id="dashboard-live"') and "<html" not in html
    assert 'hx-trigger="every 5s"' in html and "data-live-poll" in html


def test_open_alerts_link_to_the_alerts_page_for_those_who_read_it(world, acme, operator, approver):
    from runtime.models import Alert, AlertKind

    Alert.objects.create(
        tenant=acme,
        task=world["held"],
        kind=AlertKind.QUARANTINE_OVERDUE,
        cause="c",
        raised_at=timezone.now(),
    )
    assert '<strong>1</strong> <a href="/console/alerts/">open alert</a>' in page(operator)
    assert "<strong>1</strong> open alert" in page(approver)  # approvers do not read the alerts page


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.get("/console/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def _billed(task: Task, version: int, tokens: int, cost: str | None, *, hours_ago: float = 0) -> None:
    ModelUsage.objects.create(
        task=task,
        step="agent",
        state_version=version,
        attempt=0,
        model_id="scripted-support-v1",
        input_tokens=tokens,
        output_tokens=1,
        cost=None if cost is None else Decimal(cost),
        committed=True,
        recorded_at=timezone.now() - timedelta(hours=hours_ago),
    )


def usage_rows(text: str) -> dict[str, list[str]]:
    table = text.split('class="grid usage"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = {}
    for row in re.findall(r"<tr>.*?</tr>", table, flags=re.S):
        cells = [
            " ".join(re.sub(r"<[^>]+>", " ", cell).split())
            for cell in re.findall(r"<t[hd][^>]*>.*?</t[hd]>", row, flags=re.S)
        ]
        rows[cells[0]] = cells[1:]
    return rows


def test_model_usage_by_task_type_counts_the_agents_turns_of_the_last_day_in_the_readers_tenants(
    world, acme, globex, operator
):
    support = make_task(
        acme,
        task_type="support_agent",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": "5.00"},
    )
    _billed(support, 2, 100, "0.000100")
    _billed(support, 4, 200, "0.000200")
    _billed(support, 6, 5_000, "0.5", hours_ago=25)  # before the window
    refund = make_task(acme, objective="Refund order A-2")
    _billed(refund, 2, 40, None)  # no price: the type's cost is unpriced, not a smaller sum
    _billed(make_task(globex), 2, 7_000, "0.7")  # another tenant's

    rows = usage_rows(page(operator))

    assert rows == {
        "refund_request": ["1", "40", "1", "unpriced (1 turn)"],
        "support_agent": ["2", "300", "2", "0.000300"],
    }
