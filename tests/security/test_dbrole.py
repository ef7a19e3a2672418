"""What only the owner role may write, tried connected as the app role, is refused naming the owner.

Reproduced before: ``manage.py rotate_keys`` with fields to re-seal and ``manage.py seed_demo``,
connected as the role ``db_roles`` made, died with a traceback (``permission denied for table
tasks_task`` / ``tenancy_membership``); ``retention`` left its work to "the owner role" without
saying which role that is; in the admin, changing an account's ``is_staff``, deleting an account
or a tenant, and saving a task's or a checkpoint's page answered 500 (a permission error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.contrib.auth import get_user_model
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


ADMIN_WRITES = """
import json
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.test import Client
from tests.second_factor import mark_verified

User = get_user_model()
client = Client(raise_request_exception=False)  # a 500 is an answer here, not a crash
root = User.objects.get(username="root")
client.force_login(root)
mark_verified(client, root)
operator = User.objects.get(username="{operator}")
account = f"/admin/auth/user/{{operator.pk}}/change/"
form = {{"username": operator.username, "is_active": "on", "date_joined_0": "2026-01-01",
         "date_joined_1": "00:00:00", "first_name": "Ada"}}
flags = client.post(account, {{**form, "is_staff": "on"}})
name = client.post(account, form)
print(json.dumps({{
    "flags": [flags.status_code, flags.content.decode()],
    "name": name.status_code,
    "delete_account": client.get(f"/admin/auth/user/{{operator.pk}}/delete/").status_code,
    "delete_tenant": client.get("/admin/tenancy/tenant/{tenant}/delete/").status_code,
    "view_task": client.get("/admin/tasks/task/{task}/change/").status_code,
    "save_task": client.post("/admin/tasks/task/{task}/change/", {{}}).status_code,
    "save_checkpoint": client.post("/admin/tasks/checkpoint/{checkpoint}/change/", {{}}).status_code,
}}))
"""


def test_the_admin_refuses_what_only_the_owner_may_write_as_the_app_role_never_a_500(
    acme,
    operator,
    app_role,  # noqa: F811
):
    """Connected as the app role: the staff flags are refused on the form, naming the owner, and the
    rest of the account still saves; deleting an account or a tenant (memberships go with them) is a
    403; the kernel's and the log's rows are viewed, and a save is a 403, not a permission error."""
    name, _ = app_role
    get_user_model().objects.create_superuser("root", password="unused-here")  # by the owner
    task = make_task(acme)
    checkpoint = Checkpoint.objects.get(task=task)
    script = ADMIN_WRITES.format(
        operator=operator.username, tenant=acme.pk, task=task.pk, checkpoint=checkpoint.pk
    )

    ran = as_role(name, "shell", "-c", script)

    assert ran.returncode == 0, ran.stderr[-3000:]
    shown = json.loads(ran.stdout.strip().splitlines()[-1])
    status, page = shown.pop("flags")
    assert status == 200, page[-2000:]
    assert f"Changing is_staff needs the database owner role {owner()}" in page
    assert "Nothing was saved." in page
    assert shown == {
        "name": 302,
        "delete_account": 403,
        "delete_tenant": 403,
        "view_task": 200,
        "save_task": 403,
        "save_checkpoint": 403,
    }
    operator.refresh_from_db()
    assert (operator.is_staff, operator.first_name) == (False, "Ada")
