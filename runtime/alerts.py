"""Alerts: every task with no valid next event coming becomes one open ``Alert``, raised once.

A periodic scan (``scan``: Celery beat's ``runtime.alerts_scan``, or ``run_worker --sweep``,
every ``ALERT_SCAN_INTERVAL`` seconds) runs one classifier per kind of alert. Each
classifier is a condition on the task row (the first three are the clauses of
the queue's "stuck" filter, ``tasks.selectors.stuck_condition``: one source of
truth) and the words of its cause. Per kind the scan

1. clears the open alerts whose task no longer meets the condition, or moved on
   since the alert was raised: any transition after the alert's
   ``state_version`` except an escalation (a self-loop that hands the task to
   someone, not progress: the reconciler escalates an overdue unknown outcome
   at the very age that raises its alert, and re-raising it would bury the
   acknowledgement under a duplicate). A failing A2A push receiver is trouble
   outside the task: only its condition clears it, not the task's progress;
2. raises an alert for every task meeting the condition that has no open alert
   of that kind: one ``INSERT … SELECT … ON CONFLICT DO NOTHING``, so the work
   is set-based at any table size; the partial unique constraint
   ``alert_one_open_per_kind`` leaves out a task with an open one, and makes
   two scans racing insert once.

Clearing comes first, so a task that moved and is stuck again gets a fresh
alert at its new version in the same scan. A wait before its deadline — a
three-day approval wait included — is a task someone owns, never an alert.

People acknowledge an alert (with a note) or snooze it until a time: operators
and admins of its tenant; auditors read. Each is an append-only ``AlertNote``;
the alert itself keeps the first acknowledgement and the current snooze.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    Expression,
    F,
    OuterRef,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Concat
from django.http import Http404
from django.utils import timezone

from audit.models import TransitionEvent
from interop.models import PushDelivery
from ledger import integrity
from ledger.models import OrphanEffect, OrphanStatus
from runtime.models import Alert, AlertKind, AlertNote
from tasks import registry, selectors
from tasks.models import Task
from tasks.states import State, Trigger
from tenancy.models import Role
from tenancy.selectors import has_role, tenant_ids_for

log = logging.getLogger(__name__)

# Who reads alerts (list, page, badge) and who acknowledges and snoozes them.
READ_ROLES = (Role.OPERATOR, Role.ADMIN, Role.AUDITOR)
HANDLE_ROLES = (Role.OPERATOR, Role.ADMIN)
BADGE_CAP = 99  # the navigation badge counts up to here ("99+"), like the approvals badge
MAX_SNOOZE = timedelta(days=30)  # a longer silence is a decision to take elsewhere (fix or cancel the task)
NOTE_MAX = 2000
# A scan that raised or cleared more alerts than this analyzes the alerts table at once: until
# autovacuum's ANALYZE came by, the page's plans used the statistics of the small table it was
# before (820 ms a page at 1M tasks right after the first scan, 50 ms after).
ANALYZE_AFTER = 1000


# --- the classifiers: one per kind ------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Which tasks an alert kind covers at a moment, and the words of its cause (SQL, per task row)."""

    condition: Q
    cause: Expression
    # Whether the task's next transition clears it: the task's own trouble, which progress ends. Not for
    # trouble outside the task (a push receiver), which the task's progress says nothing about.
    progress_clears: bool = True


def _words(*parts: str | F) -> Expression:
    """Text and columns joined in SQL (each task's own state, region, reason in its cause)."""
    if len(parts) == 1 and isinstance(parts[0], str):
        return Value(parts[0], output_field=TextField())
    expressions = [Value(part, output_field=TextField()) if isinstance(part, str) else part for part in parts]
    return Concat(*expressions, output_field=TextField())


