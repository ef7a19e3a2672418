"""The agents benchmark compares like with like: its native twin and its byte count, run in-process.

``make bench-agents`` needs minutes of worker processes; what its figures rest on is checked here
in seconds, through the in-process resume loop against the sandbox over real HTTP: the native twin
asks the model as often as the SDK agent and sends the same effects, and the byte count finds what
each kind of run stores (a snapshot only where the SDK paused).
"""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from bench import sdk_agents as bench
from demo.sandbox.models import Effect
from runtime.models import ModelUsage
from tasks import registry
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tests.conftest import make_user
from tests.runtime.payments import run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def native(monkeypatch):
    """The bench's native type, registered into a copy of the registry that the test gives back."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    bench.register_native()


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10  # a loaded machine (2 cores, workers of other suites) must not decide
    settings.LEDGER_LOOKUP_INTERVAL = 0


def run_until_still(task: Task, limit: int = 40) -> Task:
    for _ in range(limit):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError(f"{task.task_type} did not settle")


def one_task(slug: str, kind: str, amount: str) -> Task:
    return Task.objects.get(tenant=bench._make_tasks(slug, kind, 1, amount))


def test_the_native_twin_asks_the_model_as_often_as_the_agent_and_sends_the_same_effects():
    done = {
        kind: run_until_still(one_task(f"small-{i}", kind, bench.SMALL)) for i, kind in enumerate(bench.KINDS)
    }

    for kind, task in done.items():
        assert task.state == State.COMPLETED, task.state_reason
        bench._verify(task.tenant)  # one refund, one e-mail, the answer, the chain
        assert ModelUsage.objects.filter(task=task).count() == 4, kind
    sent = {
        kind: sorted(
            (e.system, e.request.get("amount"), e.request.get("template"))
            for e in Effect.objects.filter(request__order_id=task.input["order_id"])
        )
        for kind, task in done.items()
    }
    assert (
        sent[bench.SDK] == sent[bench.NATIVE] == [("email", None, "refund_paid"), ("payments", "30.00", None)]
    )


def test_the_byte_count_finds_each_runs_records_and_the_snapshot_only_where_the_sdk_paused():
    tasks = {
        kind: run_until_still(one_task(f"large-{i}", kind, bench.LARGE)) for i, kind in enumerate(bench.KINDS)
    }
    for kind, task in tasks.items():
        assert task.state == State.WAITING_APPROVAL, (kind, task.state_reason)
        approver = make_user(f"approver-{task.tenant.slug}", task.tenant, Role.APPROVER)
        request = ApprovalRequest.objects.get(task=task, status="pending")
        approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
        tasks[kind] = run_until_still(Task.objects.get(pk=task.pk))
        assert tasks[kind].state == State.COMPLETED, tasks[kind].state_reason

    stored = {kind: bench.stored_bytes(task.pk) for kind, task in tasks.items()}

    for kind, task in tasks.items():
        rows = {label: count for label, (count, _) in stored[kind].items()}
        assert rows["checkpoints"] == rows["transition events"] == task.state_version, kind
        assert rows["approval requests"] == rows["approval decisions"] == rows["money movements"] == 1, kind
        assert rows["ledger actions"] == 2 and rows["model usage"] == 4, kind
        assert all(size > 0 for count, size in stored[kind].values() if count), kind
    assert stored[bench.SDK]["agent turns"][0] == 4 and stored[bench.SDK]["agent snapshots"][0] == 1
    assert stored[bench.NATIVE]["agent turns"] == stored[bench.NATIVE]["agent snapshots"] == (0, 0)
    # The snapshot is the SDK's whole run state: larger than every turn it recorded together.
    assert stored[bench.SDK]["agent snapshots"][1] > stored[bench.SDK]["agent turns"][1]
