"""``runtime.compiled.rows``: a queryset compiled once per connection gives, for any task, exactly what
the queryset gives, in one statement."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runtime import compiled
from runtime.models import AgentTurn
from runtime.sdk import step
from tasks.models import Task
from tests.sdk.test_support_agent import run_until_still, sandbox, support_task  # noqa: F401  (a fixture)
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_agent_steps_read_is_the_querysets_for_every_task_in_one_statement(acme, sandbox):  # noqa: F811
    put_order("A-2", total="500.00")
    tasks = [run_until_still(support_task(acme)), run_until_still(support_task(acme, order_id="A-2"))]
    names = {row.step for row in AgentTurn.objects.all()}
    assert len(names) == 1 and all(t.actions.exists() for t in tasks)  # turns and ledger actions, both kinds
    (name,) = names
    for task in tasks + tasks:  # compiled on the first call, swapped in afterwards
        expected = sorted(map(tuple, step._records_query(task.pk, name)), key=repr)
        with CaptureQueriesContext(connection) as seen:
            got = compiled.rows("test_records", step._records_query, str(task.pk), name)
        assert sorted(got, key=repr) == expected and len(expected) > 2
        assert len(seen.captured_queries) == 1
    other = tasks[0].pk
    assert compiled.rows("test_records", step._records_query, other, "no-such-step") == [
        row for row in step._records_query(other, "no-such-step")
    ]  # the turns of another step: none, and the task's actions all the same


def test_an_argument_that_is_not_an_exact_parameter_is_refused(acme):
    def contains(task_id, text):
        return Task.objects.filter(pk=task_id, objective__contains=text).values_list("pk")

    with pytest.raises(ValueError, match="stand-in"):
        compiled.rows("test_contains", contains, "00000000-0000-0000-0000-000000000001", "x")
