"""Regional ownership on PostgreSQL: claims by region, the epoch fence, ``runtime.failover`` and its command.

A task is advanced by one region at a time: its ``region`` says whose workers
claim it, its ``ownership_epoch`` fences every commit. What is checked: a
worker claims only its region's tasks; a lease claimed before a failover can
neither commit (``StaleEpoch``, nothing written) nor claim a send nor
heartbeat, even when its lease row still looks live; everyone else goes on
working on the moved task; the failover verifies (checkpoint, ledger) before
it moves anything, reports what it left behind and why, and moves nothing
twice; the sweep and the reconciler touch only their own region's tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit.models import TransitionEvent
from ledger.models import Action, DispatchState
from ledger.services import action_move
from runtime import dispatch, failover, reconcile, sweep
from tasks import doorbell, leases
from tasks.exceptions import StaleEpoch, StaleVersion
from tasks.leases import Held
from tasks.models import Checkpoint, Lease, Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import ActionIntent, Actor, advance, advance_read
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db
OPERATOR = Actor(ActorKind.OPERATOR, "user:op")


def in_r1(tenant, **overrides) -> Task:
    return make_task(tenant, region="r1", **overrides)


def claim(task: Task, worker: str = "w-r1", region: str = "r1") -> Held:
    held = leases.claim(task.id, worker_id=worker, region=region)
    assert held is not None
    return held


def written(task: Task) -> tuple[int, int, int]:
    """What a refused commit must leave as it was: version, audit events, checkpoints."""
    return (
        Task.objects.get(pk=task.pk).state_version,
        TransitionEvent.objects.filter(task=task).count(),
        Checkpoint.objects.filter(task=task).count(),
    )


def step(task: Task, held: Held) -> Task:
    return advance(
        task.id,
        Task.objects.get(pk=task.pk).state_version,
        State.READY,
        actor=Actor.worker(held.worker_id),
        trigger=Trigger.STEP,
        progress=progress("lookup"),
        lease=held,
    )


def with_intent(task: Task, held: Held) -> Action:
    """A worker step that commits an effect to send (an ``intended`` ledger row)."""
    advance(
        task.id,
        task.state_version,
        State.READY,
        actor=Actor.worker(held.worker_id),
        trigger=Trigger.STEP,
        progress=progress("pay_refund"),
        actions=[ActionIntent(step="pay_refund", connector="payments", effect={"amount": "10.00"})],
        lease=held,
    )
    return Action.objects.get(task=task)


def test_a_worker_claims_only_its_own_regions_tasks(acme):
    task = in_r1(acme)
    assert leases.claim(task.id, worker_id="w-r2", region="r2") is None
    assert leases.claim_next(worker_id="w-r2", region="r2", limit=5) == []
    [held] = leases.claim_next(worker_id="w-r1", region="r1", limit=5)
    assert (held.task_id, held.epoch) == (task.id, 1)


def test_a_claim_after_a_failover_carries_the_new_epoch_and_only_the_new_region_gets_it(acme):
    task = in_r1(acme)
    failover.failover("r1", "r2")
    assert leases.claim_next(worker_id="w-r1", region="r1", limit=5) == []
    [held] = leases.claim_next(worker_id="w-r2", region="r2", limit=5)
    assert (held.task_id, held.epoch) == (task.id, 2)


def test_a_lease_claimed_before_a_failover_cannot_commit_and_nothing_is_written(acme):
    task = in_r1(acme)
    held = claim(task)
    before = written(task)
    failover.failover("r1", "r2")
    after_failover = written(task)
    assert after_failover[0] == before[0] + 1  # the failover's own transition
    with pytest.raises(StaleEpoch) as refused:
        step(task, held)
    assert refused.value.code == "stale_epoch"
    assert "'r2' at epoch 2" in str(refused.value) and "'r1' at epoch 1" in str(refused.value)
    assert written(task) == after_failover


def test_the_epoch_fence_refuses_even_a_lease_that_still_looks_live(acme):
    """The lease row alone does not protect: a heartbeat racing the failover, or a lease row restored,
    still cannot let the old region commit. The compare-and-set itself carries the epoch."""
    task = in_r1(acme)
    held = claim(task)
    read_before = Task.objects.get(pk=task.pk)  # the worker's row, read before the failover
    failover.failover("r1", "r2")
    Lease.objects.filter(task=task).update(expires_at=timezone.now() + timedelta(minutes=5))
    before = written(task)
    with pytest.raises(StaleEpoch):
        advance_read(
            read_before,
            State.READY,
            actor=Actor.worker(held.worker_id),
            trigger=Trigger.STEP,
            progress=progress("lookup"),
            lease=held,
        )
    assert written(task) == before
    assert Task.objects.get(pk=task.pk).region == "r2"


def test_an_old_regions_lease_can_neither_heartbeat_nor_claim_a_send_after_a_failover(acme):
    task = in_r1(acme)
    held = claim(task)
    action = with_intent(task, held)
    failover.failover("r1", "r2")
    assert not leases.heartbeat(held)
    assert Lease.objects.get(task=task).expires_at <= timezone.now()
    with pytest.raises(StaleEpoch):
        dispatch.claim(action.pk, lease=held)
    # Even with its lease row made live again, the epoch in the fence keeps the send unclaimed.
    Lease.objects.filter(task=task).update(expires_at=timezone.now() + timedelta(minutes=5))
    with pytest.raises(StaleEpoch):
        dispatch.claim(action.pk, lease=held)
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.INTENDED


def test_operators_the_system_and_the_new_regions_workers_go_on_after_a_failover(acme):
    task = in_r1(acme)
    failover.failover("r1", "r2")
    moved = Task.objects.get(pk=task.pk)
    escalated = advance(
        task.id,
        moved.state_version,
        State.READY,
        actor=OPERATOR,
        trigger=Trigger.ESCALATE,
        escalation_level=1,
    )
    assert (escalated.escalation_level, escalated.ownership_epoch, escalated.region) == (1, 2, "r2")
    held = claim(task, "w-r2", "r2")
    stepped = step(task, held)
    assert stepped.state_version == escalated.state_version + 1
    assert Task.objects.get(pk=task.pk).ownership_epoch == 2  # a routine commit never rewrites it


def test_the_failover_is_one_audited_transition_per_task(acme):
    task = in_r1(acme)
    report = failover.failover("r1", "r2", reason="r1 is down")
    assert (report.moved, report.blocked, report.skipped, report.verified) == ([task.id], [], [], 1)
    moved = Task.objects.get(pk=task.pk)
    assert (moved.state, moved.state_version, moved.region, moved.ownership_epoch) == (
        State.READY,
        2,
        "r2",
        2,
    )
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert (event.trigger, event.actor_id, event.from_state, event.to_state) == (
        Trigger.FAILOVER,
        "system:failover",
        State.READY,
        State.READY,
    )
    assert "r1 -> r2 (epoch 1 -> 2): r1 is down" in event.reason


def test_region_and_epoch_change_only_by_a_failover(acme):
    task = in_r1(acme)
    for change in ({"region": "r2"}, {"ownership_epoch": 2}):
        with pytest.raises(ValueError, match="only a failover"):
            advance(task.id, 1, State.READY, actor=OPERATOR, trigger=Trigger.ESCALATE, **change)
    assert (Task.objects.get(pk=task.pk).region, written(task)[0]) == ("r1", 1)


def test_a_dry_run_verifies_and_moves_nothing(acme):
    tasks = [in_r1(acme) for _ in range(3)]
    report = failover.failover("r1", "r2", dry_run=True)
    assert (report.verified, report.moved, report.blocked) == (3, [], [])
    for task in tasks:
        stored = Task.objects.get(pk=task.pk)
        assert (stored.region, stored.ownership_epoch, stored.state_version) == ("r1", 1, 1)


def test_a_task_with_an_in_doubt_action_is_blocked_until_it_is_reconciled(acme):
    doubtful, fine = in_r1(acme), in_r1(acme)
    action = with_intent(doubtful, claim(doubtful))
    assert action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    report = failover.failover("r1", "r2")
    assert report.moved == [fine.id]
    [blocked] = report.blocked
    assert (blocked.task_id, blocked.reason) == (doubtful.id, "action_in_doubt")
    assert f"action #{action.pk}" in blocked.detail and "dispatching" in blocked.detail
    assert (Task.objects.get(pk=doubtful.pk).region, Task.objects.get(pk=doubtful.pk).ownership_epoch) == (
        "r1",
        1,
    )

    assert action_move(action.pk, DispatchState.DISPATCHING, DispatchState.UNKNOWN)
    assert [b.task_id for b in failover.failover("r1", "r2").blocked] == [doubtful.id]  # unknown: same
    assert action_move(action.pk, DispatchState.UNKNOWN, DispatchState.RECONCILED_SUCCEEDED)
    assert failover.failover("r1", "r2").moved == [doubtful.id]


def test_a_send_claimed_between_verification_and_move_blocks_the_move(acme, monkeypatch):
    task = in_r1(acme)
    action = with_intent(task, claim(task))
    real = failover._in_doubt

    def claimed_right_after_the_check(task_ids):
        found = real(task_ids)  # nothing in doubt yet
        action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)  # the old region's claim
        return found

    monkeypatch.setattr(failover, "_in_doubt", claimed_right_after_the_check)
    report = failover.failover("r1", "r2")
    assert (report.moved, [b.reason for b in report.blocked]) == ([], ["action_in_doubt"])
    stored = Task.objects.get(pk=task.pk)
    assert (stored.region, stored.ownership_epoch) == ("r1", 1)
    assert Lease.objects.get(task=task).expires_at > timezone.now()  # the lease end rolled back too


def test_a_task_whose_checkpoint_does_not_verify_is_blocked(acme):
    tampered, fine = in_r1(acme), in_r1(acme)
    Checkpoint.objects.filter(task=tampered).update(body='{"schema_version": 2')
    report = failover.failover("r1", "r2")
    assert report.moved == [fine.id]
    [blocked] = report.blocked
    assert blocked.task_id == tampered.id and blocked.reason.startswith("checkpoint_")
    assert Task.objects.get(pk=tampered.pk).region == "r1"


def test_running_it_twice_moves_nothing_the_second_time(acme):
    tasks = [in_r1(acme) for _ in range(5)]
    first = failover.failover("r1", "r2", batch=2)  # three keyset batches
    assert sorted(first.moved) == sorted(t.id for t in tasks)
    second = failover.failover("r1", "r2", batch=2)
    assert (second.verified, second.moved, second.blocked) == (0, [], [])
    assert {Task.objects.get(pk=t.pk).ownership_epoch for t in tasks} == {2}


def test_ended_tasks_and_other_regions_tasks_are_left_alone(acme):
    ended, elsewhere = in_r1(acme), make_task(acme, region="r3")
    advance(ended.id, 1, State.QUARANTINED, actor=OPERATOR, trigger=Trigger.QUARANTINE)
    waiting = in_r1(acme)
    advance(
        waiting.id,
        1,
        State.WAITING_INPUT,
        actor=Actor.worker("w"),
        trigger=Trigger.REQUEST_INPUT,
        wait_deadline=timezone.now() + timedelta(hours=1),
    )
    done = in_r1(acme)
    advance(done.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger=Trigger.COMPLETE, outcome={})
    report = failover.failover("r1", "r2")
    # Quarantined and waiting tasks are unfinished: they move (in their state). Completed ones stay.
    assert sorted(report.moved) == sorted([ended.id, waiting.id])
    assert Task.objects.get(pk=done.pk).region == "r1"
    assert Task.objects.get(pk=elsewhere.pk).region == "r3"
    assert Task.objects.get(pk=waiting.pk).state == State.WAITING_INPUT


def test_the_moved_runnable_tasks_ring_in_their_new_region(acme, monkeypatch):
    runnable = in_r1(acme)
    waiting = in_r1(acme)
    advance(
        waiting.id,
        1,
        State.WAITING_INPUT,
        actor=Actor.worker("w"),
        trigger=Trigger.REQUEST_INPUT,
        wait_deadline=timezone.now() + timedelta(hours=1),
    )
    rung: list[tuple[str, str]] = []
    monkeypatch.setattr(doorbell, "ring", lambda task_id, region: rung.append((str(task_id), region)))
    failover.failover("r1", "r2")
    assert rung == [(str(runnable.id), "r2")]


def meanwhile(monkeypatch, write: Callable[[], object]) -> None:
    """Run ``write`` once, between the failover's read of a batch and its first move."""
    real, done = failover._in_doubt, []

    def then_write(task_ids):
        if not done:
            done.append(True)
            write()
        return real(task_ids)

    monkeypatch.setattr(failover, "_in_doubt", then_write)


