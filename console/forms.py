from __future__ import annotations

from django import forms

from runtime import controls


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
