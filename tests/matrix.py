"""One cast and world per module for the authorization matrices, undone when the module ends.

The matrices (tests/security/test_authz_matrix.py, tests/console/test_authorization.py) send one
request per route and principal, hundreds in all; building the tenants, users and world afresh
for each cost most of their time. Built once instead, inside an outer transaction that is rolled
back when the module ends (what ``TestCase.setUpTestData`` does for a class): each test still runs
in a savepoint of its own (pytest-django's per-test atomic), so whatever a permitted write changed
is gone before the next request, and nothing outlives the module.

A module opts in with a module-scoped ``shared`` fixture that opens ``module_transaction``, builds
``build_cast`` and its world there, and binds ``member(name)`` for each name of the cast it uses:
those replace tests/conftest.py's per-test fixtures, whose rows would collide with the shared ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import TestCase, override_settings

from tenancy.models import Role, Tenant
from tests.conftest import make_user

# The shared cast's names: tests/conftest.py's fixtures of the same names.
CAST = ("acme", "globex", "operator", "approver", "auditor", "admin_user", "integrator", "outsider")


# As conftest's fast_password_hashing, which is per test and not yet in force while a module's rows are built.
FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class _ModuleAtomics(TestCase):
    """Used only for Django's class-level atomics: ``transaction.atomic(durable=True)`` (every
    transition) may run inside them, as inside the per-test ones, so the world can be built there."""

    databases = {"default"}


@contextmanager
def module_transaction(django_db_blocker: Any) -> Iterator[None]:
    """An outer transaction for a module's shared rows, rolled back on the way out."""
    with django_db_blocker.unblock():
        atomics = _ModuleAtomics._enter_atomics()
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            _ModuleAtomics._rollback_atomics(atomics)


def build_cast(django_db_blocker: Any) -> SimpleNamespace:
    """tests/conftest.py's cast (same names, roles and passwords), written once."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHERS):
        acme = Tenant.objects.create(slug="acme", name="Acme")
        globex = Tenant.objects.create(slug="globex", name="Globex")
        return SimpleNamespace(
            acme=acme,
            globex=globex,
            operator=make_user("acme-operator", acme, Role.OPERATOR),
            approver=make_user("acme-approver", acme, Role.APPROVER),
            auditor=make_user("acme-auditor", acme, Role.AUDITOR),
            admin_user=make_user("acme-admin", acme, Role.ADMIN),
            integrator=make_user("acme-integrator", acme, Role.INTEGRATOR),
            outsider=make_user("globex-operator", globex, Role.OPERATOR),
        )


def member(name: str) -> Callable[..., Any]:
    """A per-test fixture ``name`` answering the module's shared object of that name (``db``: the
    test runs in its savepoint)."""

    @pytest.fixture(name=name)
    def _member(shared: SimpleNamespace, db: None) -> Any:
        return getattr(shared, name)

    return _member
