"""An "everything matching" bulk operation stores the queue's filters and nothing else.

Before, the selection was the confirmation POST minus a list of known non-filters, so the CSRF token
it carries was stored in ``BulkOperation.selection`` and shown on the operation's report to every
operator and auditor of the tenant.
"""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps
from django.test import Client

from runtime.models import BulkOperation
from tests.console.test_quarantine import quarantined

pytestmark = pytest.mark.django_db


def test_the_csrf_token_of_the_confirmation_is_neither_stored_nor_shown(operator, auditor, acme):
    quarantined(acme, "step_error")
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    query = {"state": "quarantined", "control": "release", "target": "all", "sort": "age", "q": ""}
    preview = client.get("/console/bulk/new/", query).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', preview).group(1)
    confirmed = client.post(
        "/console/bulk/new/", {**query, "reason": "checked", "csrfmiddlewaretoken": token}
    )
    assert confirmed.status_code == 302
    operation = BulkOperation.objects.get()
    assert operation.selection == {"query": "state=quarantined"}
    report = Client()
    report.force_login(auditor)
    page = report.get(confirmed["Location"]).content.decode()
    assert "checked" in page and token not in page  # the report, without the operator's token


def test_the_selections_stored_before_are_cleaned(operator):
    stored = BulkOperation.objects.create(
        created_by_name="op", created_at="2026-11-30T10:00:00Z", control="release", reason="r", total=1,
        selection={"query": "state=quarantined&csrfmiddlewaretoken=s3cr3t&held=step_error&target=all"},
    )  # fmt: skip
    ticked = BulkOperation.objects.create(
        created_by_name="op", created_at="2026-11-30T10:00:00Z", control="release", reason="r", total=1,
        selection={"ids": ["0190d6e0-0000-7000-8000-000000000000"]},
    )  # fmt: skip
    migration = importlib.import_module("runtime.migrations.0009_bulk_selection_filters_only")
    migration.filters_only(apps, None)
    stored.refresh_from_db()
    ticked.refresh_from_db()
    assert stored.selection == {"query": "state=quarantined&held=step_error"}
    assert ticked.selection == {"ids": ["0190d6e0-0000-7000-8000-000000000000"]}


def test_everything_matching_an_outcome_reason_filter_is_what_the_bulk_acts_on(operator, acme):
    """The queue's ``reason`` filter shares its name with the operator's reason: before, the preview
    took the filter's value as the operator's reason and dropped the filter, so the bulk acted on
    every quarantined task, not the ones the queue showed."""
    shown = quarantined(acme, "step_error")
    other = quarantined(acme, "checkpoint_corrupt")
    client = Client()
    client.force_login(operator)
    queue_page = client.get("/console/", {"state": "quarantined", "reason": "step_error"}).content.decode()
    form = queue_page[queue_page.index('<form id="bulk"') :]
    form = form[: form.index("</form>")]
    carried = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)
    assert ("filter_reason", "step_error") in carried
    query = {**dict(carried), "control": "release", "target": "all"}
    preview = client.get("/console/bulk/new/", query)
    assert preview.context["count"] == 1 and preview.context["form"]["reason"].value() in (None, "")
    client.post("/console/bulk/new/", {**query, "reason": "checked"})
    assert BulkOperation.objects.get().selection == {"query": "state=quarantined&reason=step_error"}
    shown.refresh_from_db()
    other.refresh_from_db()
    assert (shown.state, other.state) == ("resume_validation", "quarantined")
