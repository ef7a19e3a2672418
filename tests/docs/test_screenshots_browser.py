"""The docs' pictures of the console, taken from the demo world in the real browser.

One tenant of `seed_demo` is seeded (its standing cases, through real transitions); each picture in
`tests/docs/screenshots.SHOTS` is taken as its persona, at a fixed 1280×800 viewport, in the light and
the dark theme, and written over `docs/images/<name>-<theme>.png`. A changed page changes its
picture on the next run; commit the files with the change. Ids and times differ from run to run, so
the pixels do too: the set of files is what stays fixed (`tests/docs/test_images.py`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from approvals.models import ApprovalRequest, ApprovalStatus
from demo.cases import CASES
from demo.cases.seeding import WORKER_ID, Seeding
from demo.management.commands.seed_demo import seed_policies, seed_sandbox, seed_users
from runtime import rollups
from tasks.models import Task
from tasks.transitions import Actor
from tenancy.models import Tenant
from tests.docs.screenshots import IMAGES, SHOTS, THEMES, VIEWPORT, expected_files, file_name
from tests.second_factor import browser_log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def seed_acme() -> dict[str, Task]:
    """The demo tenant `acme` as `seed_demo` leaves it (its users' password is "pw"), by case key."""
    seed_sandbox()
    seed_policies()
    tenant, _ = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme Corporation"})
    seed_users(tenant, "pw")
    User = get_user_model()
    seeding = Seeding(
        tenant=tenant,
        operator=User.objects.get(username="acme-operator"),
        approver=User.objects.get(username="acme-approver2"),
        worker=Actor.worker(WORKER_ID),
        now=timezone.now(),
    )
    for case in CASES:
        case(seeding)
    tasks = Task.objects.filter(tenant=tenant, idempotency_key__startswith="demo-")
    return {task.idempotency_key.removeprefix("demo-"): task for task in tasks}


def paths(tasks: dict[str, Task]) -> dict[str, tuple[str, str]]:
    """Each picture's page: (path, a selector that must be on screen when it is taken)."""
    first = ApprovalRequest.objects.get(task=tasks["approval"])
    repeat = ApprovalRequest.objects.get(task=tasks["reapproval"], status=ApprovalStatus.PENDING)
    return {
        "queue": ("/console/", "main table.grid"),
        "task": (f"/console/tasks/{tasks['external'].id}/", "section.why"),
        "approval": (f"/console/approvals/{first.id}/", "main h1"),
        "repeat": (f"/console/approvals/{repeat.id}/", "#repeat"),
        "quarantine": ("/console/quarantine/", "main h1"),
        "history": (f"/console/audit/tasks/{tasks['reapproval'].id}/", "main h1"),
        "dashboard": ("/console/dashboard/", "main h1"),
    }


def compress(path: Path) -> None:
    """Down to a 256-colour palette when Pillow is installed (a console page loses nothing)."""
    try:
        image_module = importlib.import_module("PIL.Image")
    except ImportError:
        return
    with image_module.open(path) as image:
        small = image.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


def take(page: Page, path: str, shown: str, target: Path) -> None:
    page.goto(path)
    element = page.locator(shown).first
    expect(element).to_be_visible()
    element.scroll_into_view_if_needed()
    page.screenshot(path=target, animations="disabled", caret="hide")
    compress(target)


def test_the_docs_pictures_are_taken_from_the_console(browser: Browser, live_server, settings):
    settings.DEBUG = True  # the demo's cases, as `make demo` runs them
    pages = paths(seed_acme())
    rollups.refresh()  # the beat's recount: the dashboard shows the stored reading
    IMAGES.mkdir(exist_ok=True)
    for persona in dict.fromkeys(shot.persona for shot in SHOTS):
        context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
        page = context.new_page()
        browser_log_in(page, live_server.url, persona)
        for shot in (shot for shot in SHOTS if shot.persona == persona):
            for theme in THEMES:
                page.emulate_media(color_scheme=theme)  # the console's theme follows the browser's
                take(page, *pages[shot.page], IMAGES / file_name(shot, theme))
        context.close()
    assert {path.name for path in IMAGES.iterdir()} == expected_files()
    for name in expected_files():
        assert (IMAGES / name).read_bytes().startswith(b"\x89PNG"), name
