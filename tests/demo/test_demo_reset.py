"""make demo-reset brings the demo's standing cases back: the embedded database (and what describes it:
broker, beat schedule, anchors) is thrown away and seeded afresh, exactly as `make demo` seeds it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_reset(var: Path, *flags: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``make demo-reset`` on ``var``; ``-o install`` by default: the suite runs in the installed venv,
    and pip's check that nothing changed costs seconds a call (that the target installs first is
    pinned by the dry run below)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TEST_DATABASE_URL", "DEBUG"}}
    env.update(extra)
    return subprocess.run(
        ["make", "--no-print-directory", *(flags or ("-o", "install")), "demo-reset", f"DEMO_VAR={var}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.timeout(660)
def test_demo_reset_replaces_a_used_demo_with_every_standing_case(tmp_path):
    (tmp_path / "demo.sqlite3").write_bytes(b"a demo someone used: not even a database any more")
    (tmp_path / "anchors").mkdir()
    (tmp_path / "anchors" / "old.json").write_text("{}")
    done = make_reset(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not (tmp_path / "anchors" / "old.json").exists()
    with sqlite3.connect(tmp_path / "demo.sqlite3") as db:
        rows = db.execute(
            "SELECT idempotency_key, state FROM tasks_task WHERE idempotency_key IN "
            "('demo-approval', 'demo-reapproval', 'demo-q-tampered', 'demo-unknown')"
        ).fetchall()
        admins = db.execute(
            "SELECT is_staff, is_superuser FROM auth_user WHERE username = 'demo-admin'"
        ).fetchall()
    assert sorted(set(rows)) == [
        ("demo-approval", "waiting_approval"),
        ("demo-q-tampered", "quarantined"),
        ("demo-reapproval", "waiting_approval"),
        ("demo-unknown", "outcome_unknown"),
    ]
    assert len(rows) == 8  # each in both tenants
    assert admins == [(1, 1)]


def test_demo_reset_refuses_a_database_it_does_not_own(tmp_path):
    done = make_reset(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:5432/somebodys")
    assert done.returncode != 0
    assert "embedded demo database only" in done.stderr
    assert not (tmp_path / "demo.sqlite3").exists()


def test_demo_reset_installs_before_it_migrates(tmp_path):
    """What a user's ``make demo-reset`` runs, in order (a dry run in an empty venv directory, as a fresh
    clone has): the runtime installed first, then the reset, the migrations and the seed."""
    done = make_reset(tmp_path, "-n", f"VENV={tmp_path / 'venv'}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    def first(word: str) -> int:
        return next(n for n, line in enumerate(lines) if word in line)

    assert "requirements/runtime.lock" in lines[first("pip install")]
    assert first("pip install") < first("rm -rf") < first("manage.py migrate") < first("manage.py seed_demo")
