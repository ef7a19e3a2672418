"""Audit pages: search the transition log, one task's whole history and its integrity, exports.

Read-only for everyone. Reads go through ``audit.selectors`` (keyset pages,
never an unbounded query); the integrity badge is ``tasks.audit_paths.verify_chain``,
the very check ``manage.py verify_audit`` runs, with how long ago the last anchor
was taken: events since are covered by the chain key only. Exports stream page by page
(``audit.export``) with every field the chain hashes; the JSON ones are signed with the anchor key,
so an auditor verifies them with its public key alone (``manage.py verify_export``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from audit import export
from audit import selectors as audit_selectors
from audit.anchor import last_run
from audit.chain import BrokenLink
from audit.keys import export_signing_key
from console.access import AUDIT_ROLES, get_task_for_auditing, tenant_ids_or_403
from console.forms import ConsoleForm
from reads import audit_search
from tasks import registry
from tasks.audit_paths import verify_chain
from tasks.states import State, Trigger

PAGE = 50
HISTORY_PAGE = 100
TAKEOVERS_SHOWN = 50
EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}


class EventSearchForm(ConsoleForm):
    actor = forms.CharField(required=False, max_length=200, help_text="part of the actor id")
    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    trigger = forms.ChoiceField(required=False, choices=[("", "any"), *Trigger.choices])
    from_state = forms.ChoiceField(required=False, choices=[("", "any"), *State.choices])
    to_state = forms.ChoiceField(required=False, choices=[("", "any"), *State.choices])
    task_type = forms.ChoiceField(
        required=False, choices=lambda: [("", "any")] + [(n, n) for n in registry.names()]
    )
    reason = forms.CharField(required=False, max_length=200, help_text="part of the reason or its code")

    def search(self) -> audit_selectors.EventSearch:
        return audit_selectors.EventSearch(**self.cleaned_data)


@require_safe
@login_required
def search(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_or_403(request.user, AUDIT_ROLES)
    form = EventSearchForm(request.GET)
    page = None
    if form.is_valid():
        before = audit_selectors.EventCursor.parse(request.GET.get("before"))
        page = audit_search.search(tenant_ids, form.search(), before=before, limit=PAGE)
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "tz": timezone.get_current_timezone_name(),
    }
    return render(request, "console/audit/search.html", context, status=200 if page else 400)


@require_safe
@login_required
def task_history(request: HttpRequest, task_id: UUID) -> HttpResponse:
    task = get_task_for_auditing(request.user, task_id)
    after = _version(request.GET.get("after"))
    full = request.GET.get("verify") == "full"
    context = {
        "task": task,
        "page": audit_selectors.task_events(task.id, after_version=after, limit=HISTORY_PAGE),
        "earlier": max(after - HISTORY_PAGE, 0) if after else None,
        "broken": integrity(task, full=full),
        "full_verify": full,
        "anchored": _anchored(task),
        "takeovers": audit_selectors.task_takeovers(task.id, limit=TAKEOVERS_SHOWN),
        "takeovers_shown": TAKEOVERS_SHOWN,
        "tz": timezone.get_current_timezone_name(),
    }
    return render(request, "console/audit/task.html", context)


def integrity(task: Any, *, full: bool = False) -> BrokenLink | None:
    """The chain's first break, or None: the check ``manage.py verify_audit`` runs, hashing only the
    events after the task's verified-through mark unless ``full`` (``audit.verify.verified_base``)."""
    return verify_chain(task, since_verified=not full, remember=True)


def _anchored(task: Any) -> dict[str, Any] | None:
    """The last anchor's age for the badge, and whether this task changed since (None: never anchored)."""
    run = last_run()
    if run is None:
        return None
    return {
        "at": run.created_at,
        "minutes": int((timezone.now() - run.created_at).total_seconds() // 60),
        "after": task.updated_at > run.created_at,
    }


@require_safe
@login_required
def search_export(request: HttpRequest, fmt: str) -> HttpResponseBase:
    tenant_ids = tenant_ids_or_403(request.user, AUDIT_ROLES)
    form = EventSearchForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(f"Invalid search: {form.errors.as_text()}", content_type="text/plain")
    criteria = form.search()
    head = {"tenant_ids": sorted(tenant_ids), "search": criteria.as_dict(), "order": "newest first"}
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    return _stream(
        fmt, f"audit-events-{stamp}", "search", head, audit_search.iter_events(tenant_ids, criteria)
    )


@require_safe
@login_required
def task_export(request: HttpRequest, task_id: UUID, fmt: str) -> HttpResponseBase:
    task = get_task_for_auditing(request.user, task_id)
    # The head and version were read with the task row; the export stops at that version. The chain is
    # verified in full (manage.py verify_audit's check) and what was found goes inside what is signed.
    broken = verify_chain(task) if fmt == "json" else None
    head = {
        "task": {
            "id": str(task.id),
            "tenant_id": task.tenant_id,
            "state_version": task.state_version,
            "audit_head": task.audit_head,
        },
        "order": "chain order (state_version ascending)",
    }
    if fmt == "json":
        head["chain"] = {
            "verified": broken is None,
            "problem": str(broken) if broken else None,
            "version": broken.state_version if broken else None,
            "checked": "every link with the chain keys and the path through the transition table",
        }
    events = audit_selectors.iter_task_events(task.id, upto_version=task.state_version)
    return _stream(fmt, f"audit-task-{task.id}-v{task.state_version}", "task", head, events)


def _stream(
    fmt: str, name: str, kind: str, head: dict[str, Any], events: Iterable[Any]
) -> StreamingHttpResponse:
    if fmt not in EXPORT_TYPES:
        raise Http404("Export as csv or json")
    exported_at = timezone.now().isoformat(timespec="microseconds")
    chunks = (
        export.stream_csv(events)
        if fmt == "csv"
        else export.stream_json(
            export.header(kind=kind, exported_at=exported_at, **head), events, signer=export_signing_key()
        )
    )
    response = StreamingHttpResponse(chunks, content_type=EXPORT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


def _version(text: str | None) -> int:
    """A page's starting version from the query string; anything mangled is the first page."""
    try:
        return max(int(text or 0), 0)
    except ValueError:
        return 0
