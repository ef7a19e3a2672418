"""A scan that raises or clears many alerts leaves the alerts table analyzed: the next page plans right."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runtime import alerts
from runtime.models import Alert
from tasks.models import Task
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def reltuples() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'runtime_alert'::regclass")
        return float(cursor.fetchone()[0])


def test_a_large_scan_analyzes_the_alerts_table_and_a_small_one_does_not(acme, monkeypatch):
    tasks = [make_task(acme) for _ in range(3)]
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(
        state_entered_at=timezone.now() - timedelta(hours=3)
    )
    assert reltuples() < 0  # a new table: never analyzed
    monkeypatch.setattr(alerts, "ANALYZE_AFTER", 3)
    assert alerts.scan().as_dict()["raised"] == 3  # not more than ANALYZE_AFTER: left to autovacuum
    assert reltuples() < 0
    Alert.objects.all().delete()
    monkeypatch.setattr(alerts, "ANALYZE_AFTER", 2)
    assert alerts.scan().as_dict()["raised"] == 3
    assert reltuples() == 3