def test_a_task_the_old_region_advanced_meanwhile_is_read_again_and_moved(acme, monkeypatch):
    task = in_r1(acme)
    held = claim(task)
    meanwhile(monkeypatch, lambda: step(task, held))  # the old region's worker commits a step first
    report = failover.failover("r1", "r2")
    assert (report.moved, report.skipped, report.blocked) == ([task.id], [], [])
    moved = Task.objects.get(pk=task.pk)
    assert (moved.state_version, moved.region, moved.ownership_epoch) == (3, "r2", 2)
    with pytest.raises(StaleVersion):  # a plain stale read by anyone else stays a stale version
        advance(task.id, 2, State.READY, actor=OPERATOR, trigger=Trigger.ESCALATE)


def test_a_task_that_ended_or_moved_elsewhere_meanwhile_is_skipped(acme, monkeypatch):
    ended, elsewhere = in_r1(acme), in_r1(acme)

    def end_one_move_the_other() -> None:
        advance(ended.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger=Trigger.COMPLETE, outcome={})
        failover.failover("r1", "r3")  # a second failover, to another region, wins the other

    meanwhile(monkeypatch, end_one_move_the_other)
    report = failover.failover("r1", "r2")
    assert (report.moved, sorted(report.skipped)) == ([], sorted([ended.id, elsewhere.id]))
    assert Task.objects.get(pk=elsewhere.pk).region == "r3"


