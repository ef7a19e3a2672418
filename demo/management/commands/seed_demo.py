"""manage.py seed_demo: demo tenants, users and tasks (idempotent; refuses in production).

Tenants ``acme`` and ``globex``; in each, users ``<tenant>-operator``,
``-approver``, ``-approver2``, ``-auditor``, ``-admin``, ``-integrator`` (``demo.users``), and the
site administrator ``demo-admin`` (staff, superuser: ``/admin/``), with password
``$DEMO_PASSWORD`` (default ``demo``), the approvers and admins with an authenticator
device on the public ``DEMO_TOTP_SECRET`` (printed, and in the README: any TOTP app
gives their second factor; never a secret outside the demo); the sandbox order records, policies and
approved runtime configs; two tasks ready for the workers to drive, and, per
tenant, a standing case of every kind an operator triages. None of the standing
cases resolves by itself while ``make demo`` runs (web, worker, beat):

- waiting for input, an external event (days-long deadlines) and a retry (a
  short one the sweep resumes, and one whose backoff runs for hours);
- quarantined for each reason: a corrupt checkpoint, one whose migration fails, a
  step error, a digest mismatch, an operator's hold (quarantine is only left by an
  operator's release); and a task whose checkpoint a newer deployment wrote, left
  untouched by this one's workers (a mixed-version rollout);
- an outcome unknown whose payments system answers every lookup of that key with
  an error (a standing sandbox fault), so the reconciler can never settle it and,
  past the demo's threshold (``run_demo``: 60 s), escalates it;
- a stuck task: runnable in region ``eu-west``, where no worker runs, so nobody
  leases it (the stuck filter shows it ``STUCK_AFTER`` after seeding);
- a parent waiting on its children (``waiting_children``), which are queued in that
  same region (and a batch in the workers' region that runs to its end);
- a failed task to rerun; approvals pending, one of them a repeat request for the
  same task after the order record changed; a task with a long history (400 steps).

Each task is one case in ``demo.cases`` (a module per workflow), seeded here in
every tenant. Everything is written through real transitions (foreign checkpoints with
``demo.foreign.written_as``, tampering by SQL as tampering is), so each task's
audit chain verifies.

Last, the maintained rollups are recounted (``runtime.rollups.refresh``, what the beat runs every
``ROLLUP_INTERVAL`` seconds), so the dashboard and the queue's counts show the seeded tasks at once
instead of "No reading yet" until the beat's first round.
"""

from __future__ import annotations

import base64
import os
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from demo.cases import CASES
from demo.cases.seeding import ORDERS, WORKER_ID, Seeding
from demo.sandbox.models import Record
from demo.users import DEMO_ADMIN, TENANTS, USERS
from runtime import rollups
from tasks import registry
from tasks.models import Policy, RuntimeConfig
from tasks.transitions import Actor
from tenancy.dbrole import owner_needed
from tenancy.models import Role, Tenant
from tenancy.services import grant_role

# The demo's authenticator secret (base32), the same for every demo approver and admin so the tour
# can show the second factor: add it to any TOTP app. Public, like the demo password.
DEMO_TOTP_SECRET = "DURABLEAGENTSDEMOSECRETNOTFORUSE"


def give_demo_device(user: Any) -> None:
    """A confirmed authenticator on ``DEMO_TOTP_SECRET`` for ``user``, unless one is enrolled already."""
    if not TOTPDevice.objects.filter(user=user, confirmed=True).exists():
        key = base64.b32decode(DEMO_TOTP_SECRET).hex()
        TOTPDevice.objects.create(user=user, name="demo authenticator", key=key, confirmed=True)


class Command(BaseCommand):
    help = "Create demo tenants, users and tasks (idempotent). Refuses to run with DEBUG off."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--code",
            action="store_true",
            help="only print the demo authenticator's code of the moment (for a laptop without a TOTP app)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError("seed_demo refuses to run under production settings (DEBUG is off).")
        if options["code"]:
            self.stdout.write(f"{TOTP(base64.b32decode(DEMO_TOTP_SECRET)).token():06d}")
            return
        refusal = owner_needed("seed_demo (granting the demo users their roles and staff flags)")
        if refusal:
            raise CommandError(refusal)
        password = os.environ.get("DEMO_PASSWORD", "demo")
        seed_sandbox()
        seed_policies()
        for slug, name in TENANTS.items():
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
            seed_users(tenant, password)
            seed_cases(tenant)
        seed_site_admin(password)
        # The beat's recount, once now: the seeded tasks are counted before anyone opens the dashboard.
        rollups.refresh()
        self.stdout.write(
            self.style.SUCCESS(f"Demo ready: users <tenant>-operator etc., password {password!r}")
        )
        self.stdout.write(f"The site admin at /admin/ (policies, runtime configs, roles): {DEMO_ADMIN}")
        self.stdout.write(
            "Approvers and admins give a second factor: add the demo secret "
            f"{DEMO_TOTP_SECRET} to any authenticator app (TOTP, 6 digits, 30 s)."
        )


def seed_users(tenant: Tenant, password: str) -> None:
    """``<tenant>-<suffix>`` for each of ``USERS``, with its roles (and an authenticator where needed)."""
    User = get_user_model()
    for suffix, roles in USERS.items():
        user, created = User.objects.get_or_create(username=f"{tenant.slug}-{suffix}")
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        for role in roles:
            grant_role(user, tenant, role)
        if {Role.APPROVER, Role.ADMIN} & set(roles):
            give_demo_device(user)


def seed_site_admin(password: str) -> None:
    """``DEMO_ADMIN``: staff and superuser, so the tour can open /admin/ (policies, runtime configs,
    roles); like every superuser, a second factor on the demo authenticator."""
    user, created = get_user_model().objects.get_or_create(username=DEMO_ADMIN)
    if created:
        user.set_password(password)
    user.is_staff = user.is_superuser = True
    user.save()
    give_demo_device(user)


def seed_cases(tenant: Tenant) -> None:
    """Every demo case in ``tenant``: started by its operator, decided by its second approver."""
    User = get_user_model()
    seeding = Seeding(
        tenant=tenant,
        operator=User.objects.get(username=f"{tenant.slug}-operator"),
        approver=User.objects.get(username=f"{tenant.slug}-approver2"),
        worker=Actor.worker(WORKER_ID),
        now=timezone.now(),
    )
    for case in CASES:
        case(seeding)


def seed_sandbox() -> None:
    """The order system's records the demo tasks read as evidence (version 1 each)."""
    for order, data in ORDERS.items():
        Record.objects.get_or_create(system="orders", record_id=order, defaults={"data": data})


def seed_policies() -> None:
    """Each task type's current policy and approved runtime config, so its tasks resume."""
    for name in registry.names():
        kind = registry.get(name)
        Policy.objects.get_or_create(task_type=name, defaults={"version": settings.DEFAULT_POLICY_VERSION})
        RuntimeConfig.objects.get_or_create(
            task_type=name,
            model_id=kind.model_id,
            prompt_id=kind.prompt_id,
            toolset_id=kind.toolset_id,
            defaults={"approved": True, "current": True},
        )
