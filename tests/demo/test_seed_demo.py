"""seed_demo leaves, per tenant, a standing case of every kind an operator triages.

Seeded twice (idempotent) on PostgreSQL; then the sweep, the reconciler and a
worker round run in-process against the sandbox over real HTTP (``live_server``),
as ``make demo`` runs them, and every standing case is still standing.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent as Event
from demo.cases.refund_request import LONG_HISTORY
from demo.cases.seeding import STUCK_REGION
from demo.management.commands.seed_demo import DEMO_TOTP_SECRET, TENANTS, give_demo_device
from demo.sandbox.models import Fault
from ledger.models import Action, DispatchState
from runtime import rollups
from runtime.reconcile import reconcile_unknown
from runtime.runner import run_available
from runtime.sweep import sweep
from tasks import compensation
from tasks.models import Task
from tasks.selectors import stuck_condition
from tasks.states import TERMINAL, State
from tests.console.test_agent_turns import off_the_loop
from tests.second_factor import key_of, totp_code

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# demo-<key>: (state, state_reason) that must hold after seeding and after the runtime ran.
STANDING = {
    "input": (State.WAITING_INPUT, None),
    "external": (State.WAITING_EXTERNAL, None),
    "retry-long": (State.WAITING_RETRY, "evidence_unavailable"),
    "quarantined": (State.QUARANTINED, "quarantine"),
    # Written by a newer deployment: left untouched for its workers (mixed-version rollouts).
    "q-newer": (State.WAITING_INPUT, None),
    "q-corrupt": (State.QUARANTINED, "checkpoint_corrupt"),
    "q-unmigratable": (State.QUARANTINED, "checkpoint_unmigratable"),
    "q-step-error": (State.QUARANTINED, "step_error"),
    "q-tampered": (State.QUARANTINED, "checkpoint_digest_mismatch"),
    "unknown": (State.OUTCOME_UNKNOWN, None),
    "stuck": (State.READY, None),
    "failed": (State.FAILED, "refund_rejected_by_approver"),
    "approval": (State.WAITING_APPROVAL, "approval_requested"),
    "reapproval": (State.WAITING_APPROVAL, "approval_requested"),
    "long-history": (State.WAITING_EXTERNAL, None),
    "children": (State.WAITING_CHILDREN, None),
}


@pytest.fixture
def demo(live_server, settings):
    settings.DEBUG = True
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("seed_demo")
    return settings


def by_key(slug: str) -> dict[str, Task]:
    tasks = Task.objects.filter(tenant__slug=slug, idempotency_key__startswith="demo-")
    return {task.idempotency_key.removeprefix("demo-"): task for task in tasks}


def assert_standing(slug: str) -> dict[str, Task]:
    tasks = by_key(slug)
    for key, (state, reason) in STANDING.items():
        task = tasks[key]
        assert task.state == state, (slug, key, task.state, task.state_reason)
        if reason is not None:
            assert task.state_reason == reason, (slug, key, task.state_reason)
    return tasks


def test_seeding_twice_changes_nothing(demo):
    counts = (
        Task.objects.count(),
        Event.objects.count(),
        ApprovalRequest.objects.count(),
        Fault.objects.count(),
    )
    call_command("seed_demo")
    again = (
        Task.objects.count(),
        Event.objects.count(),
        ApprovalRequest.objects.count(),
        Fault.objects.count(),
    )
    assert again == counts


def test_the_dashboard_reads_the_seeded_tasks_right_after_seeding(demo):
    # No beat has run: the reading is seed_demo's own recount, of every task it seeded.
    acme = Task.objects.filter(tenant__slug="acme")
    in_progress = acme.exclude(state__in=TERMINAL).count()
    assert in_progress > 0
    client = Client()
    client.force_login(get_user_model().objects.get(username="acme-operator"))
    html = client.get("/console/dashboard/").content.decode()
    assert "No reading yet" not in html and "as of" in html
    assert f"<strong>{in_progress}</strong> tasks in progress" in html
    # The queue's maintained counts, per state, are the seeded tasks' too.
    states = sorted(set(acme.values_list("state", flat=True)))
    counted = rollups.state_counts([acme.first().tenant_id], [(state, [state]) for state in states])
    assert {state: found.n for state, found in counted.items()} == {
        state: acme.filter(state=state).count() for state in states
    }


def test_refuses_under_production_settings(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="production"):
        call_command("seed_demo")


def test_every_case_exists_per_tenant_and_stays_standing_while_the_runtime_runs(demo):
    for slug in TENANTS:
        tasks = assert_standing(slug)
        assert tasks["stuck"].region == STUCK_REGION != django_settings.WORKER_REGION
        assert tasks["long-history"].events.count() >= LONG_HISTORY
        reapproval = ApprovalRequest.objects.filter(task=tasks["reapproval"]).order_by("created_at")
        first, second = list(reapproval)
        assert (first.status, second.status) == (ApprovalStatus.APPROVED, ApprovalStatus.PENDING)
        assert first.evidence[0]["record_version"] == "1" and second.evidence[0]["record_version"] == "2"
        assert first.digest != second.digest  # the payment asked about changed with the record
        action = Action.objects.get(task=tasks["unknown"])
        assert Fault.objects.filter(operation="lookup", params__key=action.idempotency_key).exists()
        assert tasks["canceled"].state == State.CANCEL_REQUESTED  # its ticket opened; a worker confirms

    # What make demo runs, in-process: the sweep, the reconciler (past the escalation threshold,
    # asking at once), worker rounds. The two "ready" tasks may complete; nothing standing moves.
    demo.UNKNOWN_OUTCOME_ESCALATE_AFTER = 0
    demo.LEDGER_LOOKUP_INTERVAL = 0

    def rounds() -> None:
        for _ in range(3):
            sweep(lambda task_id, region: None)
            reconcile_unknown()
            while run_available(worker_id="test-worker", region=demo.WORKER_REGION, limit=20):
                pass

    off_the_loop(rounds)  # a worker's thread: the support agent's SDK runner needs one without a loop

    later = timezone.now() + timedelta(seconds=demo.STUCK_AFTER + 1)
    stuck = set(Task.objects.filter(stuck_condition(later)).values_list("idempotency_key", flat=True))
    for slug in TENANTS:
        tasks = assert_standing(slug)
        unknown = tasks["unknown"]
        assert unknown.escalation_level == 1 and unknown.escalated_to == "operator"
        action = Action.objects.get(task=unknown)
        assert action.dispatch_state == DispatchState.UNKNOWN
        assert "503" in action.last_error
        assert (
            ApprovalRequest.objects.filter(task__tenant__slug=slug, status=ApprovalStatus.PENDING).count()
            >= 2
        )
    assert {"demo-stuck", "demo-unknown"} <= stuck
    for slug in TENANTS:  # the support agent (an SDK agent): the small refund ran to its end, the
        # one above the limit to its pause, its refund_order call waiting for an approver
        done, asked = by_key(slug)["agent-refund"], by_key(slug)["agent-approval"]
        assert done.state == State.COMPLETED, done.state_reason
        assert "Refunded 20.00 USD for order A-118" in done.outcome["answer"]
        assert [a.dispatch_state for a in Action.objects.filter(task=done)] == [DispatchState.SUCCEEDED] * 2
        assert asked.state == State.WAITING_APPROVAL, asked.state_reason
        assert ApprovalRequest.objects.get(task=asked).step == "refund_order#call_2_refund_order:approve"
        assert not Action.objects.filter(task=asked).exists()
    for slug in TENANTS:  # the batch in the workers' region ran to its end, its children first
        batch = by_key(slug)["batch"]
        assert batch.state == State.COMPLETED and batch.outcome["lookups_completed"] == 3
        waiting = by_key(slug)["children"]
        assert [c.state for c in waiting.children.all()] == [State.READY, State.READY]
        # Canceled after its ticket was opened: the worker confirmed the cancel, and the report
        # offers close_ticket to undo the ticket it could not unsend.
        canceled = by_key(slug)["canceled"]
        assert canceled.state == State.CANCELED
        [left] = canceled.outcome["effects_not_undone"]
        assert (left["step"], left["compensation"]) == ("open_ticket", "close_ticket")
        [offer] = compensation.offers(canceled)
        assert offer.step == "close_ticket" and offer.run is None


def test_demo_approvers_and_admins_sign_in_with_the_public_demo_secret_and_operators_without(demo):
    for username in ("acme-approver", "acme-approver2", "acme-admin", "globex-admin"):
        client = Client()
        client.post("/accounts/login/", {"username": username, "password": "demo"})
        code = totp_code(key_of(DEMO_TOTP_SECRET))
        response = client.post("/accounts/second-factor/", {"code": code}, follow=True)
        assert response.request["PATH_INFO"].startswith("/console/"), username
        assert response.status_code == 200, username
    operator = Client()
    landed = operator.post("/accounts/login/", {"username": "acme-operator", "password": "demo"}, follow=True)
    assert landed.request["PATH_INFO"] == "/console/"


def test_seed_demo_code_prints_the_code_a_demo_approver_signs_in_with(approver, settings):
    settings.DEBUG = True
    give_demo_device(approver)  # as seed_demo does for every demo approver and admin
    out = StringIO()
    call_command("seed_demo", "--code", stdout=out)
    client = Client()
    client.post("/accounts/login/", {"username": approver.username, "password": "pw"})
    response = client.post("/accounts/second-factor/", {"code": out.getvalue().strip()}, follow=True)
    assert response.request["PATH_INFO"] == "/console/approvals/"


def test_the_demo_site_admin_opens_the_admin_and_the_login_page_names_the_demo_users(demo):
    page = Client().get("/accounts/login/").content.decode()
    assert "Demo users" in page
    for name in ("acme-operator", "globex-approver2", "acme-auditor", "acme-integrator", "demo-admin"):
        assert name in page, name
    admin = Client()
    admin.post("/accounts/login/", {"username": "demo-admin", "password": "demo"})
    admin.post("/accounts/second-factor/", {"code": totp_code(key_of(DEMO_TOTP_SECRET))})
    assert admin.get("/admin/").status_code == 200
    assert admin.get("/admin/tasks/policy/").status_code == 200
    operator = Client()
    operator.post("/accounts/login/", {"username": "acme-admin", "password": "demo"})
    operator.post("/accounts/second-factor/", {"code": totp_code(key_of(DEMO_TOTP_SECRET))})
    assert operator.get("/admin/").status_code == 302  # a tenant admin is not the site's


def test_the_login_page_lists_no_account_outside_a_development_run(demo, settings):
    settings.DEBUG = False
    page = Client().get("/accounts/login/").content.decode()
    assert "Demo users" not in page and "acme-operator" not in page
