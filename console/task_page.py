"""The task page: why a task stands where it is, what it knows, what happened, what may be done.

Server-rendered and complete without JavaScript. ``task_detail`` reads; the
three POST views each call one service (``runtime.controls.task_control``,
``tasks.services.task_provide_input``, ``tasks.services.task_rerun``) and
redirect back. A refused write keeps what the operator typed in the session
(``_keep_draft``) so the page they land on shows it again.

Queries are bounded whatever the history's length: the timeline is a keyset
page on ``(task, state_version)`` (the ``event_one_per_version`` index), the
checkpoint viewer reads one or two rows, the rest are capped lists.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST, require_safe

from audit import sealing
from audit.models import LeaseTakeover, TransitionEvent
from console import chain_guard
from console.access import AUDIT_ROLES, can_operate, get_task_for_user
from console.forms import (
    DESTRUCTIVE,
    AnswerForm,
    CompensateForm,
    ControlForm,
    ForkForm,
    RerunForm,
    RevealForm,
)
from console.posting import Done, Refusal, form_post
from console.quarantine import BEFORE_RELEASE
from ledger import integrity
from protection import retention, reveal
from reads.task_a2a import read_task_a2a
from reads.task_detail import Sections, TaskDetail, read_task_detail
from runtime import controls
from tasks import checkpoints, compensation, forks, registry, selectors, services
from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Checkpoint, Lease, Task
from tasks.states import RUNNABLE, TERMINAL, WAITING, ActorKind, State, Trigger
from tasks.transitions import Actor
from tenancy.models import Role
from tenancy.selectors import has_role

TIMELINE_PAGE = 50
STORED_SHOWN = 20_000  # characters of an unreadable checkpoint shown as stored
CHECKPOINT_LINKS = 30  # newest checkpoint versions linked from the viewer (any other: by number)
ACTIONS_SHOWN = 100
TURNS_SHOWN = 50  # an agent run's model turns (the support agent takes four; max_turns caps a run)
CHILDREN_SHOWN = 100  # a parent page lists this many children (order_batch starts at most 20)
# What the page lists of the task's detail (the API lists every child, cancel request and rerun). Its
# approvals list shows every request, the pending ones among them, so none is read apart.
SECTIONS = Sections(
    children=CHILDREN_SHOWN,
    cancel_requests=20,
    reruns=20,
    pending_approvals=0,
    approvals=20,
    actions=ACTIONS_SHOWN,
    agent_turns=TURNS_SHOWN,
)
DRAFT_KEY = "console:task-drafts"  # session: task id -> {"form": control|"answer"|"rerun", fields...}


def stamp(value: datetime | None) -> SafeString | str:
    """The one way the task page writes a moment: local time with its zone, ISO in ``datetime``."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}">{}</time>', local.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S %Z")
    )


# --- the "why" panel ---------------------------------------------------------------------------------

# Human phrasing of what a validation or quarantine found, for the controls' help text.
FOUND = {
    "revalidated": "it passed resume validation last time",
    "policy_changed": "its policy version changed last time (it was replanned)",
    "policy_changed_immaterial": "its policy changed last time, immaterially (it proceeded)",
    "runtime_config_replaced": "its model, prompt or tool set was no longer approved last time (replanned)",
    "evidence_changed": "an evidence record had changed last time (refreshed)",
    "deadline_passed": "its deadline had passed last time",
    "approver_access_revoked": "its approver had lost the role last time (a new approval was asked)",
    "step_error": "a step raised an error last time",
    "evidence_missing": "an evidence record was missing last time",
    "owner_access_revoked": "its owner had lost access last time",
    "unknown_step": "its step no longer existed in the task type last time",
    "quarantine": "an operator quarantined it",
    integrity.EFFECT_DIGEST_MISMATCH: "an effect it was about to send was not the one intended last time "
    "(changed in the database; nothing was sent)",
}


@dataclass(frozen=True)
class Why:
    """What the panel at the top says. Moments stay datetimes: the template formats them."""

    reason: str  # the human reason of the latest event (and of the event that entered the state)
    code: str  # Task.state_reason
    waiting_for: str
    until: datetime | None
    next: str
    next_at: datetime | None = None
    next_then: str = ""
    stuck: bool = False
    entry_reason: str = ""


