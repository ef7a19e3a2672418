"""Two deployments at once across the effect key scheme: every effect sent once, under its stored key.

The older deployment keys every effect by its task's id (``ledger.keys`` scheme
``TASK``): it is this tree with the one line of ``tasks/effect_keys.py`` that
picks the scope changed back to the task's id, run from a copy by real
``manage.py run_worker`` processes (``DEPLOYMENT_ID`` ``keys-old``). This
deployment keys the effects of a task started with a client idempotency key by
that key (scheme ``INTENT``). Every task here has a client key, so the two
disagree about every key; the payment system (the sandbox over HTTP) counts
what arrives.

- An action the older deployment wrote and a newer worker finds (intended and
  unsent, or sent with its answer unrecorded) keeps its stored key: the newer
  worker sends it, or settles it by lookup, under that key. Once.
- An action this deployment wrote and an older worker finds: the older code
  recomputes the key in the only scheme it knows, sees another key, and
  quarantines the task (``effect_changed_after_intent``) — it never sends under
  a key of its own. That is as far as an older release can go; this deployment's
  sweep checks the quarantine again in the action's own scheme, finds the facts
  unchanged, and lifts it (``key_scheme_quarantine_lifted``), and a newer worker
  finishes the task under the stored key. Once.
- Side by side on many tasks, with answers lost on the way back, workers of both
  killed and replaced: nothing is sent twice, every action keeps the key it was
  written with, and every task completes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from audit.models import TransitionEvent
from demo.sandbox.models import Effect, Fault
from ledger import keys
from ledger.models import Action
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.upgrades import checkouts
from tests.workflow import WorkerProcess, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CONTRACT = "tasks/effect_keys.py"
CONTRACT_LINE = "    return _stable_scope(task) or keys.task_scope(task.id)\n"
OLDER_CONTRACT_LINE = "    return keys.task_scope(task.id)\n"
OLD, NEW = "keys-old", "keys-new"  # DEPLOYMENT_ID of each
WORKER_ENV = {
    "LOG_LEVEL": "WARNING",
    "CONNECTOR_TIMEOUT": "0.5",
    "CONNECTOR_MAX_IN_FLIGHT": "2",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
    "RECONCILE_INTERVAL": "1",
    "SWEEP_INTERVAL": "1",
    "UNKNOWN_OUTCOME_ESCALATE_AFTER": "600",
}
SCHEME = {OLD: keys.Scheme.TASK, NEW: keys.Scheme.INTENT}


@pytest.fixture(scope="module")
def older(tmp_path_factory) -> Path:
    """The older deployment's tree (one copy for the module: no test writes to it)."""
    return checkouts.older_checkout(
        tmp_path_factory.mktemp("key-scheme"), CONTRACT, CONTRACT_LINE, OLDER_CONTRACT_LINE
    )


@pytest.fixture
def deployments(workers, monkeypatch, older, settings):
    """``start(deployment, **kwargs)``: a worker of the older checkout (``OLD``) or of this tree."""
    settings.DEPLOYMENT_ID = NEW

    def start(deployment: str, *, pause_after: str = "", concurrency: int = 1) -> WorkerProcess:
        extra_env = {**WORKER_ENV, "DEPLOYMENT_ID": deployment}
        kwargs = {"pause_after": pause_after, "lease_ttl": 1.0, "extra_env": extra_env,
                  "args": ("--concurrency", str(concurrency))}  # fmt: skip
        if deployment == OLD:
            with checkouts.started_from(older, monkeypatch):
                return workers(**kwargs)
        return workers(**kwargs)

    return start


def invoice(tenant, n: int) -> Task:
    return make_task(
        tenant,
        task_type="pay_invoice",
        objective=f"Pay INV-KS-{n:03d}",
        input={"invoice_id": f"INV-KS-{n:03d}", "amount": f"{10 + n}.00", "currency": "EUR"},
        idempotency_key=f"client-order-ks-{n:03d}/pay",
    )


def written_by(action: Action, deployment: str) -> bool:
    """Whether ``action``'s key is of the scheme, and the scope, ``deployment`` writes."""
    task = action.task
    scope = (
        keys.task_scope(task.id)
        if deployment == OLD
        else keys.intent_scope(task.tenant_id, task.task_type, task.idempotency_key or "")
    )
    return action.key_scheme == SCHEME[deployment] and action.idempotency_key.startswith(
        f"{scope.value}:pay:"
    )


def state(task: Task) -> str:
    return Task.objects.values_list("state", flat=True).get(pk=task.pk)


