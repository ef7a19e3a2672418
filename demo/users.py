"""The demo's accounts: who seed_demo creates, and what the login page says about them.

Per tenant, ``<tenant>-<suffix>`` for each of ``USERS`` with those roles; and one site administrator,
``DEMO_ADMIN``, staff and superuser, who opens ``/admin/`` (policies, runtime configs, roles). All share
the demo password; approvers, admins and the site administrator give a second factor on the public
``DEMO_TOTP_SECRET``. None of it exists outside a development run (seed_demo refuses with DEBUG off).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from tenancy.models import Role

TENANTS = {"acme": "Acme Corporation", "globex": "Globex Inc."}
USERS = {
    "operator": [Role.OPERATOR],
    "approver": [Role.APPROVER],
    "approver2": [Role.APPROVER],
    "auditor": [Role.AUDITOR],
    "admin": [Role.ADMIN, Role.OPERATOR],
    "integrator": [Role.INTEGRATOR],  # a system's account: start tasks, feed input and events
}
DEMO_ADMIN = "demo-admin"


def login_hint() -> list[str]:
    """Lines for the login page: the demo users that exist here (none in a database seed_demo never
    ran on), by role, with how they sign in."""
    names = [f"{slug}-{suffix}" for slug in TENANTS for suffix in USERS] + [DEMO_ADMIN]
    present = set(get_user_model().objects.filter(username__in=names).values_list("username", flat=True))
    if not present:
        return []
    lines = []
    for suffix, roles in USERS.items():
        users = [f"{slug}-{suffix}" for slug in TENANTS if f"{slug}-{suffix}" in present]
        if users:
            lines.append(f"{' or '.join(users)}: {', '.join(role.value for role in roles)}")
    if DEMO_ADMIN in present:
        lines.append(f"{DEMO_ADMIN}: site administrator (/admin/)")
    lines.append(
        "Password: demo (unless DEMO_PASSWORD changed it). Approvers and admins then give a code: "
        "make demo-code prints it."
    )
    return lines
