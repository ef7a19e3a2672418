"""``make prod-check`` in the default suite: the production layout started from ``deploy/`` as written
(Procfile, env.example, gunicorn.conf.py, the first-tenant commands), probed by IP, a task completed by its
workers, every process stopped by SIGTERM. The script is the test; this runs it against our server, its
database a copy of the migrated template (``--from-template``: the migrations ran once for the whole
suite; ``migrate`` still runs and must succeed). ``make prod-check`` migrates an empty database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="needs PostgreSQL")
def test_the_documented_production_layout_starts_serves_and_stops():
    done = subprocess.run(
        [sys.executable, "scripts/prod_check.py", "--from-template"],
        cwd=ROOT,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "prod-check passed" in done.stdout
