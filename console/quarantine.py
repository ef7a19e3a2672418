"""Quarantine triage: the held tasks of the user's tenants, by reason, and what release would do.

The page itself only reads: two queries whatever the number of tasks, one GROUP BY
for the counts per reason and one keyset page of the chosen reason. Its actions
(release, retry migration, cancel, escalate) go to the bulk preview
(``console.bulk``) for the ticked rows or for every task held for the reason:
one reason, a confirmation, then the per-task report. Each task's page has the
same controls one at a time.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.access import QUARANTINE_ROLES, tenant_ids_or_403
from ledger import integrity
from reads import quarantine
from runtime import controls
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for

PAGE = 50
# What the triage page offers (runtime.controls names): each leaves quarantine, or raises the task.
ACTIONS = (
    ("release", "Release (resume validation)"),
    ("retry_migration", "Retry migration, then release"),
    ("cancel", "Cancel"),
    ("escalate", "Escalate"),
)

# What pressing "release" does (quarantined -> resume_validation), from
# runtime.validation and the checkpoint load before it, in the order they run.
RELEASE_CHECKS = (
    "the checkpoint is read again, its sealed fields opened with the keys in FIELD_ENCRYPTION_KEYS "
    "(one the running code still cannot read is quarantined again, with the same reason)",
    "the task's deadline (passed: expired)",
    "the checkpoint's step still exists in the task type (else quarantined)",
    "the owner still operates the tenant, and an approval's approver still holds the role "
    "(else quarantined, or a new approval request)",
    "the model, prompt and tool set are still approved (else replanned on the current ones, "
    "or quarantined if none)",
    "the policy version (changed: replanned or resumed, as the task type says)",
    "each evidence record (changed: refreshed; gone or unstorable: quarantined; "
    "system not answering: retried later)",
)
# Per reason code: what to make sure of before releasing (what release does not fix by itself).
BEFORE_RELEASE = {
    "checkpoint_schema_newer": "Written by newer code: release only once this deployment reads that schema.",
    "checkpoint_unmigratable": "No migration path to the current schema: deploy one first.",
    "checkpoint_corrupt": "The stored checkpoint does not decode: release re-reads it unchanged.",
    "checkpoint_digest_mismatch": "The checkpoint is not what its transition wrote: check the audit "
    "chain (history page) before anything else.",
    "checkpoint_codec_mismatch": "Stored under a codec this code does not read: deploy it first.",
    "checkpoint_schema_mismatch": "The body and its recorded schema disagree: repair it first.",
    "checkpoint_too_large": "The checkpoint exceeds the size limit: release re-reads it unchanged.",
    "checkpoint_undecryptable": "A sealed field cannot be opened (the reason names the field and the key "
    "id): if its key was retired, put it back in FIELD_ENCRYPTION_KEYS (after the current key) and "
    "restart the workers, then retry migration, which releases only once the checkpoint opens. A token "
    "that was altered or moved, or a value erased by retention, no key opens: cancel the task.",
    "event_undecryptable": "A sealed value of the external event the task waits on cannot be opened: put "
    "its retired key back in FIELD_ENCRYPTION_KEYS (after the current key), restart the workers, then "
    "release.",
    "step_error": "A step raised: release once the fix is deployed; it resumes at the same step.",
    "evidence_unstorable": "The outside record cannot be stored as it is: fix it at the source first.",
    "evidence_missing": "The evidence record vanished: restore it, or cancel the task.",
    "resend_limit_reached": "The effect was sent the maximum number of times without landing; "
    "after release it may be sent again with the same key: check the system first.",
    "unknown_step": "The task type no longer has this step: deploy it, or cancel the task.",
    "owner_access_revoked": "The owner no longer operates the tenant: restore the role, or cancel.",
    "runtime_config_unapproved": "No approved runtime config: approve one first.",
    "quarantine": "Held by an operator: read their reason before releasing.",
    integrity.EFFECT_DIGEST_MISMATCH: "An effect it was about to send is not the one that was intended "
    "(or approved): the action row, or the approval's copy, was changed in the database, and nothing was "
    "sent. Releasing holds it again, unsent: find who changed it (history page, access log), then cancel "
    "the task and rerun it if the effect is still due (the rerun intends it afresh from the checked input).",
}


@require_safe
@login_required
def triage(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_or_403(request.user, QUARANTINE_ROLES)
    counts = quarantine.quarantine_counts(tenant_ids)
    codes = [row["code"] for row in counts]
    code = request.GET.get("reason") if request.GET.get("reason") in codes else (codes[0] if codes else None)
    after = quarantine.QuarantineCursor.parse(request.GET.get("after"))
    context = {
        "counts": counts,
        "total": sum(row["n"] for row in counts),
        "code": code,
        "page": quarantine.quarantined_tasks(tenant_ids, code=code, after=after, limit=PAGE)
        if code is not None
        else None,
        "release_checks": RELEASE_CHECKS,
        "before_release": BEFORE_RELEASE.get(code or "", ""),
        "actions": [
            (name, label)
            for name, label in ACTIONS
            if name != "retry_migration" or controls.migration_may_help(code or "")
        ],  # fmt: skip
        "can_act": bool(tenant_ids_for(request.user, [Role.OPERATOR, Role.ADMIN])),
    }
    return render(request, "console/quarantine.html", context)
