"""Two deployments at once on one database: an older checkout (checkpoint schema 2) and this one (3).

A rollout replaces workers one by one, so for a while both versions run against the same
PostgreSQL. The older checkout is this working tree with its one contract line changed
(``Checkpoint = CheckpointV3`` -> ``CheckpointV2``), run from a copy in a temporary directory by
real ``manage.py run_worker`` processes (and ``manage.py shell`` to create tasks, as the old API
would). What must hold, with model turns slow enough that the two overlap:

- no worker crashes, no task is quarantined, every task completes;
- an old worker never claims a task whose newest checkpoint is at schema 3, so no transition by an
  old worker follows a schema-3 checkpoint (audit events' actor ids vs each process's pid), and
  it never even meets one (it would log that it left the task to a newer deployment);
- each deployment writes its own schema (and says so in the body's ``deployment``);
- a task the old code started and a new worker resumed records ``checkpoint_migrated`` first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.models import TransitionEvent
from demo.sandbox.models import Fault
from tasks.models import Checkpoint, Lease, Task
from tasks.states import State, Trigger
from tests.conftest import make_task
from tests.upgrades import checkouts
from tests.workflow import ROOT, WorkerProcess, database_url, put_order, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

CONTRACT_LINE = "\nCheckpoint = CheckpointV3  # the current contract\n"
OLDER_CONTRACT_LINE = "\nCheckpoint = CheckpointV2  # the current contract\n"
OLD, NEW = "rollout-old", "rollout-new"  # DEPLOYMENT_ID of each
SLOW_MODEL = {"MODEL_LATENCY_MS": "1000", "LOG_LEVEL": "WARNING"}


def older_checkout(into: Path) -> Path:
    """This tree as the previous release: a copy whose contract is ``CheckpointV2``."""
    return checkouts.older_checkout(into, "tasks/checkpoints.py", CONTRACT_LINE, OLDER_CONTRACT_LINE)


def old_code_creates(tree: Path, orders: list[str]) -> None:
    """Tasks created by the older deployment (its own process, its own code)."""
    script = (
        "from tasks import checkpoints\n"
        "from tasks.services import task_create\n"
        "from tasks.transitions import Actor\n"
        "from tenancy.models import Tenant\n"
        "assert checkpoints.CURRENT_SCHEMA == 2, checkpoints.CURRENT_SCHEMA\n"
        "tenant = Tenant.objects.get(slug='acme')\n"
        f"for order in {orders!r}:\n"
        "    task_create(tenant=tenant, task_type='order_lookup', objective='Look up ' + order,\n"
        f"                input={{'order_id': order}}, actor=Actor.system({OLD!r}))\n"
    )
    env = {**os.environ, "DATABASE_URL": database_url(), "DEPLOYMENT_ID": OLD, "LOG_LEVEL": "WARNING"}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def start(workers, monkeypatch, tree: Path, deployment: str, concurrency: int) -> WorkerProcess:
    with checkouts.started_from(tree, monkeypatch):
        return workers(
            lease_ttl=3,
            extra_env={**SLOW_MODEL, "DEPLOYMENT_ID": deployment},
            args=("--concurrency", str(concurrency)),
        )


def by(worker: WorkerProcess) -> str:
    """The end of the actor id of every transition this worker process makes (``worker:host:pid``)."""
    return f":{worker.process.pid}"


def all_completed(ids: list) -> bool:
    return Task.objects.filter(pk__in=ids, state=State.COMPLETED).count() == len(ids)


def test_old_and_new_deployments_run_side_by_side(acme, workers, monkeypatch, settings, tmp_path):
    settings.DEPLOYMENT_ID = NEW  # this process is the new code: what it creates is the new deployment's
    tree = older_checkout(tmp_path)
    old_orders = [f"OLD-{n}" for n in range(14)]
    new_orders = [f"NEW-{n}" for n in range(6)]
    for order in old_orders + new_orders:
        put_order(order)
    # The first two reads fail: those tasks wait out a backoff, and resume from resume_validation.
    Fault.objects.create(system="orders", operation="read", kind="error", remaining=2)

    old_code_creates(tree, old_orders[:10])
    first = list(Task.objects.values_list("id", "checkpoint_schema"))
    assert len(first) == 10 and {schema for _, schema in first} == {2}
    assert set(Checkpoint.objects.values_list("schema_version", flat=True)) == {2}

    old = start(workers, monkeypatch, tree, OLD, concurrency=1)
    wait_for(
        lambda: (
            TransitionEvent.objects.filter(actor_id__endswith=by(old)).exists()
            or old.process.poll() is not None
        ),
        timeout=60,
        what="the old deployment's worker to run a task",
    )
    assert old.process.poll() is None, old.process.stdout.read()
    made_new = [
        make_task(acme, task_type="order_lookup", objective=order, input={"order_id": order})
        for order in new_orders
    ]
    new = start(workers, monkeypatch, ROOT, NEW, concurrency=4)
    old_code_creates(tree, old_orders[10:])  # while both run

    created_by_old = list(Task.objects.filter(input__order_id__in=old_orders).values_list("id", flat=True))
    everything = created_by_old + [task.id for task in made_new]
    assert len(everything) == 20
    wait_for(lambda: all_completed(everything), timeout=120, what="every task to complete")
    for worker in (old, new):
        worker.stop()

    # No crash, and the old worker never so much as met a checkpoint it cannot read.
    outputs = {name: worker.process.stdout.read() for name, worker in (("old", old), ("new", new))}
    for name, worker in (("old", old), ("new", new)):
        assert worker.process.returncode == 0, f"{name} worker exited {worker.process.returncode}"
        assert "Traceback" not in outputs[name] and "quarantin" not in outputs[name], outputs[name]
    assert "newer deployment" not in outputs["old"], outputs["old"]
    assert not Task.objects.filter(state=State.QUARANTINED).exists()
    assert (
        not Lease.objects.filter(task_id__in=everything, worker_id__endswith=by(old))
        .exclude(task_id__in=created_by_old)
        .exists()
    )

    migrated_by_new = old_runs = 0
    for task_id in everything:
        schema_at = {}
        for row in Checkpoint.objects.filter(task_id=task_id):
            body = json.loads(row.body)
            assert body["schema_version"] == row.schema_version
            # Each deployment writes its own schema, and signs it.
            assert body["deployment"] == {2: OLD, 3: NEW}[row.schema_version], (task_id, row.state_version)
            schema_at[row.state_version] = row.schema_version
        newest = None
        for event in TransitionEvent.objects.filter(task_id=task_id).order_by("state_version"):
            if event.actor_id.endswith(by(old)):
                assert newest != 3, f"an old worker moved {task_id} on from a schema-3 checkpoint: {event}"
                old_runs += 1
            elif event.actor_id.endswith(by(new)) and newest == 2:
                # A new worker resuming what the old code wrote: the migration is the event.
                assert event.reason_code == "checkpoint_migrated", (task_id, event.state_version)
                assert "checkpoint schema 2 migrated to 3" in event.reason
                migrated_by_new += 1
            if event.reason_code == "checkpoint_migrated":
                assert event.actor_id.endswith(by(new)) and newest == 2
                if event.from_state == State.READY:
                    assert event.trigger == Trigger.DEPLOYMENT_CHANGED
            newest = schema_at.get(event.state_version, newest)
        assert newest is not None
    # Both deployments did work, and the new one resumed tasks the old one started.
    assert old_runs > 0 and migrated_by_new > 0, (old_runs, migrated_by_new)
