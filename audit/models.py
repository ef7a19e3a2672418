"""The append-only history of a task: its transitions, its lease takeovers, and what retention removed.

``TransitionEvent``: one row per committed transition, hash-chained per task
(``prev_hash`` -> ``hash``, keyed: ``audit.chain``) so that editing, deleting
or inserting a row is detectable by ``audit.verify.verify_task`` /
``manage.py verify_audit``. It records the digest of the checkpoint written
with it, which binds that checkpoint to the chain. ``LeaseTakeover``: one row
each time a worker claims a task whose lease lapsed in another worker's hands,
chained per task on its own (``audit.chain.verify_takeovers``).
``Tombstone``: a task retention deleted, with the head its chain had, so an
anchor that listed the task still accounts for it (``audit.anchor``).
``AnchorRequest`` and ``AnchorRun``: the anchor job's doorbell (a consequential
transition asks for an anchor soon) and its record of the anchors it wrote
(what the console's integrity badge shows); operational rows, not evidence.

On PostgreSQL, triggers (migration 0009) refuse UPDATE, DELETE and TRUNCATE on
all three; only the owner role's retention path may delete (docs/operating/tamper-evidence.md#database-roles).
"""

from __future__ import annotations

from django.db import models


class TransitionEvent(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="events")
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    # The version the task reached with this transition (the creation event is 1).
    state_version = models.PositiveIntegerField()
    from_state = models.CharField(max_length=24, blank=True, default="")  # "" for creation
    to_state = models.CharField(max_length=24)
    trigger = models.CharField(max_length=32)
    actor_kind = models.CharField(max_length=16)
    actor_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    reason_code = models.CharField(max_length=64, blank=True, default="")
    attempt = models.PositiveIntegerField()
    policy_version = models.CharField(max_length=64)
    parent_id = models.UUIDField(null=True, blank=True)
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # SHA-256 of the checkpoint body written by this transition ("" when it wrote
    # none, or was written before checkpoints carried digests). Hashed only when set,
    # so older events keep their hashes (audit.chain.OPTIONAL_HASHED_FIELDS).
    checkpoint_digest = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # Which AUDIT_HMAC_KEYS key made ``hash`` (HMAC-SHA256); "" on events written before the
    # chain was keyed, whose hash is plain SHA-256 (audit.chain.LEGACY).
    key_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        constraints = [
            # One event per version: a second commit from the same version cannot exist.
            models.UniqueConstraint(fields=["task", "state_version"], name="event_one_per_version"),
        ]
        indexes = [
            # The console's audit search and its export: a tenant's events newest first,
            # keyset-paged on (created_at, id) (audit.selectors.search_events). The actor rides in
            # each entry, so a search by actor picks its page from the index alone (migration 0015).
            models.Index(
                fields=["tenant", "-created_at", "-id"], include=["actor_id"], name="event_tenant_created"
            ),
            # The search by reason has a trigram GIN index on UPPER(reason), UPPER(reason_code),
            # in migration 0007 only (PostgreSQL; an expression the SQLite demo cannot build).
        ]

    def __str__(self) -> str:
        return f"{self.task_id} v{self.state_version} {self.from_state or '∅'}->{self.to_state}"