def _waiting_for(task: Task, step: registry.Step | None, unknown_effects: int) -> str:
    state = task.state
    if state == State.WAITING_INPUT:
        question = step.question if isinstance(step, registry.RequestInput) else "(question unknown)"
        return f"an answer to “{question}”"
    if state == State.WAITING_APPROVAL:
        if isinstance(step, registry.RequestApproval):
            return f"an {step.approver_role}'s decision on “{step.action_step}”"
        return "an approval decision"
    if state == State.WAITING_EXTERNAL:
        kind = step.event_type if isinstance(step, registry.AwaitExternal) else "an external event"
        return f"the external event “{kind}”"
    if state == State.WAITING_RETRY:
        return f"its backoff to elapse before attempt {task.attempt + 1}"
    if state == State.OUTCOME_UNKNOWN:
        return f"the authoritative outcome of {unknown_effects or 'a'} side effect(s) in doubt"
    if state == State.CANCEL_REQUESTED:
        return "a worker to settle in-flight side effects and confirm the cancellation"
    if state == State.RESUME_VALIDATION:
        return "a worker to revalidate it before it resumes"
    if state == State.READY:
        return f"a worker to run step “{step.name}”" if step is not None else "a worker"
    if state == State.QUARANTINED:
        return "an operator's decision: nothing resumes a quarantined task by itself"
    return "nothing: the task has ended"


def _stuck_cause(task: Task) -> str:
    """Which clause of ``tasks.selectors.stuck_condition`` holds; the state decides (they are disjoint)."""
    if task.state in RUNNABLE:
        return (
            f"no worker has held its lease for over {settings.STUCK_AFTER:g} s since it became {task.state}: "
            f"are workers for region “{task.region}” running?"
        )
    if task.state in WAITING:
        return "its wait deadline passed and nothing ended the wait: is the sweep (celery beat) running?"
    return (
        f"its outcome has been unknown for over {settings.UNKNOWN_OUTCOME_ESCALATE_AFTER:g} s and "
        "the reconciler has not settled it: reconcile now, or check the system"
    )


def _reason_of(event: TransitionEvent | None) -> str:
    """The event's own words; one that gave none (a worker completing the last step, say) is told by
    what happened and who did it, never as "no reason recorded"."""
    if event is None:
        return ""
    if event.reason:
        return event.reason
    return f"{event.trigger.replace('_', ' ')} (by the {event.actor_kind})"


def _why(
    task: Task,
    *,
    step: registry.Step | None,
    lease: Lease | None,
    latest: TransitionEvent | None,
    entry: TransitionEvent | None,
    stuck: bool,
    unknown_effects: int,
    undoable: int = 0,
) -> Why:
    base: dict[str, Any] = {
        "reason": _reason_of(latest),
        "entry_reason": entry.reason if entry is not None and entry != latest else "",
        "code": task.state_reason,
        "waiting_for": _waiting_for(task, step, unknown_effects),
        "until": task.wait_deadline,
    }
    state = task.state
    if stuck:
        return Why(**base, next=f"nothing: stuck — {_stuck_cause(task)}", stuck=True)
    if state in TERMINAL:
        rerunnable = state in services.RERUNNABLE and task.compensates_id is None
        rerun = " An operator can rerun it as a new task." if rerunnable else ""
        if undoable:
            rerun += f" {undoable} effect(s) it left done can be undone below (Effects left done)."
        return Why(**base, next=f"nothing: the task ended ({state}).{rerun}")
    if state == State.QUARANTINED:
        return Why(
            **base, next="an operator must act: release it (resume validation runs again) or cancel it"
        )
    if state in RUNNABLE:
        if lease is not None:
            return Why(
                **base,
                next=f"worker {lease.worker_id} is working on it (lease #{lease.token}) until",
                next_at=lease.expires_at,
            )
        return Why(**base, next=f"eligible: the next free worker of region “{task.region}” claims it")
    if state == State.OUTCOME_UNKNOWN:
        every = settings.CELERY_BEAT_SCHEDULE["reconcile"]["schedule"]
        return Why(
            **base,
            next=f"the reconciler asks the system again (every {every:g} s); an operator can reconcile now",
        )
    if state == State.WAITING_RETRY:
        return Why(
            **base,
            next="the sweep resumes it at",
            next_at=task.wait_deadline,
            next_then="(backoff elapsed); an operator can retry it sooner",
        )
    # The other waits: the awaited answer arrives, or the sweep ends the wait at its deadline.
    on_expiry = registry.get(task.task_type).on_wait_expiry if task.task_type in registry.names() else ""
    then = "it goes through resume validation and asks again" if on_expiry == "revalidate" else "it expires"
    return Why(
        **base,
        next="the awaited answer arrives, or the sweep ends the wait at",
        next_at=task.wait_deadline,
        next_then=f"(then {then})",
    )


# --- checkpoints: viewer and diff --------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One stored checkpoint as the page shows it: decoded, or the reason it cannot be."""

    version: int
    document: checkpoints.Checkpoint | None
    unreadable: str = ""  # "<reason>: <detail>"
    created_at: datetime | None = None
    digest: str = ""
    stored: str = ""  # an unreadable one's body as stored (the start of it), schema and codec
    facts: dict[str, Any] = field(default_factory=dict)  # as shown: the sensitive ones masked
    sensitive: frozenset[str] = frozenset()  # the task type's sensitive names
    masked: tuple[str, ...] = ()  # the facts shown masked (each with a reveal form)


