"""A pytest plugin: after every database test, every task it produced must pass ``verify_audit``'s check.

``pytest -p tests.audit.paths_plugin tests/approvals tests/lifecycle …`` runs those suites as
they are and fails any test that leaves a task whose chain is not a valid, keyed path through the
transition table (``tasks.audit_paths.verify_chain``): the proof that the check accepts every
path the workflows really produce. Not loaded by default (it adds a read per task per test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    uses_db = item.get_closest_marker("django_db") or {"db", "transactional_db"} & set(
        getattr(item, "fixturenames", ())
    )
    if outcome.excinfo is not None or not uses_db:
        return
    from audit.verify import keyed_since  # Django is set up only once the run started
    from tasks.audit_paths import verify_chain
    from tasks.models import Task

    try:
        keyed = keyed_since()
        broken = [str(link) for task in Task.objects.only("id") if (link := verify_chain(task, keyed=keyed))]
    except Exception as exc:  # a test that closed its connection or dropped its database: nothing to read
        broken = [] if "database" in str(exc).lower() or "connection" in str(exc).lower() else [repr(exc)]
    if broken:
        outcome.force_exception(AssertionError("invalid audit paths:\n" + "\n".join(broken)))