def no_live_lease(now: datetime) -> Rule:
    """Runnable (``ready``, ``resume_validation``, ``cancel_requested``) for over ``STUCK_AFTER``
    seconds with no lease heartbeat in that time: no worker of its region is taking it — workers
    down, none serving the region, or the doorbell and the sweep both silent."""
    return Rule(
        selectors.unattended_condition(now),
        _words(
            F("state"),
            f" and no worker has held its lease for over {settings.STUCK_AFTER:g} s: "
            "are workers for region “",
            F("region"),
            "” running?",
        ),
    )


def wait_past_deadline(now: datetime) -> Rule:
    """A wait whose ``wait_deadline`` passed over ``STUCK_AFTER`` seconds ago and is still open: the
    sweep ends every wait at its deadline, so it is not running. A wait before its deadline (a
    three-day approval wait) is not an alert."""
    return Rule(
        selectors.overdue_wait_condition(now),
        _words(
            F("state"),
            f" past its wait deadline by over {settings.STUCK_AFTER:g} s and nothing ended the wait: "
            "is the sweep (celery beat) running?",
        ),
    )


def unknown_outcome_overdue(now: datetime) -> Rule:
    """``outcome_unknown`` for over ``UNKNOWN_OUTCOME_ESCALATE_AFTER`` seconds: the reconciler has
    not settled the effect in doubt (the system does not answer its lookup, or it is not running)."""
    return Rule(
        selectors.unknown_overdue_condition(now),
        _words(
            f"outcome unknown for over {settings.UNKNOWN_OUTCOME_ESCALATE_AFTER:g} s and the reconciler "
            "has not settled it: reconcile now, or check the system by hand",
        ),
    )


def quarantine_overdue(now: datetime) -> Rule:
    """``quarantined`` for over ``ALERT_QUARANTINE_AFTER`` seconds: nothing releases a quarantined
    task by itself (but an older deployment's misjudged key, which ``runtime.rollout`` lifts at once),
    and nobody has released or canceled this one."""
    return Rule(
        Q(
            state=State.QUARANTINED,
            state_entered_at__lt=now - timedelta(seconds=settings.ALERT_QUARANTINE_AFTER),
        ),
        _words(
            f"quarantined for over {settings.ALERT_QUARANTINE_AFTER:g} s (",
            F("state_reason"),
            "): release it or cancel it",
        ),
    )


def cancel_unconfirmed(now: datetime) -> Rule:
    """``cancel_requested`` for over ``ALERT_CANCEL_AFTER`` seconds: no worker has settled the
    in-flight effects and confirmed the cancellation (an effect in doubt, or no worker at all)."""
    return Rule(
        Q(
            state=State.CANCEL_REQUESTED,
            state_entered_at__lt=now - timedelta(seconds=settings.ALERT_CANCEL_AFTER),
        ),
        _words(
            f"cancel requested over {settings.ALERT_CANCEL_AFTER:g} s ago and not confirmed: "
            "check its side effects in doubt and its region's workers"
        ),
    )


# runtime.sdk.snapshots.TAMPERED, spelt out: the adapter imports this module, not the other way round.
SNAPSHOT_TAMPERED = "agent_snapshot_tampered"


def effect_digest_mismatch(now: datetime) -> Rule:
    """``quarantined`` because an effect about to be sent, or an approval's copy of it, was not what
    was committed (``ledger.integrity``), because an SDK agent's call about to be sent is not what
    its evidence vouches for (``registry.ARGUMENT_UNBOUND``, ``runtime.dispatch``), or because an
    SDK agent's stored run state fails its MAC (``runtime.sdk.snapshots``): nothing was sent, and
    someone with database access changed a row (or a path around the step's own checks was taken).
    Raised by the worker in the very commit that holds the task (``raise_for``); the scan raises any
    it missed and clears it once the task moves on."""
    after = "nothing was sent; read the task's history and who had database access before anything else"
    return Rule(
        Q(
            state=State.QUARANTINED,
            state_reason__in=(integrity.EFFECT_DIGEST_MISMATCH, SNAPSHOT_TAMPERED, registry.ARGUMENT_UNBOUND),
        ),
        Case(
            When(
                state_reason=SNAPSHOT_TAMPERED,
                then=_words(f"an agent's stored run state was changed in the database: {after}"),
            ),
            When(
                state_reason=registry.ARGUMENT_UNBOUND,
                then=_words(
                    "an agent's call was about to be sent with arguments its evidence does not vouch for: "
                    + after
                ),
            ),
            default=_words(
                "an effect was about to be sent that is not the one intended (changed in the database): "
                + after
            ),
            output_field=TextField(),
        ),
    )