def _with_recorded_digest(rows: Any) -> Any:
    recorded = TransitionEvent.objects.filter(
        task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
    ).values("checkpoint_digest")[:1]
    return rows.annotate(recorded_digest=Subquery(recorded))


def _shown(row: Any, task_type: str) -> Shown:
    try:
        document = retention.read_for_review(row, recorded_digest=row.recorded_digest)
    except CheckpointUnreadable as exc:
        stored = f"schema {row.schema_version} · codec {row.codec}\n{row.body[:STORED_SHOWN]}"
        return Shown(
            row.state_version, None, f"{exc.reason}: {exc.detail}", row.created_at, row.digest, stored
        )
    sensitive = registry.sensitive_fields(task_type)
    return Shown(
        row.state_version,
        document,
        "",
        row.created_at,
        row.digest,
        facts=reveal.masked_facts(task_type, dict(document.facts)),
        sensitive=sensitive,
        masked=tuple(reveal.masked_names(task_type, dict(document.facts))),
    )


def _load_checkpoints(task: Task, versions: list[int]) -> dict[int, Shown]:
    """The given versions (one query), or the newest when ``versions`` is empty."""
    rows = _with_recorded_digest(Checkpoint.objects.filter(task=task))
    if versions:
        return {
            row.state_version: _shown(row, task.task_type) for row in rows.filter(state_version__in=versions)
        }
    newest = rows.order_by("-state_version").first()
    return {newest.state_version: _shown(newest, task.task_type)} if newest is not None else {}


def _version(text: str | None) -> int | None:
    try:
        value = int(text or "")
    except ValueError:
        return None
    return value if 1 <= value < 2**31 else None


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Diff:
    older: Shown
    newer: Shown
    facts: list[tuple[str, str, str, str]] = field(default_factory=list)  # (change, name, before, after)
    fields: list[tuple[str, str, str]] = field(default_factory=list)  # (name, before, after)


# Fields every checkpoint has that say nothing about progress between two versions.
_DIFF_SKIPPED = {"facts", "task_id", "schema_version"}


def checkpoint_diff(older: Shown, newer: Shown) -> Diff:
    """Facts added, removed and changed from ``older`` to ``newer``, and every other field that changed."""
    if older.document is None or newer.document is None:
        return Diff(older, newer)
    a, b = older.document.facts, newer.document.facts
    # Compared in clear, shown masked: a changed card shows as changed even when its tail is the same.
    sensitive = older.sensitive | newer.sensitive

    def show(name: str, value: Any) -> str:
        return _json(sealing.mask(value) if name in sensitive else value)

    facts = [("added", k, "", show(k, b[k])) for k in sorted(b.keys() - a.keys())]
    facts += [("removed", k, show(k, a[k]), "") for k in sorted(a.keys() - b.keys())]
    facts += [
        ("changed", k, show(k, a[k]), show(k, b[k])) for k in sorted(a.keys() & b.keys()) if a[k] != b[k]
    ]
    before, after = older.document.model_dump(mode="json"), newer.document.model_dump(mode="json")
    fields = [
        (name, _json(before.get(name)), _json(after.get(name)))
        for name in sorted(before.keys() | after.keys())
        if name not in _DIFF_SKIPPED and before.get(name) != after.get(name)
    ]
    return Diff(older, newer, facts, fields)


def _checkpoint_context(task: Task, query: Any) -> dict[str, Any]:
    """The viewer (``?checkpoint=N``, default the newest) and the diff (``?diff=A,B``)."""
    wanted = _version(query.get("checkpoint"))
    diff_pair: tuple[int, int] | None = None
    first, _, second = (query.get("diff") or "").partition(",")
    a, b = _version(first), _version(second)
    if a is not None and b is not None and a != b:
        diff_pair = (min(a, b), max(a, b))
    versions = list(
        Checkpoint.objects.filter(task=task)
        .order_by("-state_version")
        .values_list("state_version", flat=True)[:CHECKPOINT_LINKS]
    )
    latest_version = versions[0] if versions else None
    needed = {v for v in (wanted, latest_version, *(diff_pair or ())) if v is not None}
    loaded = _load_checkpoints(task, sorted(needed)) if needed else {}
    viewed_version = wanted if wanted in loaded else latest_version
    context: dict[str, Any] = {
        "checkpoint_versions": versions,
        "latest_checkpoint": loaded.get(latest_version) if latest_version is not None else None,
        "viewed": loaded.get(viewed_version) if viewed_version is not None else None,
        "checkpoint_missing": wanted is not None and wanted not in loaded,
        "wanted_checkpoint": wanted,
        "diff": None,
        "diff_missing": [],
    }
    viewed = context["viewed"]
    if viewed is not None:
        older = [v for v in versions if v < viewed.version]
        context["previous_version"] = older[0] if older else None
    if diff_pair is not None:
        missing = [v for v in diff_pair if v not in loaded]
        context["diff_missing"] = missing
        if not missing:
            context["diff"] = checkpoint_diff(loaded[diff_pair[0]], loaded[diff_pair[1]])
    return context


