"""The idempotency key an effect is sent with, by key scheme (``Action.key_scheme``).

A key is ``<scope>:<step>:<digest[:16]>``: who intends the effect, which step,
and which effect (``ledger.integrity.effect_digest``). What the scope is
depends on the scheme, which the action records when it is written:

- ``TASK`` (1, every action written before schemes existed): the scope is the
  task's id. A task the database forgot (a restore, a lost commit) and that is
  created again has a new id, so its keys are new.
- ``INTENT`` (2): the scope is derived from what the caller intends, not from a
  row of ours: ``k2.<tenant id>.<hash>``, the hash (SHA-256, 32 hex digits) of
  the tenant, task type and client idempotency key of a task started with one
  (``intent_scope``), of a child's parent scope and position (``child_scope``), or of
  the key of the action a compensation run undoes (``compensation_scope``). The
  same request sent again after a restore has the same keys, so the
  authoritative system (which keeps its own records) answers with its first
  result instead of acting twice. The client key is caller data: only its hash is
  in the key. The tenant is in the hash and, in clear, in the key: two tenants'
  keys never collide, and an effect found in a system names its tenant
  (``tenant_of``).

Keys carry only letters, digits, ``-``, ``.`` and ``:`` besides the step's name,
so they fit in a URL path (``GET {base}/effects/{key}``) as they are. A stored key
is never recomputed to be looked up or reconciled: ``Action.idempotency_key`` is
used as it is. Which scheme and scope a task's new effects get is chosen in one
place (``tasks.effect_keys.scope_of``). Pure functions: no database.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from uuid import UUID

from audit import canonical

INTENT_PREFIX = "k2"
SCOPE_HEX = 32  # 128 bits of the scope's hash


class Scheme(enum.IntEnum):
    TASK = 1
    INTENT = 2


@dataclass(frozen=True)
class Scope:
    """Whose effects a key names: ``scheme`` and the key's first part (``value``)."""

    scheme: Scheme
    value: str

    def key(self, step: str, digest: str) -> str:
        return f"{self.value}:{step}:{digest[:16]}"


def tenant_of(key: str) -> int | None:
    """The tenant an ``INTENT`` key names (an effect a system holds that no ledger row explains
    still says whose it is); None for a key of another scheme."""
    prefix, _, rest = key.partition(".")
    tenant, dot, _ = rest.partition(".")
    if prefix != INTENT_PREFIX or not dot or not (tenant.isascii() and tenant.isdigit()):
        return None
    return int(tenant)


def task_scope(task_id: UUID | str) -> Scope:
    """Today's scope (``TASK``): the task's id."""
    return Scope(Scheme.TASK, str(task_id))


def _intent(tenant_id: int, *parts: object) -> Scope:
    hashed = canonical.digest([INTENT_PREFIX, tenant_id, *parts], version=canonical.V1)[:SCOPE_HEX]
    return Scope(Scheme.INTENT, f"{INTENT_PREFIX}.{tenant_id}.{hashed}")


def intent_scope(tenant_id: int, task_type: str, client_key: str) -> Scope:
    """The scope of a task started with the client's idempotency key ``client_key``."""
    return _intent(tenant_id, "task", task_type, client_key)


def child_scope(parent: Scope, tenant_id: int, task_type: str, position: str) -> Scope:
    """The scope of the child at ``position`` (``<step>:<n>``) of a parent whose scope is ``parent``."""
    if parent.scheme != Scheme.INTENT:
        raise ValueError("a child's scope derives from an intent scope only")
    return _intent(tenant_id, "child", parent.value, task_type, position)


def compensation_scope(tenant_id: int, compensated_key: str, run: int) -> Scope:
    """The scope of run number ``run`` (0 for the first) undoing the action keyed ``compensated_key``.

    The run's number keeps a second run (after the first ended without undoing) from reusing the
    first run's keys, which the system would answer with the first run's result.
    """
    return _intent(tenant_id, "undo", compensated_key, run)
