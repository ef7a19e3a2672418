"""Read queries over the audit log for the console and its exports.

``audit`` sits beside ``tenancy`` at the lowest layer and imports neither it
nor ``tasks``: callers pass the tenant ids the user may read
(``tenancy.selectors.tenant_ids_for``) and reach the task through the foreign
key. Every query here is keyset-paged with a ``limit``: a page, or an export
streamed page by page, never one unbounded read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.db.models import F, Q, QuerySet

from audit.models import LeaseTakeover, TransitionEvent

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EXPORT_PAGE = 500  # rows per query while an export streams


@dataclass(frozen=True)
class EventSearch:
    """What an auditor searches the log by; empty means "any"."""

    actor: str = ""  # part of ``actor_id`` ("acme-operator", "user:", "worker:w1"), case-insensitive
    since: datetime | None = None  # created_at >= since
    until: datetime | None = None  # created_at < until
    trigger: str = ""
    from_state: str = ""
    to_state: str = ""
    task_type: str = ""
    reason: str = ""  # part of the reason text or the reason code, case-insensitive

    def as_dict(self) -> dict[str, str]:
        """The non-empty criteria as text (what an export records it was asked for)."""
        found: dict[str, str] = {}
        for name, value in vars(self).items():
            if isinstance(value, datetime):
                found[name] = value.astimezone(UTC).isoformat(timespec="microseconds")
            elif value:
                found[name] = str(value)
        return found


@dataclass(frozen=True)
class EventCursor:
    """Where the next (older) page of a search starts: after this (created_at, id).

    Written as ``<microseconds since the epoch>_<id>`` so a link carries it intact.
    """

    created_at: datetime
    id: int

    def __str__(self) -> str:
        return f"{(self.created_at - EPOCH) // timedelta(microseconds=1)}_{self.id}"

    @classmethod
    def parse(cls, text: str | None) -> EventCursor | None:
        """The cursor in ``text``, or None for an absent or mangled one (the first page)."""
        micros, _, row_id = (text or "").partition("_")
        try:
            return cls(EPOCH + timedelta(microseconds=int(micros)), int(row_id))
        except (ValueError, OverflowError):
            return None


@dataclass(frozen=True)
class EventPage:
    events: Sequence[TransitionEvent]
    next_cursor: EventCursor | None  # None: this is the last page


def _searched(tenant_ids: Collection[int], search: EventSearch) -> QuerySet[TransitionEvent]:
    events = TransitionEvent.objects.filter(tenant_id__in=list(tenant_ids))
    if search.actor:
        events = events.filter(actor_id__icontains=search.actor)
    if search.since is not None:
        events = events.filter(created_at__gte=search.since)
    if search.until is not None:
        events = events.filter(created_at__lt=search.until)
    if search.trigger:
        events = events.filter(trigger=search.trigger)
    if search.from_state:
        events = events.filter(from_state=search.from_state)
    if search.to_state:
        events = events.filter(to_state=search.to_state)
    if search.task_type:
        events = events.filter(task__task_type=search.task_type)
    if search.reason:
        events = events.filter(Q(reason__icontains=search.reason) | Q(reason_code__icontains=search.reason))
    return events


def _on_the_index_alone(search: EventSearch) -> bool:
    """Whether every criterion reads ``event_tenant_created``'s entries (tenant, created_at, id and the
    actor it includes): the actor, with or without a time window, and nothing else."""
    others = (search.trigger, search.from_state, search.to_state, search.task_type, search.reason)
    return bool(search.actor) and not any(others)


def search_events(
    tenant_ids: Collection[int], search: EventSearch, *, before: EventCursor | None, limit: int
) -> EventPage:
    """One page of events in ``tenant_ids`` matching ``search``, newest first.

    One query: newest first by (created_at, id), the ``event_tenant_created``
    index; the task's type and objective come along by a join, not per row. A search by actor
    picks the page's ids on that index alone (it includes ``actor_id``), in the same query.
    """
    events = _searched(tenant_ids, search)
    if before is not None:
        events = events.filter(
            Q(created_at__lt=before.created_at) | Q(created_at=before.created_at, id__lt=before.id)
        )
    if _on_the_index_alone(search):
        # The page's ids first, read from the index alone (its entries carry the actor), then those
        # rows: a filter the walk passes over (an actor who wrote one event in 200) costs index
        # entries, not a heap row fetched and dropped for each.
        page = events.order_by("-created_at", "-id").values("id")[: limit + 1]
        events = TransitionEvent.objects.filter(id__in=page)
    rows = list(
        events.annotate(task_type=F("task__task_type"), task_objective=F("task__objective"))
        .select_related("tenant")
        .order_by("-created_at", "-id")[: limit + 1]
    )
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return EventPage(rows[:limit], EventCursor(last.created_at, last.id) if last is not None else None)


def iter_search(tenant_ids: Collection[int], search: EventSearch) -> Iterator[TransitionEvent]:
    """Every matching event, newest first, read ``EXPORT_PAGE`` rows per query (for a streamed export)."""
    cursor: EventCursor | None = None
    while True:
        page = search_events(tenant_ids, search, before=cursor, limit=EXPORT_PAGE)
        yield from page.events
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@dataclass(frozen=True)
class HistoryPage:
    events: Sequence[TransitionEvent]
    next_after: int | None  # the version the next page starts after; None: last page


def task_events(
    task_id: UUID, *, after_version: int, limit: int, upto_version: int | None = None
) -> HistoryPage:
    """One page of a task's history in chain order: versions after ``after_version``.

    One query on the ``event_one_per_version`` unique index. ``upto_version``
    stops at a version read earlier, so an export ends exactly at the head it reports.
    """
    events = TransitionEvent.objects.filter(task_id=task_id, state_version__gt=after_version)
    if upto_version is not None:
        events = events.filter(state_version__lte=upto_version)
    rows = list(events.order_by("state_version")[: limit + 1])
    more = len(rows) > limit
    return HistoryPage(rows[:limit], rows[limit - 1].state_version if more else None)


def iter_task_events(task_id: UUID, *, upto_version: int) -> Iterator[TransitionEvent]:
    """A task's events v1..``upto_version`` in chain order, ``EXPORT_PAGE`` per query."""
    after = 0
    while True:
        page = task_events(task_id, after_version=after, limit=EXPORT_PAGE, upto_version=upto_version)
        yield from page.events
        if page.next_after is None:
            return
        after = page.next_after


def task_takeovers(task_id: UUID, *, limit: int) -> list[LeaseTakeover]:
    """A task's newest lease takeovers (``takeover_task_taken`` index)."""
    return list(LeaseTakeover.objects.filter(task_id=task_id).order_by("-taken_at", "-id")[:limit])