# --- the timeline ------------------------------------------------------------------------------------


def _timeline(task: Task, query: Any, *, taken_over: bool) -> dict[str, Any]:
    """One keyset page of events, newest first unless ``?order=oldest``; ``?after=<version>`` pages on,
    with the lease takeovers taken between them when the task was ever ``taken_over``.

    Routine ``step`` events (a worker finished a step and stays ready) are
    grouped, runs of them folded into one ``<details>``.
    """
    oldest_first = query.get("order") == "oldest"
    after = _version(query.get("after"))
    events = TransitionEvent.objects.filter(task=task)
    if after is not None:
        events = (
            events.filter(state_version__gt=after) if oldest_first else events.filter(state_version__lt=after)
        )
    rows = list(events.order_by("state_version" if oldest_first else "-state_version")[: TIMELINE_PAGE + 1])
    page, more = rows[:TIMELINE_PAGE], len(rows) > TIMELINE_PAGE
    items: list[dict[str, Any]] = []
    for entry in _with_takeovers(task, page, oldest_first) if taken_over else page:
        if isinstance(entry, LeaseTakeover):
            items.append({"routine": False, "takeover": entry, "events": []})
            continue
        routine = entry.trigger == Trigger.STEP and entry.from_state == entry.to_state
        if routine and items and items[-1]["routine"]:
            items[-1]["events"].append(entry)
        else:
            items.append({"routine": routine, "events": [entry]})
    return {
        "timeline": items,
        "timeline_order": "oldest" if oldest_first else "newest",
        "timeline_next": page[-1].state_version if more else None,
        "timeline_first_page": after is None,
    }


def _with_takeovers(
    task: Task, page: list[TransitionEvent], oldest_first: bool
) -> list[TransitionEvent | LeaseTakeover]:
    """The page's events with the lease takeovers taken between them, in the page's order.

    A takeover belongs after the newest event written before it, so a page holds the takeovers from
    its oldest event to the event after its newest (read when the page does not end at the task's
    version: one indexed row). Bounded: at most one page of takeovers.
    """
    if not page:
        return []
    low, high = min(page, key=lambda e: e.state_version), max(page, key=lambda e: e.state_version)
    takeovers = LeaseTakeover.objects.filter(task=task, taken_at__gte=low.created_at)
    if high.state_version < task.state_version:
        after = TransitionEvent.objects.filter(task=task, state_version=high.state_version + 1)
        if (until := after.values_list("created_at", flat=True).first()) is not None:
            takeovers = takeovers.filter(taken_at__lt=until)
    taken = list(takeovers.order_by("taken_at", "id")[:TIMELINE_PAGE])
    merged: list[TransitionEvent | LeaseTakeover] = sorted(
        [*page, *taken],
        key=lambda entry: (
            entry.taken_at if isinstance(entry, LeaseTakeover) else entry.created_at,
            isinstance(entry, LeaseTakeover),  # at the same moment, the event first
        ),
    )
    return merged if oldest_first else merged[::-1]


# --- controls ----------------------------------------------------------------------------------------


def _found(event: TransitionEvent | None) -> str:
    if event is None:
        return ""
    said = FOUND.get(event.reason_code) or (
        f"last time: {event.reason_code}" if event.reason_code else f"last time: {event.trigger}"
    )
    if event.reason_code.startswith("checkpoint_"):
        said = f"its checkpoint could not be read last time ({event.reason_code})"
    return f"{said}" + (f" — “{event.reason}”" if event.reason else "")


def control_help(control: str, task: Task, last_check: TransitionEvent | None, in_doubt: int) -> str:
    """What ``control`` does to this task and its likely result (from its last validation or quarantine)."""
    found = _found(last_check)
    if control == "release":
        text = (
            "Release sends the task to resume validation: the checkpoint is read again, then deadline, "
            "access, runtime config, policy and evidence are re-checked."
        )
        if found:
            text += f" This task: {found}."
        hint = BEFORE_RELEASE.get(last_check.reason_code, "") if last_check is not None else ""
        return f"{text} {hint}".strip()
    if control == "retry_migration":
        text = (
            "Retry migration reads the stored checkpoint with this deployment's code first. If it reads "
            "now (a migration or codec was deployed since), the task is released to resume validation; "
            "if not, nothing changes and you see why."
        )
        return text + (f" This task: {found}." if found else "")
    if control == "cancel":
        text = (
            "Cancel asks the task to stop. A worker first settles the side effects in flight, "
            "then the task ends canceled; its report lists any effect that could not be undone."
        )
        if in_doubt:
            text += f" {in_doubt} side effect(s) are in flight or unknown: they are reconciled first."
        return text
    if control == "quarantine":
        return (
            "Quarantine holds the task: no worker resumes it until an operator releases it "
            "(release re-runs resume validation). Use it when resuming would be unsafe."
        )
    if control == "retry":
        text = (
            f"Retry ends the backoff now: the task goes through resume validation, then attempt "
            f"{task.attempt + 1} runs."
        )
        return text + (f" This task: {found}." if found else "")
    if control == "escalate":
        return (
            f"Escalate raises the escalation level ({task.escalation_level} → {task.escalation_level + 1}) "
            "and hands the task to the role you pick; its state does not change."
        )
    if control == "reconcile":
        return (
            "Reconcile asks the authoritative system now about each side effect in doubt (by its idempotency "
            "key): found done → ready; failed → retry with backoff; absent → sent again after a backoff."
        )
    return f"{control.title()}: an operator control from the transition table."


