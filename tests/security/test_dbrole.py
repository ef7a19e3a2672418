"""The owner's commands, run connected as the app role, refuse naming the owner role.

Reproduced before: ``manage.py rotate_keys`` with fields to re-seal and ``manage.py seed_demo``,
connected as the role ``db_roles`` made, died with a traceback (``permission denied for table
tasks_task`` / ``tenancy_membership``); ``retention`` left its work to "the owner role" without
saying which role that is.
"""

from __future__ import annotations

import os
import subprocess
import sys

from django.db import connection

from tasks.models import Checkpoint, RetentionPolicy
from tasks.states import State
from tenancy import dbrole
from tenancy.models import Tenant
from tests.audit.test_tamper import app_role  # noqa: F401 (a fixture)
from tests.conftest import make_task
from tests.security.test_retention import ended
from tests.security.test_rotation import NEW, OLD, under
from tests.workflow import ROOT, database_url

TRACEBACK = "Traceback (most recent call last)"


def as_role(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py args`` connected as role ``name``."""
    url = database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{name}@")
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "DEBUG": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def owner() -> str:
    return str(connection.settings_dict["USER"])


def test_the_role_that_ran_migrate_is_the_owner(db):
    assert dbrole.not_owner() is None
    assert dbrole.owner_needed("anything") is None


def test_rotate_keys_as_the_app_role_refuses_naming_the_owner_and_reseals_nothing(
    acme,
    settings,
    app_role,  # noqa: F811
):
    name, _ = app_role
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = make_task(acme)

    ran = as_role(name, "rotate_keys", FIELD_ENCRYPTION_KEYS=f"{NEW},{OLD}")

    assert ran.returncode == 1, ran.stdout
    assert TRACEBACK not in ran.stderr, ran.stderr[-2000:]
    assert "CommandError: rotate_keys (re-sealing task input, effects and approval copies) needs the " in (
        ran.stderr
    )
    assert f"owner role {owner()} (the role that ran migrate); this connection is {name}." in ran.stderr
    assert under("old") == Checkpoint.objects.filter(task=task).count() == 1  # nothing re-sealed


def test_rotate_keys_dry_run_counts_as_the_app_role(acme, settings, app_role):  # noqa: F811
    name, _ = app_role
    settings.FIELD_ENCRYPTION_KEYS = OLD
    make_task(acme)

    ran = as_role(name, "rotate_keys", "--dry-run", FIELD_ENCRYPTION_KEYS=f"{NEW},{OLD}")

    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "(to re-seal)" in ran.stdout


def test_seed_demo_as_the_app_role_refuses_naming_the_owner_and_seeds_nothing(db, app_role):  # noqa: F811
    name, _ = app_role

    ran = as_role(name, "seed_demo")

    assert ran.returncode == 1, ran.stdout
    assert TRACEBACK not in ran.stderr, ran.stderr[-2000:]
    assert (
        "CommandError: seed_demo (granting the demo users their roles and staff flags) needs " in ran.stderr
    )
    assert f"the database owner role {owner()}" in ran.stderr
    assert not Tenant.objects.filter(slug__in=("acme", "globex")).exists()


def test_retention_as_the_app_role_names_the_owner_it_leaves_the_work_to(acme, app_role):  # noqa: F811
    name, _ = app_role
    RetentionPolicy.objects.create(tenant=acme, archive_after_days=10, delete_after_days=100)
    ended(acme, State.COMPLETED, 200)

    ran = as_role(name, "retention")

    assert ran.returncode == 0, ran.stderr[-2000:]
    assert f"Run `manage.py retention` as the owner role {owner()} (this connection is {name})" in ran.stderr
