"""Counters and histograms recorded where things happen: one call per event, no logic at the call site.

Instruments come from the OpenTelemetry metrics API. Until a process sets a
meter provider (``config.metrics.configure``, from ``config.otel.configure``)
they are the API's no-op proxies, so the kernel records unconditionally and
pays next to nothing when metrics are off. Once set, each value lives in the
memory of the process that recorded it: a worker's counters are served by that
worker only (``run_worker --metrics-port``), never by the web process's
``/metrics`` (docs/operating/metrics-alerts.md).

Every instrument is named ``durable_*`` and listed in
docs/operating/metrics-alerts.md; labels are bounded sets (states, triggers, reason codes, connector and
worker names), never task ids. Nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from functools import wraps
from typing import Any, ParamSpec, Protocol, TypeVar

from opentelemetry import metrics

P = ParamSpec("P")

# Seconds: from a blink (a cancel confirmed at once) to days (an approval over a weekend).
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 259200.0, 604800.0)

_meter = metrics.get_meter("durable")


def _counter(name: str, description: str) -> metrics.Counter:
    return _meter.create_counter(name, unit="", description=description)


def _seconds(name: str, description: str) -> metrics.Histogram:
    return _meter.create_histogram(
        name, unit="s", description=description, explicit_bucket_boundaries_advisory=LATENCY_BUCKETS
    )


TRANSITIONS = _counter("durable_task_transitions", "Committed task transitions, by trigger and task type")
VALIDATIONS = _counter("durable_resume_validations", "Resume validation verdicts, by verdict and reason code")
DUPLICATES = _counter(
    "durable_duplicates_suppressed", "Sends the outside system recognised as a repeat of an earlier one"
)
RECONCILIATIONS = _counter("durable_reconciliations", "Lookups of effects in doubt, by what they found")
UNKNOWN_DURATION = _seconds(
    "durable_unknown_outcome_duration_seconds",
    "From an effect's outcome becoming unknown to the lookup settling it",
)
CHECKPOINT_MIGRATIONS = _counter(
    "durable_checkpoint_migrations", "Checkpoint migration steps run on read, by the schema migrated from"
)
CHECKPOINT_FAILURES = _counter(
    "durable_checkpoint_read_failures", "Resumes refused because the checkpoint could not be read, by reason"
)
CANCEL_LATENCY = _seconds(
    "durable_cancellation_latency_seconds", "From a cancel request to the task canceled"
)
LEASE_EXPIRIES = _counter(
    "durable_lease_expiries",
    "Leases found lapsed when a task was claimed: TTL ran out or holder process gone",
)
LEASE_TAKEOVERS = _counter("durable_lease_takeovers", "Tasks claimed from another worker whose lease lapsed")
APPROVAL_LATENCY = _seconds(
    "durable_approval_decision_latency_seconds", "From an approval request to its decision, by decision"
)
APPROVALS_EXPIRED = _counter("durable_approvals_expired", "Approval requests that expired undecided")
HEARTBEATS = _counter("durable_worker_heartbeats", "Lease heartbeats a worker process sent, by worker id")
LEASES_LOST = _counter("durable_leases_lost", "Leases a worker's heartbeat found lost, by worker id")
DATABASE_ERRORS = _counter(
    "durable_worker_database_errors",
    "Database errors a worker rode out (reconnected, backed off), by reason (SQLSTATE class) and where",
)
CLOCK_SKEW = _meter.create_gauge(
    "durable_worker_clock_skew_seconds",
    unit="s",
    description="This worker's clock minus the database's, measured at start and on every heartbeat",
)
MODEL_TOKENS = _counter(
    "durable_model_tokens",
    "Tokens model turns used, by the model that answered and direction (input, output)",
)
MODEL_COST = _counter(
    "durable_model_cost", "What model turns cost at MODEL_PRICES, by the model that answered"
)
CLAIMS_REFUSED = _counter(
    "durable_claims_refused", "Claims a worker refused to make, by worker id and reason (clock_skew)"
)


def transitioned(trigger: str, task_type: str, *, left: datetime | None = None, at: datetime) -> None:
    """A committed transition. ``left``: when the task entered the state it just left (for a
    confirmed cancel, the cancel request: the latency from request to canceled)."""
    TRANSITIONS.add(1, {"trigger": str(trigger), "task_type": task_type})
    if trigger == "cancel_confirmed" and left is not None:
        CANCEL_LATENCY.record(_since(left, at))


class _Verdict(Protocol):
    @property
    def trigger(self) -> Any: ...
    @property
    def reason_code(self) -> str: ...


V = TypeVar("V", bound=_Verdict)


def records_verdict(validate: Callable[P, V]) -> Callable[P, V]:
    """Decorates resume validation: counts each verdict it returns (its trigger and reason code)."""

    @wraps(validate)
    def counted(*args: P.args, **kwargs: P.kwargs) -> V:
        decision = validate(*args, **kwargs)
        VALIDATIONS.add(1, {"verdict": str(decision.trigger), "reason": decision.reason_code})
        return decision

    return counted


def duplicates_suppressed(connector: str, count: int) -> None:
    if count:
        DUPLICATES.add(count, {"connector": connector})


def reconciled(result: str, *, unknown_since: datetime | None = None, at: datetime | None = None) -> None:
    """One lookup's result: a settling dispatch state, ``not_yet`` (not found, may still land) or
    ``no_answer`` (the system did not answer). A settling one also records how long it was in doubt."""
    RECONCILIATIONS.add(1, {"result": str(result)})
    if unknown_since is not None and at is not None:
        UNKNOWN_DURATION.record(_since(unknown_since, at), {"result": str(result)})


def checkpoint_migrated(from_schema: int) -> None:
    CHECKPOINT_MIGRATIONS.add(1, {"from_schema": str(from_schema)})


def checkpoint_unreadable(reason: str) -> None:
    CHECKPOINT_FAILURES.add(1, {"reason": reason})


class _Lapsed(Protocol):
    worker_id: str
    heartbeat_at: datetime
    expires_at: datetime


def leases_taken(taken: Iterable[_Lapsed], worker_id: str, now: datetime) -> None:
    """After a claim committed: of the leases it moved on, those that lapsed (not given up, which
    leaves ``heartbeat_at == expires_at``), and those taken from another worker."""
    for lease in taken:
        if lease.heartbeat_at >= lease.expires_at:
            continue  # released on purpose: neither an expiry nor a takeover
        LEASE_EXPIRIES.add(1, {"cause": "ttl" if lease.expires_at <= now else "holder_gone"})
        if lease.worker_id != worker_id:
            LEASE_TAKEOVERS.add(1)


def approval_decided(decision: str, requested_at: datetime, decided_at: datetime) -> None:
    APPROVAL_LATENCY.record(_since(requested_at, decided_at), {"decision": str(decision)})


def approvals_expired(count: int) -> None:
    if count:
        APPROVALS_EXPIRED.add(count)


class _Held(Protocol):
    @property
    def task_id(self) -> Any: ...
    @property
    def worker_id(self) -> str: ...


def heartbeat(held: Iterable[_Held], lost: Collection[Any]) -> None:
    """One beat of a worker process's heartbeat thread: one count per worker id among the leases it
    extends, and each lease it found lost (``lost``: their task ids) under its worker id."""
    workers: set[str] = set()
    for lease in held:
        workers.add(lease.worker_id)
        if lease.task_id in lost:
            LEASES_LOST.add(1, {"worker": lease.worker_id})
    for worker in workers:
        HEARTBEATS.add(1, {"worker": worker})


def database_error(reason: str, where: str) -> None:
    """A database error a worker met and rode out (``runtime.reconnect``), by what it means and where."""
    DATABASE_ERRORS.add(1, {"reason": reason, "where": where})


def clock_skew(seconds: float) -> None:
    CLOCK_SKEW.set(seconds)


def claim_refused(worker_id: str, reason: str) -> None:
    CLAIMS_REFUSED.add(1, {"worker": worker_id, "reason": reason})


def model_used(
    model_id: str, input_tokens: int | None, output_tokens: int | None, cost: Decimal | None
) -> None:
    """One model turn's recorded usage, after it committed: its tokens, and its cost when priced."""
    for direction, tokens in (("input", input_tokens), ("output", output_tokens)):
        if tokens:
            MODEL_TOKENS.add(tokens, {"model": model_id, "direction": direction})
    if cost is not None:
        MODEL_COST.add(float(cost), {"model": model_id})


def _since(start: datetime, end: datetime) -> float:
    return max((end - start) / timedelta(seconds=1), 0.0)
