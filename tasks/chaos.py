"""Crash-test hook: hold a worker still right after a chosen commit.

With ``DURABLE_PAUSE_AFTER`` set (e.g. ``waiting_input`` or ``step:triage``),
a worker that has just committed a matching transition writes the task id to
``DURABLE_PAUSE_FILE`` and sleeps, so a test can ``SIGKILL`` it at exactly
that boundary. Unset (always, outside crash tests) it does nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tasks.models import Task


def after_commit(task: Task, step: str | None) -> None:
    wanted = os.environ.get("DURABLE_PAUSE_AFTER")
    if not wanted:
        return
    if wanted not in (task.state, f"step:{step}"):
        return
    marker = Path(os.environ.get("DURABLE_PAUSE_FILE", "/tmp/durable-pause"))
    marker.write_text(f"{task.id} {task.state_version}\n")
    time.sleep(3600)
