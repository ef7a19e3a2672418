"""manage.py run_demo: the whole product in one command, for a laptop.

Starts the web server (console, API and sandbox systems), a Celery worker for
this region and Celery beat (the sweep), over the configured broker — the
embedded filesystem broker when ``CELERY_BROKER_URL`` is unset. Stops them all
on Ctrl-C or SIGTERM. A child that dies is started again (``demo.supervise``); one that keeps
dying stops the demo with an error.

It is a development run of a demo and says so: it refuses to start unless the
environment asks for one (``DEBUG=1`` and ``SANDBOX_ENABLED=1``, as ``make demo``
sets them with a demo ``SECRET_KEY`` and ``SANDBOX_TOKEN``); the children it
starts inherit that environment.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.supervise import supervise


class Command(BaseCommand):
    help = "Serve the console and run a worker and the sweep (Ctrl-C stops all)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args: Any, addrport: str, concurrency: int, **options: Any) -> None:
        if not (settings.DEBUG and settings.SANDBOX_ENABLED):
            raise CommandError(
                "run_demo serves the demo with its sandbox: run it with DEBUG=1 and SANDBOX_ENABLED=1 "
                "(`make demo` sets them), never with production settings."
            )
        host, _, port = addrport.rpartition(":")
        env = {
            # The demo's thresholds: an outcome in doubt for a minute is escalated, and a task
            # nobody has leased for a minute shows as stuck (production: 10 and 2 minutes).
            "UNKNOWN_OUTCOME_ESCALATE_AFTER": "60",
            "STUCK_AFTER": "60",
            **os.environ,
            "SANDBOX_BASE_URL": os.environ.get(
                "SANDBOX_BASE_URL",
                f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}/sandbox",
            ),
        }
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        commands = {
            "web": [sys.executable, "manage.py", "runserver", "--noreload", addrport],
            "worker": [
                *celery,
                "worker",
                "-Q",
                f"region.{settings.WORKER_REGION},{settings.AUDIT_QUEUE}",  # one host: the anchors too
                "-c",
                str(concurrency),
                "--loglevel=INFO",
                "-n",
                f"worker-{settings.WORKER_REGION}@%h",
            ],
            "beat": [*celery, "beat", "--loglevel=INFO", "-s", settings.CELERY_BEAT_SCHEDULE_FILENAME],
        }
        self.stdout.write(f"console on http://{addrport}/console/  (Ctrl-C stops web, worker and beat)")
        if supervise(commands, env, lambda line: self.stderr.write(f"run_demo: {line}")):
            raise CommandError("a process of the demo keeps exiting; its log above says why")