def test_the_sweep_moves_only_its_own_regions_tasks(acme):
    mine, theirs = in_r1(acme), make_task(acme, region="r2")
    for task in (mine, theirs):
        advance(
            task.id,
            1,
            State.WAITING_RETRY,
            actor=Actor.worker("w"),
            trigger=Trigger.ATTEMPT_FAILED,
            wait_deadline=timezone.now() - timedelta(seconds=1),
        )
    report = sweep.sweep(lambda task_id, region: None, region="r1")
    assert report.waits_ended == 1
    assert Task.objects.get(pk=mine.pk).state == State.RESUME_VALIDATION
    assert Task.objects.get(pk=theirs.pk).state == State.WAITING_RETRY


def test_the_reconciler_looks_only_at_its_own_regions_tasks(acme, monkeypatch):
    mine, theirs = in_r1(acme), make_task(acme, region="r2")
    for task in (mine, theirs):
        advance(task.id, 1, State.OUTCOME_UNKNOWN, actor=Actor.worker("w"), trigger=Trigger.DISPATCH_UNKNOWN)
    asked: list = []
    monkeypatch.setattr(
        reconcile, "reconcile_task", lambda task_id, actor: asked.append(task_id) or SimpleNamespace(moved=0)
    )
    reconcile.reconcile_unknown(region="r1")
    assert asked == [mine.id]  # r2's task is r2's reconciler's, even while r1's runs on


