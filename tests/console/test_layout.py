"""The shared layout: skip link, current page in the nav, the theme toggle, and the error pages."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory
from django.views.defaults import server_error

from console.errors import conflict
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_every_page_starts_with_a_skip_link_to_the_content(operator):
    page = client_for(operator).get("/console/").content.decode()
    assert page.index('class="skip-link" href="#main"') < page.index("<header")
    assert '<main id="main"' in page


def test_the_nav_marks_the_current_page_and_its_section(operator, acme):
    client = client_for(operator)
    assert (
        '<a href="/console/quarantine/" aria-current="page">'
        in client.get("/console/quarantine/").content.decode()
    )
    task = make_task(acme)
    page = client.get(f"/console/tasks/{task.id}/").content.decode()
    assert '<a href="/console/" aria-current="true">' in page


def test_the_theme_follows_the_browser_until_the_toggle_chooses_one(operator):
    client = client_for(operator)
    assert "data-theme" not in client.get("/console/").content.decode()[:200]
    response = client.post("/console/theme/", {"theme": "dark", "next": "/console/quarantine/"})
    assert response.status_code == 302 and response["Location"] == "/console/quarantine/"
    assert '<html lang="en" data-theme="dark">' in client.get("/console/").content.decode()
    client.post("/console/theme/", {"theme": "auto", "next": "/console/"})
    assert "data-theme" not in client.get("/console/").content.decode()[:200]


def test_the_theme_toggle_only_goes_back_to_this_site(operator):
    response = client_for(operator).post(
        "/console/theme/", {"theme": "light", "next": "https://evil.example/"}
    )
    assert response["Location"] == "/console/"


def test_a_forged_theme_cookie_is_ignored(operator):
    client = client_for(operator)
    client.cookies["theme"] = '"><script>'
    assert "data-theme" not in client.get("/console/").content.decode()[:200]


def test_not_found_and_forbidden_pages_keep_the_console_layout(operator, auditor, outsider, acme):
    task = make_task(acme)
    missing = client_for(outsider).get(f"/console/tasks/{task.id}/")
    assert missing.status_code == 404
    assert "Nothing here" in missing.content.decode() and 'class="skip-link"' in missing.content.decode()
    denied = client_for(auditor).post(
        f"/console/tasks/{task.id}/cancel/", {"expected_version": 1, "reason": "x"}
    )
    assert denied.status_code == 403 and "Your role does not allow this" in denied.content.decode()


def test_the_server_error_page_renders_without_a_request_context():
    response = server_error(RequestFactory().get("/console/"))
    assert response.status_code == 500 and "Something went wrong on our side" in response.content.decode()


def test_the_conflict_page_says_what_changed_and_links_back(operator):
    request = RequestFactory().post("/console/")
    request.user = operator
    response = conflict(
        request, detail="It is now canceled, version 4.", back_url="/console/x/", back_label="Task"
    )
    page = response.content.decode()
    assert response.status_code == 409
    assert "It is now canceled, version 4." in page and '<a href="/console/x/">Task</a>' in page