def push_receiver_failing(now: datetime) -> Rule:
    """A live A2A push config of the task gave a status change up (``A2A_PUSH_MAX_ATTEMPTS`` failed
    attempts, or its URL refused at send time: ``interop.push``) and has delivered no later one: the
    caller's receiver is down or refusing. Cleared when it takes a later change or the config is deleted."""
    recovered = PushDelivery.objects.filter(
        config_id=OuterRef("config_id"),
        status=PushDelivery.Status.DELIVERED,
        state_version__gt=OuterRef("state_version"),
    )
    failing = PushDelivery.objects.filter(
        task_id=OuterRef("pk"), status=PushDelivery.Status.FAILED, config__deleted_at__isnull=True
    ).filter(~Exists(recovered))
    return Rule(
        Q(Exists(failing)),
        _words(
            "an A2A push receiver of this task keeps failing: a status change was given up after "
            f"{settings.A2A_PUSH_MAX_ATTEMPTS} attempts (see the task page's push deliveries); "
            "its caller is not hearing of the task"
        ),
        progress_clears=False,
    )


CLASSIFIERS: dict[AlertKind, Callable[[datetime], Rule]] = {
    AlertKind.NO_LIVE_LEASE: no_live_lease,
    AlertKind.WAIT_PAST_DEADLINE: wait_past_deadline,
    AlertKind.UNKNOWN_OUTCOME_OVERDUE: unknown_outcome_overdue,
    AlertKind.QUARANTINE_OVERDUE: quarantine_overdue,
    AlertKind.CANCEL_UNCONFIRMED: cancel_unconfirmed,
    AlertKind.EFFECT_DIGEST_MISMATCH: effect_digest_mismatch,
    AlertKind.PUSH_RECEIVER_FAILING: push_receiver_failing,
}


# --- the scan ---------------------------------------------------------------------------------------


@dataclass
class ScanReport:
    raised: dict[str, int] = field(default_factory=dict)
    cleared: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {
            "raised": sum(self.raised.values()),
            "cleared": sum(self.cleared.values()),
            **{f"raised.{kind}": n for kind, n in self.raised.items() if n},
            **{f"cleared.{kind}": n for kind, n in self.cleared.items() if n},
        }


def scan(*, now: datetime | None = None) -> ScanReport:
    """Clear what no longer holds, then raise what newly holds, kind by kind (module docstring).

    Past ``ANALYZE_AFTER`` alerts raised or cleared since the last ``ANALYZE``, the alerts table is
    analyzed before the next statement, not only at the end: each kind's raise looks for the open alert
    of its task, and planned with the statistics of the (empty) table from before the first scan, that
    lookup became a loop over every open alert of the kind for every candidate task (a first scan at a
    million tasks took minutes; the next scan's check of 20,000 open waits alone, 24 s).
    """
    now = now or timezone.now()
    report = ScanReport()
    changed = 0
    for kind, classify in CLASSIFIERS.items():
        rule = classify(now)
        report.cleared[kind] = _clear(kind, rule, now)
        changed = _analyze_past(changed + report.cleared[kind])
        report.raised[kind] = _raise(kind, rule, now)
        changed = _analyze_past(changed + report.raised[kind])
    kind = AlertKind.ORPHAN_EFFECTS_OPEN
    report.cleared[kind], report.raised[kind] = _scan_orphans(now)
    _analyze_past(changed + report.cleared[kind] + report.raised[kind])
    if any(report.raised.values()) or any(report.cleared.values()):
        log.info("alerts", extra=report.as_dict())
    return report


