"""Stored "everything matching" selections keep only the queue's filters.

Before, the selection was the request's parameters minus a list of known non-filters, so the CSRF
token a confirmation POST carries was stored with it and shown on the operation's report to every
operator and auditor of the tenant. The filter names are written out here as they were when this
migration was written: a migration must not change meaning when the code does.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from django.db import migrations

FILTERS = ("q", "state", "task_type", "tenant", "region", "escalated", "stuck", "reason", "age", "held")


def filters_only(apps, schema_editor):
    operations = apps.get_model("runtime", "BulkOperation")
    for operation in operations.objects.filter(selection__has_key="query").only("id", "selection").iterator():
        query = operation.selection.get("query") or ""
        kept = urlencode([(key, value) for key, value in parse_qsl(query) if key in FILTERS and value])
        if kept != query:
            operations.objects.filter(pk=operation.pk).update(selection={**operation.selection, "query": kept})


class Migration(migrations.Migration):
    dependencies = [("runtime", "0008_agent_session_item")]

    operations = [migrations.RunPython(filters_only, migrations.RunPython.noop, elidable=True)]