class LeaseTakeover(models.Model):
    """A worker claimed a task whose lease had lapsed while another worker held it.

    Written by ``tasks.leases`` in the claim's own transaction, so a takeover
    without its record cannot exist. A lease its holder released is handed on,
    not taken over, and leaves no row.
    """

    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="lease_takeovers")
    worker_id = models.CharField(max_length=200)  # the new holder
    token = models.PositiveBigIntegerField()  # the new fencing token
    previous_worker_id = models.CharField(max_length=200)
    stale_token = models.PositiveBigIntegerField()  # every write fenced by it is now refused
    previous_heartbeat_at = models.DateTimeField()  # the previous holder's last sign of life
    previous_expires_at = models.DateTimeField()
    taken_at = models.DateTimeField()
    # Chained per task (``audit.chain.verify_takeovers``), head on ``Task.takeover_head``; all ""
    # on takeovers written before they were chained (audit migration 0011).
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64, blank=True, default="")
    key_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        indexes = [
            # The task page and API: a task's newest takeovers.
            models.Index(fields=["task", "-taken_at"], name="takeover_task_taken"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.worker_id} took #{self.stale_token} from {self.previous_worker_id}"


class Tombstone(models.Model):
    """A task deleted by retention: what its chain was when it went.

    Not a foreign key: the task is gone. ``state_version`` is also the number
    of events deleted with it (a chain holds v1..vN), so per-tenant counts in an
    anchor stay comparable after retention. ``signing_key`` and ``signature``:
    Ed25519 by the anchor signing key (``audit.tombstones``), which the
    application and whoever holds the chain key do not have, so a tombstone
    cannot be planted to excuse a task deleted by hand. ``key_id`` and ``mac``
    are the older seal with the chain key, kept on every row (not enough alone).
    """

    task_id = models.UUIDField(unique=True)  # one per task; also the index verify reads by
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    task_type = models.CharField(max_length=64, blank=True, default="")
    state_version = models.PositiveIntegerField()  # the task's last version
    audit_head = models.CharField(max_length=64)  # the task's last chain head
    deleted_at = models.DateTimeField()
    reason = models.CharField(max_length=200)
    key_id = models.CharField(max_length=32)
    mac = models.CharField(max_length=64)
    # Fingerprint of the anchor key that signed it, and the signature (base64); "" on tombstones
    # written before they were signed, which no longer account for an anchored task.
    signing_key = models.CharField(max_length=16, blank=True, default="")
    signature = models.CharField(max_length=88, blank=True, default="")

    def __str__(self) -> str:
        return f"tombstone {self.task_id} v{self.state_version} ({self.reason})"


class AnchorRequest(models.Model):
    """A doorbell: something consequential committed, so the anchor job anchors at its next poll.

    Inserted in the transaction it is about (``tasks.audit_paths.ring_after``, retention), so
    it exists exactly when that commit does; deleted by the anchor job once an anchor covers it
    (``audit.anchor.anchor_if_due``). Insert-only while pending: no row is contended.
    """

    requested_at = models.DateTimeField()
    reason = models.CharField(max_length=64)  # the trigger, or "retention"
    task_id = models.UUIDField(null=True, blank=True)

    def __str__(self) -> str:
        return f"anchor requested {self.requested_at:%Y-%m-%d %H:%M:%S} ({self.reason})"


class AnchorRun(models.Model):
    """One anchor the job wrote: when, its file name, how many tasks. Shown by the integrity badge.

    A display of the unanchored window, not evidence: ``verify_audit --against`` reads the
    signed files themselves.
    """

    created_at = models.DateTimeField(db_index=True)
    name = models.CharField(max_length=100)
    tasks = models.PositiveBigIntegerField()

    def __str__(self) -> str:
        return self.name


class VerifiedThrough(models.Model):
    """How far a task's chain was last found whole, so a view hashes only the events after it.

    A cache of a result, not evidence: ``mac`` is HMAC-SHA256 under a chain key (``key_id``) over
    the task, version and hash, so a row planted or moved forward by someone without the chain key is
    ignored (the chain is then verified in full). Not a foreign key: retention deletes the task as the
    owner, and an orphan row (one per deleted task) is never read again (``audit.verify``).
    """

    task_id = models.UUIDField(primary_key=True)
    state_version = models.PositiveIntegerField()
    hash = models.CharField(max_length=64)  # the event at ``state_version``'s hash when verified
    key_id = models.CharField(max_length=32)
    mac = models.CharField(max_length=64)
    verified_at = models.DateTimeField()  # when the whole chain was last verified (a mark expires)

    def __str__(self) -> str:
        return f"{self.task_id} verified through v{self.state_version}"