def _drafts(request: HttpRequest) -> dict[str, Any]:
    stored = request.session.get(DRAFT_KEY)
    return stored if isinstance(stored, dict) else {}


def _keep_draft(request: HttpRequest, task: Task, form: str, data: Any) -> None:
    """Keep what the operator typed for the page they are sent back to (one draft per task)."""
    drafts = _drafts(request)
    drafts[str(task.id)] = {
        "form": form,
        **{k: str(data.get(k, ""))[:2000] for k in ("reason", "answer", "scope", "escalate_to")},
    }
    request.session[DRAFT_KEY] = drafts


def _take_draft(request: HttpRequest, task: Task) -> dict[str, Any]:
    drafts = _drafts(request)
    if str(task.id) not in drafts:
        return {}
    draft = drafts.pop(str(task.id))
    request.session[DRAFT_KEY] = drafts
    return draft if isinstance(draft, dict) else {}


def _control_forms(
    request: HttpRequest,
    detail: TaskDetail,
    draft: dict[str, Any],
    last_check: TransitionEvent | None,
    in_doubt: int,
) -> list[dict[str, Any]]:
    task = detail.task
    if not can_operate(request.user, task):
        return []
    triggers = {move["trigger"] for move in detail.allowed_moves}
    offered = [name for name, trigger in controls.CONTROLS.items() if trigger in triggers]
    if not controls.migration_may_help(task.state_reason):
        offered = [name for name in offered if name != "retry_migration"]
    forms = []
    for name in offered:
        initial: dict[str, Any] = {"expected_version": task.state_version}
        if draft.get("form") == name:
            initial.update({k: draft[k] for k in ("reason", "scope", "escalate_to") if draft.get(k)})
        forms.append(
            {
                "name": name,
                "label": controls.label(name).capitalize(),
                "form": ControlForm(control=name, auto_id=f"%s-{name}", initial=initial),
                "help": control_help(name, task, last_check, in_doubt),
                "destructive": name in DESTRUCTIVE,
            }
        )
    return forms


# --- views -------------------------------------------------------------------------------------------


