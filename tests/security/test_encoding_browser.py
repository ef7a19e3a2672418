"""Invisible and direction-changing characters are shown on every console page (issue 20, item 6).

Reproduced before: a task whose objective, event reason, alert note and bulk reason carried a
right-to-left override (U+202E), isolates (U+2066–U+2069), a zero-width space and a byte order
mark reached the browser raw on the audit history, audit search, alerts and bulk report pages. Here
chromium crawls every console page it can reach by following links from the queue (and the pages
that hold the planted text), and reads back the DOM the browser built: no page holds one of those
characters, and every page that shows the text shows its markers.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import Page

from runtime import alerts, bulk
from runtime.models import Alert
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tenancy.models import AccessEvent, Role
from tenancy.services import record_access, saved_view_create
from tests.conftest import make_task, make_user, progress
from tests.console.test_approvals import ask

pytestmark = pytest.mark.django_db(transaction=True)

HIDDEN = {"\u202e": "U+202E", "\u2066": "U+2066", "\u2069": "U+2069", "\u200b": "U+200B", "\ufeff": "U+FEFF"}
TEXT = "Refund \u202e4321\u2069 to \u2066visa\u2069 \u200border\ufeff"
PAGES_MAX = 120


def plant(tenant) -> dict[str, str]:
    """``TEXT`` in every kind of text a person or an agent supplies; the pages that show each."""
    user = make_user("acme-everything", tenant, Role.OPERATOR, Role.APPROVER, Role.AUDITOR, Role.ADMIN)
    task = make_task(tenant, objective=TEXT)
    advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("s1"), reason=TEXT)
    ask(make_task(tenant, objective=TEXT))
    held = make_task(tenant, objective=TEXT)
    advance(held.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason=TEXT, reason_code="step_error")
    stuck = make_task(tenant, objective=TEXT)
    Task.objects.filter(pk=stuck.pk).update(state_entered_at=task.created_at.replace(year=2000))
    alerts.scan()
    alerts.acknowledge(Alert.objects.get(task=stuck), user=user, note=TEXT)
    operation = bulk.bulk_create(
        user=user, control="cancel", reason=TEXT, tasks=Task.objects.filter(pk=stuck.pk), selection={}
    )
    saved_view_create(user, name=TEXT, query="state=ready", allowed_keys=("state",))
    record_access(AccessEvent.Kind.FORBIDDEN, user=user, tenant=tenant, detail=TEXT)
    return {
        "queue": "/console/",
        "task": f"/console/tasks/{task.id}/",
        "audit history": f"/console/audit/tasks/{task.id}/",
        "audit search": "/console/audit/",
        "alerts": "/console/alerts/",
        "bulk report": f"/console/bulk/{operation.id}/",
        "bulk list": "/console/bulk/",
        "approvals": "/console/approvals/",
        "quarantine": "/console/quarantine/",
        "access log": "/console/access/",
        "bulk preview": f"/console/bulk/new/?control=quarantine&target=selected&ids={task.id}",
        "landing": "/console/start/",
    }


def signed_in(page: Page, base: str, username: str) -> None:
    """A session made as the console tests make theirs (force_login), handed to the browser."""
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": base}])


def links(page: Page) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "anchors => anchors.map(a => a.getAttribute('href'))")
    return [
        href
        for href in hrefs
        if href.startswith("/console/") and not href.endswith((".csv", ".json")) and "export" not in href
    ]


def test_every_console_page_shows_invisible_characters_as_markers(page: Page, live_server, acme):
    showing = plant(acme)
    signed_in(page, live_server.url, "acme-everything")
    todo, seen, raw, marked = deque(showing.values()), set(), {}, set()
    while todo and len(seen) < PAGES_MAX:
        path = todo.popleft()
        if urlsplit(path).path in seen:
            continue
        seen.add(urlsplit(path).path)
        answer = page.goto(live_server.url + path)
        assert answer is not None and answer.status == 200, (path, answer and answer.status)
        dom = page.content()  # what the browser built, attributes included
        if found := [code for char, code in HIDDEN.items() if char in dom]:
            raw[path] = found
        if all(f"⟨{code}⟩" in dom for code in HIDDEN.values()):
            marked.add(path)
        todo.extend(links(page))
    assert len(seen) >= 15, sorted(seen)  # the crawl reached past the planted pages
    assert raw == {}
    assert [name for name, path in showing.items() if path not in marked] == []


def test_a_saved_views_delete_confirmation_shows_invisible_characters_as_markers(
    page: Page, live_server, acme
):
    plant(acme)
    signed_in(page, live_server.url, "acme-everything")
    page.goto(f"{live_server.url}/console/")
    page.locator("form[action*='/views/'] button").first.click()
    dom = page.content()
    assert "Delete" in dom and "⟨U+202E⟩" in dom
    assert not [char for char in HIDDEN if char in dom]
