"""manage.py checkpoints {schema,check,show,resume}

- ``schema``: print the JSON Schema of the current checkpoint contract.
- ``check [--quarantine] [--strict]``: first what this code reads — its
  ``CURRENT_SCHEMA``, the ``READABLE`` versions, the migration chain — and how
  many non-terminal tasks have their newest checkpoint at each schema version
  (one aggregate query), marking the versions this code cannot read. Then
  verify and decode the newest checkpoint of every non-terminal task with the
  running code, as a worker loads it (size, codec, digest against its audit
  event, schema column); list what it cannot read with the reason (e.g.
  ``checkpoint_digest_mismatch``), and quarantine those tasks with
  ``--quarantine``. Exit 1 when any is unreadable. A checkpoint of a newer
  schema is listed (``NEWER``) but is not an error — in a mixed-version
  rollout a newer deployment's workers run those tasks, and ``--quarantine``
  leaves them alone — unless ``--strict``.
- ``show TASK_ID``: print the decoded (migrated) newest checkpoint as JSON.
- ``resume TASK_ID``: load the task's resume point as a worker would — a
  checkpoint it cannot read quarantines the task — and print it as JSON.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from tasks import checkpoints, services
from tasks.models import Task
from tasks.states import NON_TERMINAL
from tasks.transitions import Actor


class Command(BaseCommand):
    help = "Inspect, validate and resume from task checkpoints."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("schema")
        check = sub.add_parser("check")
        check.add_argument(
            "--quarantine", action="store_true", help="Quarantine tasks whose checkpoint is unreadable"
        )
        check.add_argument(
            "--strict",
            action="store_true",
            help="Also fail when a checkpoint is newer than this code reads (none expected: no rollout)",
        )
        for name in ("show", "resume"):
            sub.add_parser(name).add_argument("task_id")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "schema":
            self.stdout.write(json.dumps(checkpoints.json_schema(), indent=2, sort_keys=True))
        elif action == "check":
            self._versions()
            self._check(options["quarantine"], strict=options["strict"])
        elif action == "show":
            task = self._task(options["task_id"])
            try:
                document = services.latest_checkpoint(task)
            except checkpoints.CheckpointUnreadable as exc:
                raise CommandError(f"{exc.reason}: {exc.detail}") from None
            self.stdout.write(json.dumps(document.model_dump(mode="json"), sort_keys=True))
        elif action == "resume":
            point = services.task_resume_point(self._task(options["task_id"]).id, actor=Actor.system("cli"))
            self.stdout.write(
                json.dumps(
                    {
                        "task_id": str(point.task.id),
                        "state": point.task.state,
                        "state_version": point.task.state_version,
                        "state_reason": point.task.state_reason,
                        "checkpoint": point.checkpoint.model_dump(mode="json") if point.checkpoint else None,
                    },
                    sort_keys=True,
                )
            )

    def _task(self, task_id: str) -> Task:
        try:
            return Task.objects.get(pk=task_id)
        except (Task.DoesNotExist, ValueError, Exception) as exc:
            raise CommandError(f"no task {task_id}: {exc}") from None

    def _versions(self) -> None:
        """What this code reads, and where the non-terminal tasks' newest checkpoints stand (by the
        task row's ``checkpoint_schema``: one GROUP BY, whatever the number of tasks)."""
        current = checkpoints.CURRENT_SCHEMA
        self.stdout.write(f"this code: schema {current} (deployment {settings.DEPLOYMENT_ID})")
        self.stdout.write(f"readable: {', '.join(str(v) for v in sorted(checkpoints.READABLE))}")
        self.stdout.write(f"migrations: {checkpoints.migration_chain()}")
        counts = (
            Task.objects.filter(state__in=NON_TERMINAL)
            .values_list("checkpoint_schema")
            .annotate(tasks=Count("id"))
            .order_by("checkpoint_schema")
        )
        self.stdout.write("non-terminal tasks by newest checkpoint schema:")
        for version, tasks in counts:
            self.stdout.write(f"  schema {version}: {tasks} tasks — {_standing(version)}")

    def _check(self, quarantine: bool, *, strict: bool = False) -> None:
        bad = newer = checked = 0
        for task in Task.objects.filter(state__in=NON_TERMINAL).order_by("id").iterator(chunk_size=500):
            checked += 1
            try:
                services.latest_checkpoint(task)
            except checkpoints.CheckpointUnreadable as exc:
                if exc.reason == checkpoints.CheckpointUnreadable.SCHEMA_NEWER:
                    newer += 1  # a newer deployment's: its workers run it; quarantining it would be wrong
                    self.stdout.write(f"NEWER {task.id} {exc.reason}: {exc.detail}")
                    continue
                bad += 1
                self.stdout.write(f"UNREADABLE {task.id} {exc.reason}: {exc.detail}")
                if quarantine:
                    services.task_resume_point(task.id, actor=Actor.system("checkpoints-check"))
        self.stdout.write(
            f"{checked} checked, {bad} unreadable, {newer} newer than this code"
            f" (running schema {checkpoints.CURRENT_SCHEMA})"
        )
        if bad:
            raise CommandError(f"{bad} checkpoints cannot be read by this code")
        if newer and strict:
            raise CommandError(f"{newer} checkpoints were written by newer code (--strict)")


def _standing(version: int) -> str:
    """What this code does with a task whose newest checkpoint is at schema ``version``."""
    current = checkpoints.CURRENT_SCHEMA
    if version == current:
        return "current"
    if version in checkpoints.READABLE:
        return f"readable; migrated to {current} (and revalidated) when resumed"
    if version > current:
        return "newer than this code; workers of this deployment will not claim them"
    return "older than any migration; cannot be read (quarantined when resumed)"
