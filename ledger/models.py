"""The action ledger: one row per intended side effect.

An ``Action`` is committed by the transition primitive in the same
transaction as the state change that intends it (the outbox). Its
``idempotency_key`` is deterministic, so re-deciding the same step of the
same task can never produce a second, different effect; how it was derived is
its ``key_scheme`` (``ledger.keys``), recorded once and never recomputed.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.keys import Scheme


class DispatchState(models.TextChoices):
    INTENDED = "intended"
    DISPATCHING = "dispatching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILED_SUCCEEDED = "reconciled_succeeded"
    RECONCILED_FAILED = "reconciled_failed"
    RECONCILED_ABSENT = "reconciled_absent"


# The ledger's own state machine: which dispatch state may follow which.
# ``ledger.services.action_move`` is the only writer and checks this table.
DISPATCH_MOVES: dict[str, frozenset[str]] = {
    # or withdrawn before it was ever sent (a cancel): definitely not performed
    DispatchState.INTENDED: frozenset({DispatchState.DISPATCHING, DispatchState.FAILED}),
    DispatchState.DISPATCHING: frozenset(
        {
            DispatchState.SUCCEEDED,
            DispatchState.FAILED,
            DispatchState.UNKNOWN,
            # a dispatch interrupted by a crash is settled by asking the system
            DispatchState.RECONCILED_SUCCEEDED,
            DispatchState.RECONCILED_FAILED,
            DispatchState.RECONCILED_ABSENT,
        }
    ),
    DispatchState.UNKNOWN: frozenset(
        {DispatchState.RECONCILED_SUCCEEDED, DispatchState.RECONCILED_FAILED, DispatchState.RECONCILED_ABSENT}
    ),
    # absent after a lookup made once the send could no longer land: safe to send
    # again with the same key; or found after all by a later lookup (a late landing)
    DispatchState.RECONCILED_ABSENT: frozenset(
        {DispatchState.DISPATCHING, DispatchState.RECONCILED_SUCCEEDED, DispatchState.RECONCILED_FAILED}
    ),
}
SETTLED_OK = frozenset({DispatchState.SUCCEEDED, DispatchState.RECONCILED_SUCCEEDED})
SETTLED_FAILED = frozenset({DispatchState.FAILED, DispatchState.RECONCILED_FAILED})
IN_DOUBT = frozenset({DispatchState.DISPATCHING, DispatchState.UNKNOWN})
SENDABLE = frozenset({DispatchState.INTENDED, DispatchState.RECONCILED_ABSENT})


class Action(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="actions")
    step = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, unique=True)
    # How the key was derived (``ledger.keys.Scheme``): rows written before schemes existed, and by
    # workers of an older deployment, are TASK (the database's default); the key is used as stored.
    key_scheme = models.PositiveSmallIntegerField(default=Scheme.TASK, db_default=Scheme.TASK)
    connector = models.CharField(max_length=64)
    effect = models.JSONField()  # validated by the connector's effect model
    effect_digest = models.CharField(max_length=64)
    dispatch_state = models.CharField(
        max_length=24, choices=DispatchState.choices, default=DispatchState.INTENDED
    )
    outcome = models.JSONField(null=True, blank=True)  # what the authoritative system said
    external_ref = models.CharField(max_length=200, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Counters the metrics read: how often the authoritative system answered a
    # repeated key with the first result instead of acting again, and how long
    # the outcome stayed unknown.
    duplicates_suppressed = models.PositiveIntegerField(default=0)
    unknown_since = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # When the latest send was claimed: until CONNECTOR_MAX_IN_FLIGHT after it, the
    # request may still land, so "not found" does not yet mean absent.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # When the reconciler last asked the authoritative system about this action.
    checked_at = models.DateTimeField(null=True, blank=True)
    compensation_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="compensations"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The dispatcher's claim query: intents not yet sent, oldest first.
            models.Index(
                fields=["created_at"],
                condition=Q(dispatch_state="intended"),
                name="action_intended",
            ),
            # The reconciler's and the cancel path's "what is in doubt for this task".
            models.Index(
                fields=["task", "unknown_since"],
                condition=Q(dispatch_state__in=["dispatching", "unknown"]),
                name="action_in_doubt",
            ),
            # The reconciler's late-landing check: effects found absent, recently.
            models.Index(
                fields=["resolved_at"],
                condition=Q(dispatch_state="reconciled_absent"),
                name="action_absent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.connector} {self.idempotency_key} [{self.dispatch_state}]"


class MoneyMovement(models.Model):
    """What an intended effect moves, for the money policy (``ledger.money``): one row per intent of a
    Dispatch that declares a ``MoneyPolicy``, committed with the intent (the same transition).

    Who asked (the task's owner, and the API token the task was started with), how much in which
    currency, and the business reference it pays (``invoice:INV-7``). Whether it counts — succeeded
    or still in flight — is its action's ``dispatch_state``: one source of truth, read by a join.
    """

    action = models.OneToOneField(
        Action, to_field="idempotency_key", on_delete=models.PROTECT, related_name="money"
    )
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    task_type = models.CharField(max_length=64)
    # Actor id of whoever the task pays for ("user:<name>"); "" for a task without an owner.
    requester = models.CharField(max_length=200, blank=True, default="")
    api_token = models.ForeignKey(
        "tenancy.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reference = models.CharField(max_length=200, blank=True, default="")  # "" when the type declares none
    # In the currency's own units; NULL when the facts held no readable amount (that needed approval).
    amount = models.DecimalField(max_digits=30, decimal_places=8, null=True, blank=True)
    currency = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            # ledger.money.running_total by requester: this requester's movements of one type and
            # currency in the window (one range scan; each row's action joined by its unique key).
            models.Index(
                fields=["tenant", "task_type", "requester", "currency", "created_at"],
                include=["amount"],
                name="money_by_requester",
            ),
            # ledger.money.running_total by token: the same for the API token the task was started with.
            models.Index(
                fields=["api_token", "task_type", "currency", "created_at"],
                include=["amount"],
                condition=Q(api_token__isnull=False),
                name="money_by_token",
            ),
            # ledger.money.earlier_movements: the tenant's earlier effects for one business reference.
            models.Index(
                fields=["tenant", "reference", "created_at"],
                condition=~Q(reference=""),
                name="money_by_reference",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.amount} {self.currency} for {self.reference or 'no reference'} ({self.action_id})"


class OrphanStatus(models.TextChoices):
    OPEN = "open"  # an effect a system holds that no ledger row explains: an operator looks at it
    SETTLED = "settled"  # a task (re-created with the client's key) now has an action with its key


class OrphanEffect(models.Model):
    """An effect an authoritative system holds that no ``Action`` explains (``manage.py recover``).

    Found after a restore or a lossy failover: the system kept an effect whose intent our database
    lost. What the system said is kept as found (``frozen`` on PostgreSQL, never deleted); only the
    settlement moves: a task re-created with the client's idempotency key gets the same key
    (``ledger.keys``), and the step it records settles the orphan (``ledger.orphans.settle``).
    """

    connector = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200)
    # The tenant an INTENT key names (``ledger.keys.tenant_of``); None for a key of another scheme
    # or naming no tenant we have.
    tenant = models.ForeignKey(
        "tenancy.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    found_at = models.DateTimeField()
    # The system's record of it: when it recorded it, its status and record id.
    system_created_at = models.DateTimeField()
    system_status = models.CharField(max_length=16)
    record_id = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=OrphanStatus.choices, default=OrphanStatus.OPEN)
    settled_task = models.UUIDField(null=True, blank=True)  # the task whose action now explains it
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["connector", "idempotency_key"], name="orphan_effect_unique")
        ]
        indexes = [models.Index(fields=["tenant", "-found_at"], name="orphan_by_tenant")]

    def __str__(self) -> str:
        return f"orphan {self.connector} {self.idempotency_key} [{self.status}]"


class RestoreRecord(models.Model):
    """The audited record of one ``recover --apply``, per tenant: the database was restored (or failed
    over with commits lost), this window was searched, these orphans were found, these tasks were lost.
    Append-only, and chained (``ledger.restores``).

    Tells a documented restore from tampering: an anchor written before the restore lists tasks the
    database no longer has; this row, written with a fresh anchor after, says why, and names them
    (``RestoreLoss``). ``tenant`` is None for the orphans whose keys name no tenant.
    """

    tenant = models.ForeignKey(
        "tenancy.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    at = models.DateTimeField()
    since = models.DateTimeField()  # the start of the window at risk
    orphans = models.PositiveIntegerField()  # orphans of this tenant the run found in the window
    recorded = models.PositiveIntegerField()  # of which newly recorded (the rest were known)
    detail = models.CharField(max_length=500, blank=True, default="")  # connectors that could not list
    # The point the database was restored to (its newest transition when recover ran); None if it had none.
    restored_to = models.DateTimeField(null=True, blank=True)
    # The pre-restore anchor compared with the database ("" when there was none), and what it showed
    # of this tenant: tasks gone, tasks set back to an older version (one ``RestoreLoss`` row each).
    anchor = models.CharField(max_length=200, blank=True, default="")
    tasks_lost = models.PositiveIntegerField(default=0)
    tasks_behind = models.PositiveIntegerField(default=0)
    losses_digest = models.CharField(max_length=64, blank=True, default="")  # over its RestoreLoss rows
    # One chain over every restore record, in id order (``ledger.restores``), head on ``RestoreHead``,
    # also signed with the anchor key; all "" on records written before ledger migration 0008.
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64, blank=True, default="")
    key_id = models.CharField(max_length=32, blank=True, default="")
    signing_key = models.CharField(max_length=64, blank=True, default="")
    signature = models.CharField(max_length=128, blank=True, default="")

    def __str__(self) -> str:
        return f"restore {self.at:%Y-%m-%d %H:%M:%S} tenant {self.tenant_id}: {self.orphans} orphan(s)"


class RestoreLoss(models.Model):
    """A task a restore lost (``version_now`` None) or set back, as the pre-restore anchor showed it.

    Written with its ``RestoreRecord`` (whose ``losses_digest`` covers it); append-only.
    ``verify_audit --against`` that anchor or an older one excuses what this row names, and only that.
    """

    record = models.ForeignKey(RestoreRecord, on_delete=models.PROTECT, related_name="losses")
    task_id = models.UUIDField()  # no foreign key: the task is gone, or may be deleted later
    version_anchored = models.PositiveIntegerField()
    version_now = models.PositiveIntegerField(null=True, blank=True)  # None: the task is gone

    class Meta:
        constraints = [models.UniqueConstraint(fields=["record", "task_id"], name="restore_loss_unique")]
        # verify_audit --against: is this anchored task one a restore lost?
        indexes = [models.Index(fields=["task_id"], name="restore_loss_task")]

    def __str__(self) -> str:
        now = "gone" if self.version_now is None else f"v{self.version_now}"
        return f"{self.task_id}: v{self.version_anchored} anchored, {now} after the restore"


class RestoreHead(models.Model):
    """The newest restore record's hash (one row): deleting the newest record breaks the chain too.

    Moved in the transaction that appends a record, under this row's lock (``ledger.restores.append``).
    """

    hash = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"restore chain head {self.hash[:12] or '(empty)'}"