def _analyze_past(changed: int) -> int:
    """Analyze the alerts table once more than ``ANALYZE_AFTER`` alerts changed; the count left."""
    if changed <= ANALYZE_AFTER:
        return changed
    _analyze()
    return 0


def _analyze() -> None:
    """Fresh planner statistics for the alerts table (a sample of it: bounded, whatever its size)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(Alert._meta.db_table)}")


def _clear(kind: AlertKind, rule: Rule, now: datetime) -> int:
    """One UPDATE: the open alerts of ``kind`` whose task left the condition or (``progress_clears``)
    moved on."""
    holds = Task.objects.filter(rule.condition, pk=OuterRef("task_id"))
    moved = TransitionEvent.objects.filter(
        task_id=OuterRef("task_id"), state_version__gt=OuterRef("state_version")
    ).exclude(trigger=Trigger.ESCALATE)
    gone = ~Exists(holds) | Exists(moved) if rule.progress_clears else ~Exists(holds)
    return (
        Alert.objects.filter(kind=kind, cleared_at__isnull=True, task__isnull=False)
        .filter(gone)
        .update(cleared_at=now)
    )


def raise_for(kind: AlertKind, task_id: UUID | str, *, now: datetime | None = None) -> int:
    """Raise ``kind`` for one task right now if it meets the kind's condition (and has no open one).

    For a condition a transition itself creates: run inside that transition's transaction
    (``advance(also=…)``), the alert commits with it or not at all.
    """
    now = now or timezone.now()
    rule = CLASSIFIERS[kind](now)
    return _raise(kind, Rule(rule.condition & Q(pk=task_id), rule.cause), now)


def _scan_orphans(now: datetime) -> tuple[int, int]:
    """A tenant's alert while it has open orphan effects (``ledger.OrphanEffect``): cleared when none
    is left open, raised once per tenant with some (``alert_one_open_per_tenant_kind``); (cleared, raised).
    """
    kind = AlertKind.ORPHAN_EFFECTS_OPEN
    open_counts = dict(
        OrphanEffect.objects.filter(status=OrphanStatus.OPEN, tenant__isnull=False)
        .values_list("tenant_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    alerts = Alert.objects.filter(kind=kind, task__isnull=True, cleared_at__isnull=True)
    cleared = alerts.exclude(tenant_id__in=list(open_counts)).update(cleared_at=now)
    raised = set(alerts.values_list("tenant_id", flat=True))
    new = [
        Alert(
            tenant_id=tenant_id,
            kind=kind,
            raised_at=now,
            cause=f"{n} effect(s) an external system holds that no ledger row explains, found after a"
            " restore by manage.py recover: see /console/orphans/",
        )
        for tenant_id, n in open_counts.items()
        if tenant_id not in raised
    ]
    return cleared, len(Alert.objects.bulk_create(new, ignore_conflicts=True)) if new else 0


# Every column an alert is raised with; the others keep their NULL (or are filled below).
_RAISED = {
    "tenant_id": F("tenant_id"),
    "task_id": F("id"),
    "state_version": F("state_version"),
}


def _raise(kind: AlertKind, rule: Rule, now: datetime) -> int:
    """One INSERT … SELECT: an alert for each task meeting ``rule`` without an open one of ``kind``.

    A task with one already is left out by the partial unique index ``alert_one_open_per_kind`` (``ON
    CONFLICT DO NOTHING``: one probe of that index per task), not by a ``NOT EXISTS`` on the alerts
    table: planned with the statistics of a small table, that check read the whole alerts table for each
    task, the rows this very statement was inserting included (3.5 minutes for the first scan's 81,667
    ``no_live_lease`` alerts at a million tasks, 1.2 s with the probe).
    """
    columns = {
        **_RAISED,
        "kind": Value(str(kind)),
        "cause": rule.cause,
        "raised_at": Value(now, output_field=DateTimeField()),
        "acknowledged_by_name": Value(""),
        "acknowledgement_note": Value(""),
    }
    # Annotated under prefixed names and selected by name below: the ORM's own SQL (and quoting) for
    # the condition, whatever order it puts the columns in.
    candidates = (
        Task.objects.filter(rule.condition)
        .annotate(**{f"alert_{name}": value for name, value in columns.items()})
        .values(*(f"alert_{name}" for name in columns))
        .order_by()
    )
    select, params = candidates.query.sql_with_params()
    quote = connection.ops.quote_name
    # "WHERE true": SQLite's parser needs it to tell ON CONFLICT from a join condition.
    sql = (
        f"INSERT INTO {quote(Alert._meta.db_table)} ({', '.join(quote(name) for name in columns)}) "
        f"SELECT {', '.join(quote(f'alert_{name}') for name in columns)} FROM ({select}) candidate "
        "WHERE true ON CONFLICT DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        inserted: int = cursor.rowcount  # -1 when the driver cannot tell
        return max(inserted, 0)


# --- reading ----------------------------------------------------------------------------------------


def visible_alerts(user: Any) -> QuerySet[Alert]:
    """Alerts of the tenants where ``user`` reads alerts (``READ_ROLES``); empty for anyone else."""
    return Alert.objects.filter(tenant_id__in=tenant_ids_for(user, READ_ROLES))


def get_alert(user: Any, alert_id: int) -> Alert:
    """The alert if ``user`` holds any role in its tenant; ``Http404`` otherwise (ids leak nothing).

    Any role, not only ``READ_ROLES``: an approver of the tenant is refused (403) by the
    caller's role check, as for a task's controls; another tenant's user never learns it exists.
    """
    alert = (
        Alert.objects.select_related("tenant", "task")
        .filter(pk=alert_id, tenant_id__in=tenant_ids_for(user))
        .first()
    )
    if alert is None:
        raise Http404("No such alert")
    return alert


def may_handle(user: Any, alert: Alert) -> bool:
    """Operators and admins of the alert's tenant acknowledge and snooze it."""
    return has_role(user, alert.tenant_id, *HANDLE_ROLES)