@require_safe
@login_required
def task_detail(request: HttpRequest, task_id: UUID) -> HttpResponse:
    task = get_task_for_user(request.user, task_id)
    draft = _take_draft(request, task)
    context = {"task": task, **_page_context(request, task, draft), **_live_context(request, task)}
    response = render(request, "console/task_detail.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _live_context(request: HttpRequest, task: Task) -> dict[str, Any]:
    """The live refresh: a non-terminal task re-reads itself, remembering the version first shown.

    ``seen`` travels in the refresh's URL, so the page can say the task moved on since it was
    opened (its controls, which are not refreshed, then carry an older version).
    """
    try:
        seen = int(request.GET.get("seen", ""))
    except ValueError:
        seen = task.state_version
    params = request.GET.copy()
    params["seen"] = str(seen)
    return {
        "live": task.state not in TERMINAL,
        "live_url": f"{request.path}?{params.urlencode()}",
        "seen_version": seen,
        "moved": seen != task.state_version,
    }


def _page_context(request: HttpRequest, task: Task, draft: dict[str, Any]) -> dict[str, Any]:
    """Everything the page shows besides the task row: its detail (``reads.task_detail``, which
    the API serializes too), then the page's own reads. About twenty queries, none per event."""
    now = timezone.now()
    detail = read_task_detail(task, user=request.user, sections=SECTIONS)
    events = TransitionEvent.objects.filter(task=task)
    latest = events.filter(state_version=task.state_version).first()
    entry = (
        events.filter(to_state=task.state).exclude(from_state=task.state).order_by("-state_version").first()
    )
    last_check = (
        events.filter(
            Q(from_state=State.RESUME_VALIDATION)
            | (Q(to_state=State.QUARANTINED) & ~Q(from_state=State.QUARANTINED))
        )
        .order_by("-state_version")
        .first()
    )
    stuck = Task.objects.filter(pk=task.pk).filter(selectors.stuck_condition(now)).exists()
    lease = detail.lease if detail.lease_live else None
    ledger = detail.ledger
    in_doubt = sum(n for state, n in ledger.items() if state in ("intended", "dispatching", "unknown"))
    checkpoint_context = _checkpoint_context(task, request.GET)
    latest_point: Shown | None = checkpoint_context["latest_checkpoint"]
    step = None
    if latest_point is not None and latest_point.document is not None and task.task_type in registry.names():
        step = registry.get(task.task_type).step(latest_point.document.step)
    operate = can_operate(request.user, task)
    broken = chain_guard.broken_chain(task)  # the audit history's badge, shown here too
    answer_form = None
    if operate and task.state == State.WAITING_INPUT and isinstance(step, registry.RequestInput):
        answer_form = AnswerForm(
            question=step.question,
            initial={"expected_version": task.state_version, "answer": draft.get("answer", "")},
        )
    rerun_form = None
    if operate and task.state in services.RERUNNABLE and task.compensates_id is None:
        initial = {"idempotency_key": f"console-rerun:{uuid4()}"}
        if draft.get("form") == "rerun":
            initial["reason"] = draft.get("reason", "")
        rerun_form = RerunForm(initial=initial)
    fork_form = None
    viewed: Shown | None = checkpoint_context["viewed"]
    if operate and viewed is not None and viewed.document is not None and not forks.refusal(task):
        fork_key = f"console-fork:{uuid4()}"
        fork_initial: dict[str, Any] = {"version": viewed.version, "idempotency_key": fork_key}
        if draft.get("form") == "fork":
            fork_initial["reason"] = draft.get("reason", "")
        fork_form = ForkForm(initial=fork_initial, editable=_fork_editable(task, detail.input))
    offers = detail.compensations  # a canceled task's effects left done, each with its run if started
    return {
        "why": _why(
            task,
            step=step,
            lease=lease,
            latest=latest,
            entry=entry,
            stuck=stuck,
            unknown_effects=ledger.get("unknown", 0),
            undoable=sum(offer.open for offer in offers),
        ),
        "lease": lease,
        "ledger": ledger,
        "usage": detail.usage,
        "controls": _control_forms(request, detail, draft, last_check, in_doubt),
        "broken": broken,
        "broken_at": chain_guard.where(broken) if broken else "",
        "confirm_chain_field": chain_guard.CONFIRM_FIELD,
        "full_verify": False,
        "may_audit": has_role(request.user, task.tenant_id, *AUDIT_ROLES),
        "answer_form": answer_form,
        "rerun_form": rerun_form,
        # Sensitive fields masked; each may be revealed (operators, admins), recorded, from "revealable".
        "input_json": _masked_json(detail.input),
        "outcome_json": _masked_json(detail.outcome) if task.outcome is not None else "",
        "can_reveal": reveal.may_reveal(request.user, task),
        "revealable": sorted(
            {*reveal.masked_names(task.task_type, task.input), *reveal.outcome_masked_names(task)}
        ),
        "fork_form": fork_form,
        "fork_origin": forks.origin(task),
        "rerun_of": detail.rerun_of,
        "reruns": detail.reruns,
        "compensations": [
            (offer, CompensateForm(initial={"action": offer.action.idempotency_key}, auto_id=f"%s-undo-{n}"))
            for n, offer in enumerate(offers)
        ],
        "may_compensate": operate,
        "compensates": detail.compensates,
        "parent": detail.parent,
        "children": detail.children,
        "children_cap": CHILDREN_SHOWN,
        "cancel_requests": detail.cancel_requests,
        "actions": detail.actions,
        "actions_cap": ACTIONS_SHOWN,
        "approvals": detail.approvals,
        "agent_turns": detail.agent_turns,
        "a2a": read_task_a2a(task),  # its A2A caller and push deliveries (one query)
        "turns_cap": TURNS_SHOWN,
        "takeovers": detail.takeovers,
        "trace_links": _trace_links(task, latest),
        **checkpoint_context,
        # The timeline asks for takeovers only when the task had any.
        **_timeline(task, request.GET, taken_over=bool(detail.takeovers)),
    }


def _trace_links(task: Task, latest: TransitionEvent | None) -> list[tuple[str, str]]:
    """(label, URL) of the task's traces in the tracing UI, when ``TRACE_URL_TEMPLATE`` names one:
    the trace that created it (its first worker run continues it) and the latest transition's."""
    template = settings.TRACE_URL_TEMPLATE
    if not template:
        return []
    events = TransitionEvent.objects.filter(task=task, state_version=1).values_list("trace_id", flat=True)
    created = events.first() or ""
    links: dict[str, str] = {}  # trace id -> label: a trace shown once, under its first label
    for label, trace_id in (("created", created), ("latest transition", latest.trace_id if latest else "")):
        if trace_id:
            links.setdefault(trace_id, label)
    return [(label, template.replace("{trace_id}", trace_id)) for trace_id, label in links.items()]


def _masked_json(value: Any) -> str:
    # ASCII-escaped as before (an invisible control stays visible as \\uXXXX); only the mask's
    # bullets are written as themselves.
    return json.dumps(value, indent=2, sort_keys=True).replace("\\u2022", "•")


def _operable(request: HttpRequest, task_id: UUID) -> Task:
    task = get_task_for_user(request.user, task_id)
    if not can_operate(request.user, task):
        raise PermissionDenied
    return task


def _conflict(exc: StaleVersion) -> str:
    return (
        f"This task changed since you opened it (it is now {exc.state}, version {exc.state_version}). "
        "Review it and try again: your text is kept below."
    )


def _page(task: Task) -> str:
    return reverse("console:task", kwargs={"task_id": task.id})


def _kept(request: HttpRequest, task: Task, form: str) -> Callable[[], None]:
    """Keeps what the operator typed in ``form`` (``_keep_draft``) when the post is refused."""
    return functools.partial(_keep_draft, request, task, form, request.POST)


STALE = Refusal(StaleVersion, _conflict)


def _chain_refused(request: HttpRequest, task: Task, form: str) -> HttpResponse | None:
    """Back to the page, nothing changed, when the task's chain is broken and the post does not
    confirm it (``console.chain_guard``); None when the post may go on."""
    said = chain_guard.refusal(task, request.POST)
    if said is None:
        return None
    _keep_draft(request, task, form, request.POST)
    messages.error(request, said)
    return redirect(_page(task))


@login_required
@require_POST
def task_control(request: HttpRequest, task_id: UUID, control: str) -> HttpResponse:
    if control not in controls.CONTROLS:
        raise Http404("No such control")
    task = _operable(request, task_id)
    if stopped := _chain_refused(request, task, control):
        return stopped
    form = ControlForm(request.POST, control=control)

    def problem() -> str:
        stale = form.cleaned_data.get("expected_version") not in (None, task.state_version)
        if set(form.errors) == {"confirm"} and stale:
            # Confirming a page that is out of date would confirm the wrong thing: say so first.
            return _conflict(StaleVersion("stale page", state=task.state, state_version=task.state_version))
        return form.problem()

    def act(data: dict[str, Any]) -> Done:
        given = {k: v for k, v in data.items() if k != "confirm" and v not in ("", None)}
        roles = selectors.roles_in(request.user, task)
        result = controls.task_control(task, control, user=request.user, roles=roles, **given)
        note = f" ({result.note})" if result.note else ""
        if result.applied:
            label = controls.label(control).capitalize()
            return Done(f"{label} applied; the task is now {result.task.state}.{note}")
        return Done(f"Nothing changed: the task is {result.task.state}.{note}", messages.INFO)

    unreadable = Refusal(
        CheckpointUnreadable,
        lambda exc: (
            f"Nothing changed: the task's checkpoint still cannot be read ({exc.reason}: {exc.detail})."
        ),
        keep=False,
    )
    refusals = (STALE, Refusal(TransitionNotAllowed, lambda exc: f"Not possible: {exc}"), unreadable)
    return form_post(
        request,
        form,
        act,
        back=_page(task),
        refusals=refusals,
        keep=_kept(request, task, control),
        problem=problem,
    )


@login_required
@require_POST
def task_answer(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Answer a task in ``waiting_input`` as an operator (``tasks.services.task_provide_input``)."""
    task = _operable(request, task_id)
    if stopped := _chain_refused(request, task, "answer"):
        return stopped

    def act(data: dict[str, Any]) -> Done:
        delivery = services.task_provide_input(
            task,
            expected_version=data["expected_version"],
            answer=data["answer"],
            actor=Actor.user(request.user, ActorKind.OPERATOR),
        )
        if delivery.applied:
            return Done(f"Answer recorded; the task is now {delivery.task.state}.")
        return Done(f"Nothing changed: {delivery.note}.", messages.INFO)

    refusals = (
        STALE,
        Refusal((TransitionNotAllowed, CheckpointUnreadable), lambda exc: f"Not possible: {exc}"),
    )
    return form_post(
        request,
        AnswerForm(request.POST),
        act,
        back=_page(task),
        refusals=refusals,
        keep=_kept(request, task, "answer"),
    )


@login_required
@require_POST
def task_rerun(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Start a new task that reruns a failed, expired or canceled one (``tasks.services.task_rerun``)."""
    task = _operable(request, task_id)
    if stopped := _chain_refused(request, task, "rerun"):
        return stopped

    def act(data: dict[str, Any]) -> Done:
        rerun, created = services.task_rerun(
            task,
            actor=Actor.user(request.user, ActorKind.OPERATOR),
            reason=data["reason"],
            idempotency_key=data["idempotency_key"] or None,
        )
        if created:
            return Done(f"Rerun started: this task reruns {task.id}.", to=_page(rerun))
        return Done("This rerun was already started (the form was sent twice).", messages.INFO, _page(rerun))

    refused = (TransitionNotAllowed, services.InvalidTaskInput, services.IdempotencyConflict)
    return form_post(
        request,
        RerunForm(request.POST),
        act,
        back=_page(task),
        refusals=(Refusal(refused, lambda exc: f"Not rerun: {exc}"),),
        keep=_kept(request, task, "rerun"),
    )


def _fork_editable(task: Task, shown_input: Any) -> dict[str, Any]:
    """The input fields a fork of ``task`` may change, each with the value it has (a sensitive one
    blank: it is never written into the page)."""
    sensitive = (
        registry.sensitive_fields(task.task_type) if task.task_type in registry.names() else frozenset()
    )
    given = shown_input if isinstance(shown_input, dict) else {}
    return {
        name: "" if name in sensitive else given.get(name, "")
        for name in sorted(forks.editable_fields(task.task_type))
    }


@login_required
@require_POST
def task_fork(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Resume an ended task from one of its checkpoint versions as a new task (``tasks.forks``)."""
    task = _operable(request, task_id)
    if stopped := _chain_refused(request, task, "fork"):
        return stopped
    form = ForkForm(request.POST, editable=_fork_editable(task, reveal.masked_input(task)))
    version = _version(request.POST.get("version"))
    back = f"{_page(task)}?checkpoint={version}#checkpoint" if version else _page(task)
    roles = selectors.roles_in(request.user, task)
    kind = ActorKind.OPERATOR if Role.OPERATOR in roles else ActorKind.ADMIN

    def act(data: dict[str, Any]) -> Done:
        fork, created = forks.task_fork(
            task,
            version=data["version"],
            actor=Actor.user(request.user, kind),
            reason=data["reason"],
            input_changes=form.input_changes(),
            idempotency_key=data["idempotency_key"] or None,
        )
        if not created:
            return Done(
                "This fork was already started (the form was sent twice).", messages.INFO, _page(fork)
            )
        return Done(
            f"Resumed from checkpoint v{data['version']} of task {task.id} as this new task: "
            "it asks every approval again.",
            to=_page(fork),
        )

    def unfit(exc: services.InvalidTaskInput) -> str:
        said = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in exc.errors.items())
        return f"No task started: the input does not fit the task type ({said})."

    refusals = (
        Refusal(forks.ForkRefused, lambda exc: f"No task started: {exc}."),
        Refusal(
            CheckpointUnreadable,
            lambda exc: f"No task started: this checkpoint fails verification ({exc.reason}: {exc.detail}).",
            keep=False,
        ),
        Refusal(services.InvalidTaskInput, unfit),
        Refusal(
            (services.IdempotencyConflict, TransitionNotAllowed, StaleVersion),
            lambda exc: f"No task started: {exc}.",
        ),
    )
    return form_post(request, form, act, back=back, refusals=refusals, keep=_kept(request, task, "fork"))


@login_required
@require_POST
def task_compensate(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Undo an effect a canceled task left done, as a compensation run (``tasks.compensation``)."""
    task = _operable(request, task_id)
    if stopped := _chain_refused(request, task, "compensate"):
        return stopped

    def act(data: dict[str, Any]) -> Done:
        run, created = compensation.start(task, data["action"], user=request.user, reason=data["reason"])
        if created:
            return Done(f"Compensation started: this task undoes {data['action']}.", to=_page(run))
        return Done("This effect's compensation was already started: here it is.", messages.INFO, _page(run))

    refused = (compensation.NotCompensable, services.InvalidTaskInput)
    refusals = (Refusal(refused, lambda exc: f"Nothing was started: {exc}"),)
    return form_post(request, CompensateForm(request.POST), act, back=_page(task), refusals=refusals)


@login_required
@require_POST
def task_reveal(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Show one masked field in clear (``protection.reveal.reveal_field``: operators and admins, recorded)."""
    task = get_task_for_user(request.user, task_id)
    if not reveal.may_reveal(request.user, task):
        raise PermissionDenied
    form = RevealForm(request.POST)
    if not form.is_valid():
        messages.error(request, form.problem())
        return redirect("console:task", task_id=task.id)
    try:
        found = reveal.reveal_field(task, user=request.user, request=request, **form.cleaned_data)
    except reveal.RevealRefused as exc:
        messages.error(request, f"Nothing revealed: {exc}")
        return redirect("console:task", task_id=task.id)
    except CheckpointUnreadable as exc:
        messages.error(
            request, f"Nothing revealed: the checkpoint cannot be read ({exc.reason}: {exc.detail})."
        )
        return redirect("console:task", task_id=task.id)
    response = render(request, "console/task/revealed.html", {"task": task, "revealed": found})
    add_never_cache_headers(response)  # the clear value is never kept by the browser or a proxy
    return response
