"""The audit search for a user of several tenants: one query a tenant, merged (``audit.selectors``).

``event_tenant_created`` leads with the tenant, so ``tenant_id IN (1, 2) ORDER BY created_at DESC``
reads and sorts every event of both tenants, where ``tenant_id = 1 ORDER BY ... LIMIT n`` is an index
range that stops after ``n``. Each tenant's page comes from ``audit.selectors.search_events`` itself,
so every filter means what it always meant; the pages merged newest first by (created_at, id), unique,
are exactly the page one query over all the tenants gives, with the same next cursor.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator

from audit.models import TransitionEvent
from audit.selectors import EXPORT_PAGE, EventCursor, EventPage, EventSearch, search_events


def _key(event: TransitionEvent) -> tuple[object, int]:
    return (event.created_at, event.id)


def search(
    tenant_ids: Collection[int], criteria: EventSearch, *, before: EventCursor | None, limit: int
) -> EventPage:
    """One page of matching events in ``tenant_ids``, newest first: one query a tenant."""
    tenants = sorted(set(tenant_ids))
    if len(tenants) <= 1:
        return search_events(tenants, criteria, before=before, limit=limit)
    found: list[TransitionEvent] = []
    more = False
    for tenant in tenants:
        page = search_events([tenant], criteria, before=before, limit=limit)
        found.extend(page.events)
        more = more or page.next_cursor is not None
    found.sort(key=_key, reverse=True)
    more = more or len(found) > limit
    last = found[limit - 1] if more else None
    return EventPage(found[:limit], EventCursor(last.created_at, last.id) if last is not None else None)


def iter_events(tenant_ids: Collection[int], criteria: EventSearch) -> Iterator[TransitionEvent]:
    """Every matching event newest first, for a streamed export: each tenant read ``EXPORT_PAGE`` rows
    per query and the streams merged as they go, so the first rows cost one page a tenant."""
    streams = [_tenant_events(tenant, criteria) for tenant in sorted(set(tenant_ids))]
    return heapq.merge(*streams, key=_key, reverse=True)


def _tenant_events(tenant: int, criteria: EventSearch) -> Iterator[TransitionEvent]:
    cursor: EventCursor | None = None
    while True:
        page = search_events([tenant], criteria, before=cursor, limit=EXPORT_PAGE)
        yield from page.events
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
