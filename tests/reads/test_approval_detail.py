"""The approval request: one read for its console page and ``GET /api/approvals/{id}/``."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.selectors import get_visible_request
from reads.approval_detail import read_approval_detail
from tests.conftest import api_client_for, make_task
from tests.console.test_approvals import ask, client_for, many_pending

pytestmark = pytest.mark.django_db


def test_reading_a_request_costs_the_same_however_many_others_are_pending(acme, approver, operator):
    costs = []
    for pending in (5, 120):
        many_pending(acme, pending)
        request = get_visible_request(approver, ask(make_task(acme, owner=operator)).pk)
        with CaptureQueriesContext(connection) as captured:
            detail = read_approval_detail(request, viewer=approver)
        costs.append(len(captured))
        assert detail.live and detail.separation.earlier == []
    assert costs[0] == costs[1] <= 4, costs


def test_the_request_page_and_the_api_show_the_same_separation(acme, approver, operator):
    request = ask(make_task(acme, owner=operator))
    barred = read_approval_detail(get_visible_request(approver, request.pk)).separation.may_not_decide
    assert barred  # whoever started the task may not decide it
    api = api_client_for(approver).get(f"/api/approvals/{request.pk}/").json()
    assert [(row["actor"], row["why"]) for row in api["may_not_decide"]] == [(b.actor, b.why) for b in barred]
    page = client_for(approver).get(f"/console/approvals/{request.pk}/")
    assert page.context["separation"].may_not_decide == barred
