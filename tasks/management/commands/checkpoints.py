"""manage.py checkpoints {schema,check,show,resume}

- ``schema``: print the JSON Schema of the current checkpoint contract.
- ``check [--quarantine]``: verify and decode the newest checkpoint of every
  non-terminal task with the running code, as a worker loads it (size, codec,
  digest against its audit event, schema column); list what it cannot read
  with the reason (e.g. ``checkpoint_digest_mismatch``), and quarantine those
  tasks with ``--quarantine``. Exit 1 when any is unreadable.
- ``show TASK_ID``: print the decoded (migrated) newest checkpoint as JSON.
- ``resume TASK_ID``: load the task's resume point as a worker would — a
  checkpoint it cannot read quarantines the task — and print it as JSON.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

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
        for name in ("show", "resume"):
            sub.add_parser(name).add_argument("task_id")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "schema":
            self.stdout.write(json.dumps(checkpoints.json_schema(), indent=2, sort_keys=True))
        elif action == "check":
            self._check(options["quarantine"])
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

    def _check(self, quarantine: bool) -> None:
        bad = checked = 0
        for task in Task.objects.filter(state__in=NON_TERMINAL).order_by("id").iterator(chunk_size=500):
            checked += 1
            try:
                services.latest_checkpoint(task)
            except checkpoints.CheckpointUnreadable as exc:
                bad += 1
                self.stdout.write(f"UNREADABLE {task.id} {exc.reason}: {exc.detail}")
                if quarantine:
                    services.task_resume_point(task.id, actor=Actor.system("checkpoints-check"))
        self.stdout.write(
            f"{checked} checked, {bad} unreadable (running schema {checkpoints.CURRENT_SCHEMA})"
        )
        if bad:
            raise CommandError(f"{bad} checkpoints cannot be read by this code")
