"""Approval requests, bound to a digest of what they authorize, and their decisions."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from guardian.models import GroupObjectPermissionBase, UserObjectPermissionBase

from audit import sealing
from tasks import registry
from tasks.ids import uuid7


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"


class Decision(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class ApprovalRequest(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="approval_requests")
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    # The step asking, the dispatch step it authorizes, and the task version that
    # waits for the decision: a decision only applies to that exact wait.
    step = models.CharField(max_length=64)
    action_step = models.CharField(max_length=64)
    waiting_version = models.PositiveIntegerField()
    # Exactly the fields the digest covers; the effect's sensitive keys sealed to this request (the
    # digest is of the clear values: see ``approvals.services.request_decision``).
    consequential = models.JSONField()
    digest = models.CharField(max_length=64)
    material = models.JSONField(default=dict)  # material facts as they stood when asked (sensitive: sealed)
    evidence = models.JSONField(default=list)  # references: system, record_id, record_version, fetched_at
    policy_reason = models.TextField()
    policy_version = models.CharField(max_length=64)
    approver_role = models.CharField(max_length=16, default="approver")
    requested_by = models.CharField(
        max_length=200
    )  # actor id of whoever wants the action: never its approver
    # Everyone who caused this request to be asked for, none of whom may decide it, with why:
    # actor id -> causes (schema ``approvals.authority.Barred``). Written when it is raised,
    # extended when an escalation hands it on; read by the decision and by the inbox.
    barred = models.JSONField(default=dict)
    allowed_decisions = models.JSONField(default=list)
    expires_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("decide_approvalrequest", "Can decide this approval request")]
        indexes = [
            # The inbox: a tenant's pending requests, oldest first.
            models.Index(
                fields=["tenant", "created_at"], condition=Q(status="pending"), name="approval_inbox"
            ),
            # GET /api/approvals/?status=pending pages by id.
            models.Index(
                fields=["tenant", "id"], condition=Q(status="pending"), name="approval_pending_by_id"
            ),
            # The inbox by time left, keyset-paged on (expires_at, id).
            models.Index(
                fields=["tenant", "expires_at", "id"],
                condition=Q(status="pending"),
                name="approval_inbox_expiry",
            ),
            # The engine's "latest request of this step".
            models.Index(fields=["task", "step", "-created_at"], name="approval_task_step"),
        ]

    def __str__(self) -> str:
        return f"approval {self.id} for {self.task_id}:{self.action_step} [{self.status}]"

    # --- sealed values (audit.sealing) --------------------------------------------------------------
    # ``consequential`` and ``material`` keep the task type's sensitive values sealed, bound to this
    # request and column. Pages and API answers show them masked (``shown_*``); the runtime and the
    # comparisons open them (``opened``).

    def opened(self, column: str) -> Any:
        """``consequential`` or ``material`` as asked, sealed values opened. Raises ``sealing.Unopenable``."""
        return sealing.open_all(getattr(self, column), sealing.approval_place(self.id, column))

    def shown(self, column: str) -> Any:
        """``consequential`` or ``material`` as approvers see it: sensitive values masked, sealed or not
        (a request written before sealing holds them in clear)."""
        at = sealing.approval_place(self.id, column)
        value = getattr(self, column)
        if column == "material":
            return sealing.masked_at(value, at, registry.sensitive_fields(self.task.task_type))
        effect = value.get("effect") if isinstance(value, dict) else None
        if not isinstance(effect, dict):
            return sealing.mask_all(value, at)
        names = registry.sensitive_effect_keys(self.task.task_type, self.action_step)
        return {**sealing.mask_all(value, at), "effect": sealing.masked_at(effect, (*at, "effect"), names)}

    # Cached per instance: a page reads them several times, and neither column changes once written.
    @cached_property
    def shown_consequential(self) -> Any:
        return self.shown("consequential")

    @cached_property
    def shown_material(self) -> Any:
        return self.shown("material")


class ApprovalDecision(models.Model):
    # One decision per request: a second, concurrent one cannot commit.
    request = models.OneToOneField(ApprovalRequest, on_delete=models.CASCADE, related_name="decision")
    decision = models.CharField(max_length=8, choices=Decision.choices)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    digest_seen = models.CharField(max_length=64)
    comment = models.TextField(blank=True, default="")
    decided_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.decision} by {self.decided_by_id} on {self.request_id}"


# Who may decide which request: django-guardian object permissions with a real
# foreign key to the request ("direct" object permissions), not guardian's
# generic rows. A generic row keeps the object's id as text (``object_pk``), so
# every "which of these requests may this user decide" query compared
# ``approvalrequest.id::text`` with ``object_pk``: untyped, unindexable, and in
# a nested loop whenever the planner misjudged the row counts, quadratic in the
# number of pending requests (2,001 pending: about 2 s per inbox). Here the join
# is uuid = uuid on an indexed column, so ``approvals.selectors.inbox`` asks, per
# request it reads, one index lookup ("is there a grant for this request to one
# of the user's groups, or to the user?"), however many are pending.
#
# Guardian finds these models itself: ``assign_perm``, ``remove_perm``,
# ``user.has_perm(perm, request)`` (its ``ObjectPermissionBackend``) and
# ``get_objects_for_user`` all read and write them for ``ApprovalRequest``. The
# grant still goes to the tenant's role group (``tenancy.services.role_group``),
# so an approver outside that group neither sees the request in the inbox nor
# may decide it. Migration 0002 moved the generic rows here.
#
# Not chosen: scoping decisions by tenant and role alone (a denormalized scope)
# is cheaper still, but drops the per-object grant the design asks for (and an
# admin's ability to revoke one request from a group or grant it to one user).


class ApprovalRequestUserPermission(UserObjectPermissionBase):
    content_object = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="user_grants", db_index=False
    )

    class Meta(UserObjectPermissionBase.Meta):
        # "May user X decide request R?" in one index probe (it also serves the foreign key).
        indexes = [models.Index(fields=["content_object", "permission", "user"], name="approval_user_grant")]


class ApprovalRequestGroupPermission(GroupObjectPermissionBase):
    content_object = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="group_grants", db_index=False
    )

    class Meta(GroupObjectPermissionBase.Meta):
        # "May group X decide request R?" in one index probe (it also serves the foreign key).
        indexes = [
            models.Index(fields=["content_object", "permission", "group"], name="approval_group_grant")
        ]