# --- the command ---------------------------------------------------------------------------------------


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("failover", *args, stdout=out)
    return out.getvalue()


def test_the_command_moves_everything_and_prints_the_totals(acme):
    [in_r1(acme) for _ in range(2)]
    out = run_command("--from", "r1", "--to", "r2", "--reason", "drill")
    assert out.strip().splitlines()[-1] == (
        "failover r1 -> r2: 2 verified, 2 moved, 0 skipped (ended or moved elsewhere meanwhile), 0 blocked"
    )
    assert Task.objects.filter(region="r2", ownership_epoch=2).count() == 2


def test_the_command_lists_each_blocked_task_and_exits_1(acme):
    doubtful, fine = in_r1(acme), in_r1(acme)
    action = with_intent(doubtful, claim(doubtful))
    assert action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    out = StringIO()
    with pytest.raises(CommandError, match="1 task\\(s\\) of r1 were not moved") as failed:
        call_command("failover", "--from", "r1", "--to", "r2", stdout=out)
    assert failed.value.returncode == 1
    lines = out.getvalue().strip().splitlines()
    assert lines[0].startswith(f"BLOCKED {doubtful.id} [ready] action_in_doubt: action #{action.pk}")
    assert lines[-1].endswith("1 moved, 0 skipped (ended or moved elsewhere meanwhile), 1 blocked")
    assert Task.objects.get(pk=fine.pk).region == "r2"


def test_the_command_dry_run_moves_nothing_and_says_so(acme):
    task = in_r1(acme)
    out = run_command("--from", "r1", "--to", "r2", "--dry-run")
    assert out.strip() == "dry run r1 -> r2: 1 verified, would move, 0 blocked"
    assert Task.objects.get(pk=task.pk).region == "r1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--from", "r1", "--to", "r1"), "over to itself"),
        (("--from", "", "--to", "r2"), "from region must not be empty"),
        (("--from", "r1", "--to", "  "), "to region must not be empty"),
        (("--from", "r1", "--to", "x" * 40), "longer than 32"),
    ],
)
def test_the_command_refuses_bad_regions(acme, args, message):
    in_r1(acme)
    with pytest.raises(CommandError, match=message):
        run_command(*args)
    assert Task.objects.filter(region="r1", ownership_epoch=1).count() == 1