def snoozed(now: datetime) -> Q:
    return Q(snoozed_until__gt=now)


def needs_attention(now: datetime) -> Q:
    """Open, nobody has acknowledged it, and not snoozed: what the navigation badge counts."""
    return Q(cleared_at__isnull=True, acknowledged_at__isnull=True) & ~snoozed(now)


def filter_alerts(
    alerts: QuerySet[Alert],
    *,
    now: datetime,
    is_open: bool | None = True,
    acknowledged: bool | None = None,
    is_snoozed: bool | None = None,
    attention: bool = False,
    kind: str = "",
    task: UUID | None = None,
) -> QuerySet[Alert]:
    """``alerts`` narrowed by each filter given (None: either way)."""
    if is_open is not None:
        alerts = alerts.filter(cleared_at__isnull=is_open)
    if acknowledged is not None:
        alerts = alerts.filter(acknowledged_at__isnull=not acknowledged)
    if is_snoozed is not None:
        alerts = alerts.filter(snoozed(now)) if is_snoozed else alerts.exclude(snoozed(now))
    if attention:
        alerts = alerts.filter(needs_attention(now))
    if kind:
        alerts = alerts.filter(kind=kind)
    if task is not None:
        alerts = alerts.filter(task_id=task)
    return alerts


def attention_count(user: Any, *, cap: int = BADGE_CAP, now: datetime | None = None) -> int:
    """How many alerts need attention in ``user``'s tenants, counted up to ``cap`` + 1 (one query,
    on the ``alert_open`` partial index: its cost stays flat however many alerts there are)."""
    tenant_ids = tenant_ids_for(user, READ_ROLES)
    if not tenant_ids:
        return 0
    found = Alert.objects.filter(tenant_id__in=tenant_ids).filter(needs_attention(now or timezone.now()))
    return found.order_by().values("id")[: cap + 1].count()


