"""The fixed cast and small builders every suite shares.

Cast: in tenant ``acme`` an operator, an approver, an auditor, an admin and an
integrator (a system's account); ``outsider`` is the operator of tenant ``globex``.
"""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from config.celery import app as celery_app
from tasks import checkpoints
from tasks.services import task_create
from tasks.transitions import Actor
from tenancy.models import Role, Tenant
from tenancy.services import grant_role
from tests import fast_flush
from tests.second_factor import mark_verified

# In-process tests ring the doorbell into memory; tests that need real workers start them.
celery_app.conf.broker_url = "memory://"
# A transactional test's teardown truncates only the tables that hold rows (tests/fast_flush.py).
fast_flush.install()
# Playwright's sync API runs an event loop in the test thread; Django's ORM calls there are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Each test database is a copy of the migrated template (``scripts/migrated_template.py``), which
    the soaks and benchmarks this suite starts copy too: the migrations run once per run, not per copy
    (Django's ``migrate`` on the copy then finds nothing to apply)."""
    from django.conf import settings

    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        from scripts import migrated_template

        settings.DATABASES["default"].setdefault("TEST", {})["TEMPLATE"] = migrated_template.ensure(url)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """Commits to the test databases do not wait for the disk (``synchronous_commit = off``, for every
    session opened on them, the workers' and servers' the tests start included): a commit is as
    atomic and as visible to others as before; only a crash of PostgreSQL itself, which no test of
    the default suite causes, could lose the latest ones. About 0.4 ms a commit on this machine."""
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    name = connection.ops.quote_name(connection.settings_dict["NAME"])
                    cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
                    cursor.execute("SET synchronous_commit = off")
    yield


# Tests that start real processes or a browser: seconds to minutes each, against milliseconds for the rest.
HEAVY_DIRS = {"bench", "chaos", "lifecycle", "packaging", "regions", "upgrades"}


def _heavy(item: pytest.Item) -> bool:
    path = item.path
    return (
        path.parent.name in HEAVY_DIRS
        or path.name.endswith("_browser.py")
        or "live_server" in getattr(item, "fixturenames", ())
    )


def _db_group(item: pytest.Item) -> int:
    """pytest-django's order: database tests in a rolled-back transaction (0), then transactional ones
    (1, they empty the tables when they end), then tests without the database (2)."""
    fixtures = getattr(item, "fixturenames", ())
    marker = item.get_closest_marker("django_db")
    transactional = "transactional_db" in fixtures or "live_server" in fixtures
    if marker is not None:
        args = dict(zip(("transaction", "reset_sequences"), marker.args, strict=False)) | marker.kwargs
        transactional = transactional or bool(args.get("transaction") or args.get("reset_sequences"))
    if transactional:
        return 1
    return 0 if marker is not None or "db" in fixtures else 2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, each within its group of pytest-django's order (its hook has sorted
    the items already; this one runs last): with ``-n 2`` the run ends when the busier worker does,
    and a soak or a browser test picked up last leaves the other worker idle for its whole length.
    Tests without the database may run anywhere, so the heavy ones among them (the chaos soak, on a
    database of its own) go first of all."""
    items.sort(
        key=lambda item: (-1 if _heavy(item) and _db_group(item) == 2 else _db_group(item), not _heavy(item))
    )


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's chromium, never a downloaded browser."""
    return {
        **browser_type_launch_args,
        "executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        "args": [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def force_login_gives_the_second_factor(monkeypatch):
    """``client.force_login`` skips the password; it skips the second factor too, so tests that are
    not about logging in need not know about it (those that are log in through the forms)."""
    original = Client.force_login

    def force_login(self: Client, user, backend=None) -> None:
        original(self, user, backend)
        mark_verified(self, user)

    monkeypatch.setattr(Client, "force_login", force_login)


@pytest.fixture(autouse=True)
def fresh_cache():
    """API throttle counters live in the cache: no test inherits another's."""
    cache.clear()


@pytest.fixture
def acme(db):
    return Tenant.objects.create(slug="acme", name="Acme")


@pytest.fixture
def globex(db):
    return Tenant.objects.create(slug="globex", name="Globex")


def make_user(username: str, tenant: Tenant | None = None, *roles: str):
    user = get_user_model().objects.create_user(username=username, password="pw")
    for role in roles:
        grant_role(user, tenant, role)
    return user


@pytest.fixture
def operator(acme):
    return make_user("acme-operator", acme, Role.OPERATOR)


@pytest.fixture
def approver(acme):
    return make_user("acme-approver", acme, Role.APPROVER)


@pytest.fixture
def auditor(acme):
    return make_user("acme-auditor", acme, Role.AUDITOR)


@pytest.fixture
def admin_user(acme):
    return make_user("acme-admin", acme, Role.ADMIN)


@pytest.fixture
def integrator(acme):
    return make_user("acme-integrator", acme, Role.INTEGRATOR)


@pytest.fixture
def outsider(globex):
    return make_user("globex-operator", globex, Role.OPERATOR)


def api_client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


REFUND_INPUT = {"order_id": "A-1", "customer_email": "c@example.com", "amount": "10.00", "currency": "USD"}


def make_task(tenant: Tenant, **overrides):
    """Start a ``refund_request`` task in ``tenant`` (ready, version 1)."""
    fields = {
        "task_type": "refund_request",
        "objective": "Refund order A-1",
        "input": REFUND_INPUT,
        "actor": Actor.system("tests"),
    }
    fields.update(overrides)
    task, _ = task_create(tenant=tenant, **fields)
    return task


def progress(step: str = "step", **facts) -> checkpoints.Progress:
    return checkpoints.Progress(step=step, facts=facts)