def paid_once_under(task: Task, stored_key: str) -> None:
    """The task completed, on one payment, sent under ``stored_key``."""
    action = Action.objects.get(task=task)
    assert action.idempotency_key == stored_key  # kept, whoever sent or settled it
    [effect] = Effect.objects.filter(system="payments", request__invoice=task.input["invoice_id"])
    assert (effect.idempotency_key, effect.deliveries) == (stored_key, 1)
    assert Task.objects.get(pk=task.pk).outcome["payment_ref"] == str(effect.pk)


@pytest.mark.parametrize("point", ["step:pay", "dispatched:payments"])
def test_an_action_the_older_deployment_wrote_is_finished_under_its_key(acme, deployments, settings, point):
    settings.DEPLOYMENT_ID = OLD  # created by the older API: its worker's first commit is the intent
    task = invoice(acme, 1)
    old = deployments(OLD, pause_after=point)
    old.wait_paused()
    old.kill()  # intended and unsent, or sent and its answer never recorded
    action = Action.objects.get(task=task)
    assert written_by(action, OLD)
    deployments(NEW)
    wait_for(lambda: state(task) in (State.COMPLETED, State.QUARANTINED), timeout=60, what="the task to end")
    assert state(task) == State.COMPLETED
    paid_once_under(task, action.idempotency_key)


@pytest.mark.parametrize("point", ["step:pay", "dispatched:payments"])
def test_an_action_this_deployment_wrote_is_quarantined_by_an_older_worker_then_finished_by_a_newer_one(
    acme, deployments, point
):
    task = invoice(acme, 2)
    new = deployments(NEW, pause_after=point)
    new.wait_paused()
    new.kill()
    action = Action.objects.get(task=task)
    assert written_by(action, NEW)
    sent_before = Effect.objects.filter(system="payments").count()

    old = deployments(OLD)  # the only worker now: it meets a key it cannot compute
    wait_for(lambda: state(task) == State.QUARANTINED, timeout=60, what="the older worker to quarantine")
    old.stop()
    refused = TransitionEvent.objects.get(task=task, to_state=State.QUARANTINED)
    assert refused.reason_code == "effect_changed_after_intent"
    assert refused.actor_id.endswith(f":{old.process.pid}")
    assert Effect.objects.filter(system="payments").count() == sent_before  # it sent nothing of its own

    deployments(NEW)
    wait_for(lambda: state(task) == State.COMPLETED, timeout=60, what="a newer worker to finish the task")
    lifted = TransitionEvent.objects.get(task=task, from_state=State.QUARANTINED)
    assert (lifted.reason_code, lifted.to_state) == ("key_scheme_quarantine_lifted", State.RESUME_VALIDATION)
    paid_once_under(task, action.idempotency_key)


def test_old_and_new_workers_side_by_side_send_nothing_twice(acme, deployments):
    tasks = [invoice(acme, n) for n in range(24)]
    # Slow payments (so the two overlap on tasks), and answers lost on the way back (in doubt, looked up).
    Fault.objects.create(system="payments", operation="dispatch", kind="latency", remaining=10_000,
                         params={"ms": 150})  # fmt: skip
    Fault.objects.create(system="payments", operation="dispatch", kind="timeout", remaining=6,
                         params={"seconds": 1})  # fmt: skip
    fleet = [deployments(OLD, concurrency=2), deployments(NEW, concurrency=2)]
    wait_for(lambda: Effect.objects.filter(system="payments").count() >= 6, timeout=60, what="a few payments")
    for worker in list(fleet):  # one of each killed mid-run, and replaced
        worker.kill()
    fleet += [deployments(OLD, concurrency=2), deployments(NEW, concurrency=2)]
    ids = [t.pk for t in tasks]
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, state=State.COMPLETED).count() == len(ids),
        timeout=150,
        what="every task to complete",
    )

    paid = Counter(e.request["invoice"] for e in Effect.objects.filter(system="payments"))
    assert paid == Counter({t.input["invoice_id"]: 1 for t in tasks})  # each invoice paid once
    actions = list(Action.objects.filter(task_id__in=ids).select_related("task"))
    assert Counter(a.task_id for a in actions) == Counter({i: 1 for i in ids})
    sent = {e.idempotency_key: e for e in Effect.objects.filter(system="payments")}
    for action in actions:
        assert written_by(action, OLD) or written_by(action, NEW), action.idempotency_key
        assert action.idempotency_key in sent  # the payment is the one its stored key names
    schemes = Counter(a.key_scheme for a in actions)
    assert schemes[keys.Scheme.TASK] and schemes[keys.Scheme.INTENT], schemes  # both deployments wrote