@dataclass(frozen=True)
class AlertPage:
    alerts: list[Alert]
    next_before: int | None  # the ``before`` of the next (older) page; None on the last


def alerts_page(alerts: QuerySet[Alert], *, before: int | None, limit: int) -> AlertPage:
    """One page newest first, strictly older than alert ``before`` (keyset on id), with each
    alert's tenant, task and notes (two queries)."""
    if before is not None:
        alerts = alerts.filter(id__lt=before)
    rows = list(
        alerts.select_related("tenant", "task").prefetch_related("notes").order_by("-id")[: limit + 1]
    )
    more = len(rows) > limit
    return AlertPage(rows[:limit], rows[limit - 1].id if more else None)


# --- acknowledging and snoozing ---------------------------------------------------------------------


class AlertRefused(Exception):
    """Nothing was recorded: ``status`` says how an API answers (400 bad input, 409 the alert's state);
    ``field`` names the input at fault, if one is."""

    def __init__(self, message: str, *, status: int = 400, field: str = ""):
        super().__init__(message)
        self.status = status
        self.field = field


def _name(user: Any) -> str:
    return str(user.get_username())[:150]


def acknowledge(alert: Alert, *, user: Any, note: str, now: datetime | None = None) -> tuple[Alert, bool]:
    """Record ``user``'s acknowledgement of ``alert`` with ``note``; returns the alert and whether
    this was its first acknowledgement (later ones are recorded as notes; the first stands on the
    alert). Also for a cleared alert: what was done about it is worth keeping.

    The caller has checked ``may_handle``. Refuses (``AlertRefused``, 400) a blank or overlong note.
    """
    note = note.strip()
    if not note:
        raise AlertRefused("A note is required: say what you are doing about it.", field="note")
    if len(note) > NOTE_MAX:
        raise AlertRefused(f"The note is longer than {NOTE_MAX} characters.", field="note")
    now = now or timezone.now()
    with transaction.atomic():
        first = Alert.objects.filter(pk=alert.pk, acknowledged_at__isnull=True).update(
            acknowledged_by=user,
            acknowledged_by_name=_name(user),
            acknowledged_at=now,
            acknowledgement_note=note,
        )
        AlertNote.objects.create(
            alert=alert, kind=AlertNote.Kind.ACKNOWLEDGE, by=user, by_name=_name(user), at=now, note=note
        )
    alert.refresh_from_db()
    return alert, bool(first)


def snooze(alert: Alert, *, user: Any, until: datetime, note: str = "", now: datetime | None = None) -> Alert:
    """Silence ``alert`` in the badge until ``until`` (a later snooze replaces it), recorded as a note.

    The caller has checked ``may_handle``. Refuses (``AlertRefused``): a time not in the future or
    more than ``MAX_SNOOZE`` ahead, or an overlong note (400); a cleared alert (409: nothing to silence).
    """
    now = now or timezone.now()
    note = note.strip()
    if until <= now:
        raise AlertRefused("Snooze until a time in the future.", field="until")
    if until > now + MAX_SNOOZE:
        raise AlertRefused(f"Snooze for at most {MAX_SNOOZE.days} days.", field="until")
    if len(note) > NOTE_MAX:
        raise AlertRefused(f"The note is longer than {NOTE_MAX} characters.", field="note")
    with transaction.atomic():
        if not Alert.objects.filter(pk=alert.pk, cleared_at__isnull=True).update(snoozed_until=until):
            raise AlertRefused("The alert was cleared: the task moved on, nothing to snooze.", status=409)
        AlertNote.objects.create(
            alert=alert,
            kind=AlertNote.Kind.SNOOZE,
            by=user,
            by_name=_name(user),
            at=now,
            note=note,
            snoozed_until=until,
        )
    alert.refresh_from_db()
    return alert
