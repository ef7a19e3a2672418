"""The resume loop a worker runs for one task.

1. Claim the task's lease (or give up: someone else holds it).
2. Load the task and its checkpoint (an unreadable checkpoint quarantines it);
   on PostgreSQL the claim returned both, with the event vouching for the checkpoint.
3. Decide the next transition from the checkpoint (``runtime.engine``).
4. Commit it at the version it was decided from, fenced by the lease
   (``advance_read``: the row is not read again, the compare-and-set proves
   it unchanged); a stale version or a lost lease discards the decision. The
   next step resumes from what this commit wrote, without reading it back:
   nothing else can have written it, or the next commit's compare-and-set
   fails. A
   commit the database refuses for this task's data (``DataError``, an
   unexpected ``IntegrityError``) quarantines the task, like any step error;
   only a database in trouble (connection lost) reaches the worker's loop.
5. Repeat while the task stays runnable; release the lease (on PostgreSQL the
   commit that moves the task out of the runnable states releases it in its
   own statement, and closes the open cancel requests of an end there too).

Between steps the lease is checked: with ``heartbeats`` (``runtime.heartbeats``, the
worker loop's one thread that extends every in-flight lease) by looking at what its
last beat found, without a round trip; without it, by a heartbeat of its own. A
worker that is draining (``stopping()``) stops between steps and gives the lease back.

Telemetry: a run is one span, ``task.run``, opened at the first step (it needs the
checkpoint): it continues the trace of the request that made the task runnable, whose
W3C ``traceparent`` that request's transition wrote into the checkpoint (``trace_link``).
As a child when the run follows that transition closely (``CONTINUE_TRACE_WITHIN``); when
it does not (a task woken by the sweep after a backoff, a region without workers for
days), under whatever trace is current (none in the worker loop: a new one; under Celery,
the doorbell's) with a span link to it: a parent that ended days ago would stretch one
trace over days, which trace stores and tail samplers treat as lost pieces. Every line
logged meanwhile carries the task, the worker, the version and the tenant (bound with
``structlog.contextvars``, per thread) and the run's trace id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from datetime import timedelta
from typing import TYPE_CHECKING
from uuid import UUID

import structlog
from django.db import DatabaseError, DataError, IntegrityError
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from audit.redaction import redact
from runtime import chaos, engine, llm
from runtime.llm import Model, default_model
from tasks import cancellation, checkpoints, decisions, leases, services, values
from tasks.exceptions import StaleVersion, TransitionError
from tasks.models import CancelScope, Task
from tasks.states import RUNNABLE, State, Trigger
from tasks.transitions import Actor, advance, span_attributes

if TYPE_CHECKING:
    from runtime.heartbeats import Heartbeats

log = logging.getLogger(__name__)
MAX_STEPS = 50  # bounded work per claim; the sweep hands the task out again
# A task with nothing to decide yet (a cancel waiting for an effect that may still
# land) is left alone this long rather than claimed again at once, in a tight loop.
DEFERRED_HOLD = timedelta(seconds=2)
# A run this soon after the transition that made its task runnable is part of that transition's trace.
CONTINUE_TRACE_WITHIN = timedelta(minutes=10)
tracer = trace.get_tracer(__name__)


class _RunTrace:
    """The run's span and log context, opened at its first step and closed with ``scope``."""

    def __init__(self, scope: ExitStack, worker_id: str) -> None:
        self.scope, self.worker_id = scope, worker_id
        self.span: trace.Span | None = None

    def step(self, task: Task, checkpoint: checkpoints.Checkpoint) -> None:
        if self.span is None:
            self.span = self.scope.enter_context(self._open(task, checkpoint))
            self.scope.callback(structlog.contextvars.unbind_contextvars, "state_version", "tenant")
        structlog.contextvars.bind_contextvars(state_version=task.state_version, tenant=task.tenant_id)

    def _open(self, task: Task, checkpoint: checkpoints.Checkpoint) -> AbstractContextManager[trace.Span]:
        attributes = {**span_attributes(task), "durable.worker.id": self.worker_id}
        origin = _origin(checkpoint.trace_link)
        if origin is None:
            return tracer.start_as_current_span("task.run", attributes=attributes)
        follows = checkpoint.state_version == task.state_version and (
            timezone.now() - task.updated_at <= CONTINUE_TRACE_WITHIN
        )
        if follows:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(origin))
            return tracer.start_as_current_span("task.run", context=parent, attributes=attributes)
        return tracer.start_as_current_span("task.run", links=[trace.Link(origin)], attributes=attributes)

    def finish(self, outcome: str) -> None:
        if self.span is not None and self.span.is_recording():
            self.span.set_attribute("durable.run.outcome", outcome)


