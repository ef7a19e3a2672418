from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from django import forms

from approvals import selectors as approval_selectors
from approvals.models import ApprovalStatus
from runtime import controls
from tasks import registry
from tenancy.models import Tenant


class ControlForm(forms.Form):
    expected_version = forms.IntegerField(min_value=1, max_value=2**31 - 1, widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=2000, widget=forms.TextInput(attrs={"placeholder": "Reason (required)"})
    )
    scope = forms.ChoiceField(
        choices=[(s, s) for s in controls.CANCEL_SCOPES], initial="task", required=False
    )
    escalate_to = forms.ChoiceField(
        choices=[(r, r) for r in controls.ESCALATION_ROLES], initial="admin", required=False
    )


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    digest = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput)
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))
    # Approving takes a second step: the confirm page posts this back (no JavaScript needed).
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)


class InboxForm(forms.Form):
    """The approvals list's filters: every one a select, so nothing free-form reaches a query."""

    status = forms.ChoiceField(required=False)
    sort = forms.ChoiceField(required=False)
    task_type = forms.ChoiceField(required=False, label="Type")
    tenant = forms.ChoiceField(required=False)
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)

    def __init__(self, data: Any, *, tenants: Iterable[Tenant]) -> None:
        super().__init__(data)
        self.tenant_ids = {tenant.slug: tenant.pk for tenant in tenants}
        choices: dict[str, list[tuple[str, str]]] = {
            "status": list(approval_selectors.STATUSES.items()),
            "sort": [(key, sort[0]) for key, sort in approval_selectors.SORTS.items()],
            "task_type": [("", "any"), *((name, name) for name in registry.names())],
            "tenant": [("", "any"), *((slug, slug) for slug in self.tenant_ids)],
        }
        for name, options in choices.items():
            cast(forms.ChoiceField, self.fields[name]).choices = options

    def query(self) -> dict[str, Any]:
        """Keyword arguments for ``approvals.selectors.inbox_page``; an invalid choice is its default."""
        self.is_valid()  # cleaned_data keeps the fields that are valid
        data = self.cleaned_data
        return {
            "status": data.get("status") or ApprovalStatus.PENDING.value,
            "sort": data.get("sort") or "time_left",
            "task_type": data.get("task_type") or "",
            "tenant_id": self.tenant_ids.get(data.get("tenant") or ""),
            "cursor": data.get("after") or "",
        }
