"""Crash-test hook: hold a worker still at a chosen point.

With ``DURABLE_PAUSE_AFTER`` set, a worker reaching a matching point writes
what it was doing to ``DURABLE_PAUSE_FILE`` and sleeps, so a test can
``SIGKILL`` it at exactly that moment; with ``DURABLE_PAUSE_MODE=stop`` it
stops itself with ``SIGSTOP`` instead, so a test can let another worker take
its task over and then ``SIGCONT`` it, as a long GC pause or a frozen VM would. Points:

- ``<state>`` or ``step:<name>``: right after a transition into that state, or
  whose checkpoint names that step, committed;
- ``claiming:<connector>``: right before the fenced claim of a send;
- ``sending:<connector>``: after the claim, right before the last fence check and the send;
- ``dispatched:<connector>``: right after the connector answered, before the
  ledger recorded the answer;
- ``reconciled``: right after the reconciler moved a task on.
Unset (always, outside crash tests) it does nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from ledger.models import Action
from tasks.models import Task


def _pause_if(names: set[str], detail: str) -> None:
    wanted = os.environ.get("DURABLE_PAUSE_AFTER")
    if not wanted or wanted not in names:
        return
    Path(os.environ.get("DURABLE_PAUSE_FILE", "/tmp/durable-pause")).write_text(detail + "\n")
    if os.environ.get("DURABLE_PAUSE_MODE") == "stop":
        os.environ["DURABLE_PAUSE_AFTER"] = ""  # once: after SIGCONT the worker carries on
        # Sent to this thread, so this thread stops before its next instruction; sent to the
        # process, another thread could take the signal and this one run on past the point
        # (even through a database round trip) before the stop reached it.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return
    time.sleep(3600)


def after_commit(task: Task, step: str | None) -> None:
    _pause_if({task.state, f"step:{step}"}, f"{task.id} {task.state_version}")


def after_reconcile(task: Task) -> None:
    _pause_if({"reconciled"}, f"{task.id} {task.state_version}")


def before_claim(action: Action) -> None:
    _pause_if({f"claiming:{action.connector}"}, f"{action.task_id} {action.idempotency_key}")


def before_send(action: Action) -> None:
    _pause_if({f"sending:{action.connector}"}, f"{action.task_id} {action.idempotency_key}")


def after_send(action: Action) -> None:
    _pause_if({f"dispatched:{action.connector}"}, f"{action.task_id} {action.idempotency_key}")
