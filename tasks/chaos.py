"""Crash-test hook: hold a worker still at a chosen point.

With ``DURABLE_PAUSE_AFTER`` set, a worker reaching a matching point writes
what it was doing to ``DURABLE_PAUSE_FILE`` and sleeps, so a test can
``SIGKILL`` it at exactly that moment. Points:

- ``<state>`` or ``step:<name>``: right after a transition into that state, or
  whose checkpoint names that step, committed;
- ``dispatched:<connector>``: right after the connector answered, before the
  ledger recorded the answer;
- ``reconciled``: right after the reconciler moved a task on.
Unset (always, outside crash tests) it does nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _pause_if(names: set[str], detail: str) -> None:
    wanted = os.environ.get("DURABLE_PAUSE_AFTER")
    if not wanted or wanted not in names:
        return
    Path(os.environ.get("DURABLE_PAUSE_FILE", "/tmp/durable-pause")).write_text(detail + "\n")
    time.sleep(3600)


def after_commit(task, step: str | None) -> None:
    _pause_if({task.state, f"step:{step}"}, f"{task.id} {task.state_version}")


def after_reconcile(task) -> None:
    _pause_if({"reconciled"}, f"{task.id} {task.state_version}")


def after_send(action) -> None:
    _pause_if({f"dispatched:{action.connector}"}, f"{action.task_id} {action.idempotency_key}")
