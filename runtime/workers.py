"""Celery entry points: take ids, call one service. Business rules live elsewhere.

``tasks.run_task`` is the doorbell: it is acknowledged only after the run
(``acks_late``), and put back on the queue when the pool process running it
dies (``reject_on_worker_lost``), so losing a pool child loses no doorbell. A
redelivered or duplicate doorbell is harmless: the lease lets one worker run a
task, the others answer ``not_claimed``. The periodic tasks keep early acks: a
lost tick is replaced by the next one, and requeueing a tick that kills its
process would only repeat the kill.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery import Task, shared_task
from celery.worker.request import Request
from django.conf import settings
from django.db import DatabaseError

from runtime import alerts, bulk, heartbeats, pushes, reconcile, reconnect, rollups, runner, sweep
from tasks import doorbell, leases, liveness

log = logging.getLogger(__name__)


def worker_id(pid: int | None = None) -> str:
    return f"{socket.gethostname()}:{pid or os.getpid()}"


class DoorbellRequest(Request):
    """A doorbell as the worker's main process sees it: when its pool child dies, its lease goes too.

    The pool has reaped the child, so the lease it held is provably abandoned;
    freeing it now lets the requeued doorbell resume the task at once instead of
    after ``LEASE_TTL``. Only on the doorbell's first loss: one that kills its
    child again (a poison step) waits out the TTL each time, so it cannot
    crash-loop the pool.
    """

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # billiard wraps it
        if isinstance(exc, WorkerLostError) and self.worker_pid and not self.delivery_info.get("redelivered"):
            # The stubs type worker_pid as str; Celery stores the pool child's pid, an int.
            _release_for_lost_child(int(self.worker_pid), self.args[0])
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


def _release_for_lost_child(pid: int, task_id: str) -> None:
    try:
        leases.release_abandoned(worker_id(pid), task_id=task_id)
    except DatabaseError:
        log.warning("could not free the lease of a lost pool process; it lapses by itself", exc_info=True)
    finally:
        # The main process forks the replacement children: hand them no open connection.
        reconnect.drop_connections()


# celery-types' shared_task overloads accept extra Task attributes (here ``Request``) only together
# with ``base=``; Celery itself sets any keyword as an attribute of the task class. The annotation is
# what the overload without ``Request`` answers, so the doorbell stays typed.
_doorbell: Callable[[Callable[[str], str]], Task[[str], str]] = shared_task(  # type: ignore[call-overload]
    name="tasks.run_task", acks_late=True, reject_on_worker_lost=True, Request=DoorbellRequest
)


@_doorbell
def run_task(task_id: str) -> str:
    """Run the task the doorbell names; wait out a database restart, or a server that answers but
    refuses writes (read-only, shutting down: ``reconnect.classify``), instead of dropping it."""
    me, ttl = worker_id(), settings.LEASE_TTL_SECONDS
    while True:
        try:
            liveness.ensure()  # this pool process's lock: its leases are free at once if it dies
            return runner.run_task(
                task_id,
                worker_id=me,
                region=settings.WORKER_REGION,
                ttl=timedelta(seconds=ttl),
                heartbeats=heartbeats.shared(timedelta(seconds=ttl)),
            )
        except (*reconnect.CONNECTION_LOST, DatabaseError) as error:
            # Past a lease's TTL there is nothing left to give back and the sweep rings again:
            # stop holding this pool process and the doorbell.
            if not reconnect.recover(me, error, task_id=task_id, give_up_after=ttl):
                return "database_unavailable"


@shared_task(name="tasks.sweep")  # message names outlive module moves: kept
def sweep_task() -> dict[str, int]:
    return vars(sweep.sweep(doorbell.ring, region=settings.WORKER_REGION))  # this beat's region only


@shared_task(name="ledger.reconcile_unknown")
def reconcile_unknown() -> int:
    return reconcile.reconcile_unknown()


@shared_task(name="runtime.alerts_scan")
def alerts_scan() -> dict[str, int]:
    """Raise and clear alerts (``runtime.alerts.scan``); a lost tick is made up by the next one."""
    return alerts.scan().as_dict()


@shared_task(name="runtime.rollups_refresh")
def rollups_refresh() -> int | None:
    """Recount the tasks per tenant and state (``runtime.rollups``); a lost tick is made up by the next."""
    return rollups.refresh()


@shared_task(name="interop.push_deliver")
def push_deliver() -> int:
    """Send the A2A push notifications that are due (``runtime.pushes``); beat rings it every
    ``A2A_PUSH_INTERVAL`` seconds, and ticks that overlap share the work (each delivery is leased)."""
    return pushes.send_due()


@shared_task(name="runtime.bulk_run")
def bulk_run(operation_id: str) -> str:
    """Run a large bulk operation to its end (``run_worker`` would also pick it up). Returns its status."""
    return str(bulk.bulk_run(operation_id, runner=worker_id()).status)