def _origin(traceparent: str) -> trace.SpanContext | None:
    """The span a W3C ``traceparent`` names, or None for a blank or malformed one."""
    if not traceparent:
        return None
    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def run_task(
    task_id: UUID | str,
    *,
    worker_id: str,
    region: str,
    model: Model | None = None,
    ttl: timedelta = leases.DEFAULT_TTL,
    held: leases.Held | None = None,
    heartbeats: Heartbeats | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> str:
    """Run a task's steps until it waits or ends; return what stopped the loop."""
    with ExitStack() as scope:
        scope.enter_context(
            structlog.contextvars.bound_contextvars(task_id=str(task_id), worker_id=worker_id)
        )
        traced = _RunTrace(scope, worker_id)
        outcome = _run_task(
            task_id, worker_id=worker_id, region=region, model=model, ttl=ttl, held=held,
            heartbeats=heartbeats, stopping=stopping, traced=traced,
        )  # fmt: skip
        traced.finish(outcome)
        return outcome


def _run_task(
    task_id: UUID | str,
    *,
    worker_id: str,
    region: str,
    model: Model | None = None,
    ttl: timedelta = leases.DEFAULT_TTL,
    held: leases.Held | None = None,
    heartbeats: Heartbeats | None = None,
    stopping: Callable[[], bool] = lambda: False,
    traced: _RunTrace,
) -> str:
    lease = held or leases.claim(task_id, worker_id=worker_id, region=region, ttl=ttl)
    if lease is None:
        return "not_claimed"
    actor = Actor.worker(worker_id)
    model = model or default_model()
    hold: timedelta | None = None
    # Set by the heartbeat when a cancel request for this task is open; without a heartbeat thread the
    # requests are read before every step instead.
    signal = heartbeats.hold(lease) if heartbeats is not None else None
    signaled = llm.cancel_signal.set(signal.interrupt if signal is not None else None)
    point: services.ResumePoint | None = None
    # The task's row as the one-statement claim read it, under its row lock, and its newest checkpoint
    # with the event vouching for it: the first step need not read them again (a change since fails
    # that step's compare-and-set, as any change during a step does).
    claimed, stored = lease.task, lease.stored
    released = False
    try:
        for _ in range(MAX_STEPS):
            if stopping():
                return "draining"
            # Before any work: the lease may have lapsed (a paused process) or been taken over.
            if heartbeats is not None:
                if heartbeats.lost(lease):
                    return "lease_lost"
            elif not leases.heartbeat(lease, ttl=ttl):
                return "lease_lost"
            if point is None:
                point = services.task_resume_point(
                    task_id, actor=actor, lease=lease, task=claimed, stored=stored
                )
                claimed = stored = None  # read afresh whenever the point is dropped again
            if point.newer:
                # A newer deployment wrote it (logged, counted): untouched, and the lease given back at
                # once for that deployment's workers. The claim's schema filter keeps ours off it.
                return "checkpoint_newer"
            task, checkpoint = point.task, point.checkpoint
            if checkpoint is None or task.state not in RUNNABLE:  # None: quarantined instead
                return task.state
            cancels = {}
            if signal is None or signal.asked.is_set():
                if signal is not None:
                    signal.clear()  # before reading: a beat that sets it meanwhile is not lost
                cancels = cancellation.pending(task_id)
                if signal is not None and cancels:
                    signal.asked.set()  # still open: read again before the next step
                    if cancels.keys() & cancellation.INTERRUPTING:
                        signal.interrupt.set()
                asked = cancels.get(CancelScope.TASK)
                if (
                    asked
                    and task.state != State.CANCEL_REQUESTED
                    and asked.requested_version >= task.state_version
                ):
                    point = None  # asked at this version or later: decide from the cancel_requested one
                    continue
            traced.step(task, checkpoint)
            try:
                decision = engine.decide(
                    task, checkpoint, model=model, now=timezone.now(), lease=lease, cancels=cancels
                )
            except llm.TurnCanceled:
                point = None  # read the task and its requests again: the request decides what comes next
                continue
            if decision is None:
                hold = DEFERRED_HOLD
                return "deferred"  # e.g. a cancel waiting on a system that cannot answer yet
            # A move out of the runnable states ends this run: its commit gives the lease up too.
            stops = decision.to_state not in RUNNABLE
            if stops and heartbeats is not None:
                heartbeats.drop(lease)  # before, not after: a beat finding it released would count it lost
            done = decisions.commit_read(task, decision, actor=actor, lease=lease, release=stops)
            released = done.released
            chaos.after_commit(done.task, decision.progress.step if decision.progress else None)
            if stops:
                return done.task.state
            written = done.checkpoint
            if written is not None:  # decoded as a load would, without the round trip
                checkpoint = checkpoints.decode(written.body, written.schema_version)
            point = services.ResumePoint(done.task, checkpoint)
        return "step_budget_spent"
    except StaleVersion as exc:  # includes LeaseLost: another writer won; our decision is void
        log.info("discarded a stale decision", extra={"task_id": str(task_id), "why": str(exc)})
        return exc.code
    except (DataError, IntegrityError) as exc:
        # About this task's data (a value no column can hold, a constraint it breaks), not the
        # database: retrying cannot help, and re-raising would crash-loop every worker on it.
        # advance's own expected duplicates (a repeated delivery) are handled by its callers.
        log.exception("commit refused for this task's data; quarantining", extra={"task_id": str(task_id)})
        _quarantine_after_error(task_id, actor, lease, exc)
        return "step_error"
    except DatabaseError:
        raise  # the database itself is in trouble: let the worker's loop (or Celery) try again later
    except Exception as exc:  # a bug or a misconfiguration in a step: hold the task for an operator
        log.exception("step failed; quarantining", extra={"task_id": str(task_id)})
        _quarantine_after_error(task_id, actor, lease, exc)
        return "step_error"
    finally:
        llm.cancel_signal.reset(signaled)
        if heartbeats is not None:
            heartbeats.drop(lease)
        if not released:  # else the last commit gave it up in its own statement
            leases.release(lease, hold=hold)


def _quarantine_after_error(task_id: UUID | str, actor: Actor, lease: leases.Held, exc: Exception) -> None:
    """Never crash-loop on a task, never skip it silently: quarantine it with what went wrong.

    The reason quotes the error, which may quote the very data that broke the
    commit (a psycopg encoding error names the lone surrogate): it is made
    storable first, and no checkpoint is written, so this commit cannot fail the same way.
    """
    current = Task.objects.filter(pk=task_id).values_list("state_version", flat=True).first()
    if current is None:
        return
    try:
        advance(
            task_id,
            current,
            State.QUARANTINED,
            actor=actor,
            trigger=Trigger.QUARANTINE,
            # Redacted before it is cut short: a secret cut in half would no longer be recognised.
            reason=values.printable(redact(f"{type(exc).__name__}: {_cause(exc)}"), 1000),
            reason_code="step_error",
            lease=lease,
        )
    except TransitionError:
        pass  # moved on meanwhile (or already quarantined): nothing more to do here
    except (DataError, IntegrityError):
        # Should not happen (the reason is clean, nothing else is written). If it does, the
        # task stays where it was and this worker goes on with the others instead of dying.
        log.exception("could not quarantine the task", extra={"task_id": str(task_id)})


def _cause(exc: Exception) -> str:
    """What went wrong, without the SQL: a database error's message and DETAIL line, not its
    LINE/CONTEXT lines, which echo the statement's parameters (facts, outcomes) into the audit log."""
    if not isinstance(exc, DatabaseError):
        return str(exc)
    lines = str(exc).splitlines() or [""]
    return "; ".join([lines[0], *(line for line in lines[1:] if line.startswith("DETAIL:"))])


def run_available(
    *,
    worker_id: str,
    region: str,
    limit: int = 10,
    model: Model | None = None,
    ttl: timedelta = leases.DEFAULT_TTL,
) -> int:
    """Claim up to ``limit`` eligible tasks of ``region`` and run each; return how many ran."""
    claimed = leases.claim_next(worker_id=worker_id, region=region, limit=limit, ttl=ttl)
    for index, lease in enumerate(claimed):
        try:
            run_task(lease.task_id, worker_id=worker_id, region=region, model=model, ttl=ttl, held=lease)
        except Exception:
            for unrun in claimed[index + 1 :]:
                leases.release(unrun)  # hand the rest back now rather than after their TTL
            raise
    return len(claimed)
