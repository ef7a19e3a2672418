from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from django import forms
from django.core.validators import ProhibitNullCharactersValidator

from approvals import selectors as approval_selectors
from approvals.models import ApprovalStatus
from runtime import controls
from tasks import registry, values
from tenancy.models import Tenant

# Controls that stop or hold a task: the server refuses them without ``confirm`` ticked.
DESTRUCTIVE = frozenset({"cancel", "quarantine"})


UNSTORABLE = "unstorable"  # the code of storable_text's error


def storable_text(value: Any) -> None:
    """Refuse text no database column can hold (``tasks.values.text_problem``: NUL, lone surrogates)."""
    if isinstance(value, str) and (problem := values.text_problem(value)):
        raise forms.ValidationError(f"This text {problem}: remove it.", code=UNSTORABLE)


class ConsoleForm(forms.Form):
    """The base of every console form (a test holds every console form to it).

    Each text field refuses NUL and lone surrogates with one clear error (``storable_text``,
    naming the character and where it is) instead of reaching PostgreSQL, which answered a NUL
    in a saved view's name with a 500. It replaces Django's bare "Null characters are not allowed."
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if isinstance(field, forms.CharField):
                kept = [v for v in field.validators if not isinstance(v, ProhibitNullCharactersValidator)]
                field.validators = [*kept, storable_text]

    def unstorable(self) -> str | None:
        """The first text refused by ``storable_text``, as a sentence naming its field; else None."""
        for name, errors in self.errors.as_data().items():
            for error in errors:
                if error.code == UNSTORABLE:
                    label = self.fields[name].label or name.replace("_", " ").capitalize()
                    return f"{label}: {' '.join(error.messages)} Nothing was applied."
        return None


class SavedViewForm(ConsoleForm):
    """A queue filter saved under a name (``tenancy.services.saved_view_create`` checks the rest)."""

    name = forms.CharField(required=False, strip=False)
    query = forms.CharField(required=False, strip=False)
    share = forms.CharField(required=False, max_length=50)  # a tenant's slug; empty: a personal view

    def problem(self) -> str:
        return self.unstorable() or self.errors.as_text()


def _problem(form: ConsoleForm) -> str:
    """One sentence for the message shown after a refused post (the typed text is kept)."""
    if unstorable := form.unstorable():
        return unstorable
    if "reason" in form.errors:
        return "A reason is required (up to 2000 characters): nothing was applied."
    if "confirm" in form.errors:
        return "Tick the confirmation box: nothing was applied."
    return "Not applied: " + "; ".join(
        f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items()
    )


class ControlForm(ConsoleForm):
    """One operator control (``runtime.controls.CONTROLS``); the page builds one per control.

    Built with ``control=`` it enforces that control's confirmation; render it
    with ``auto_id="%s-<control>"`` so every field id on the page is unique.
    """

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
    confirm = forms.BooleanField(required=False)

    def __init__(self, *args: Any, control: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control = control
        name = controls.label(control)
        self.fields["reason"].label = f"Reason to {name}" if control else "Reason"
        self.fields["confirm"].label = f"Yes, {name} this task"
        if control in DESTRUCTIVE:
            self.fields["confirm"].widget.attrs["required"] = True

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.control in DESTRUCTIVE and not data.get("confirm"):
            self.add_error("confirm", f"{controls.label(self.control).capitalize()} needs confirmation.")
        return data

    def problem(self) -> str:
        return _problem(self)


class AnswerForm(ConsoleForm):
    """An operator's answer to the question a ``waiting_input`` task asks."""

    expected_version = forms.IntegerField(min_value=1, max_value=2**31 - 1, widget=forms.HiddenInput)
    answer = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, question: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "%s-input")
        super().__init__(*args, **kwargs)
        self.fields["answer"].label = question or "Answer"

    def problem(self) -> str:
        if unstorable := self.unstorable():
            return unstorable
        if "answer" in self.errors:
            return "An answer is required (up to 2000 characters): nothing was sent."
        return _problem(self)


class RerunForm(ConsoleForm):
    """Start a new task that runs a failed, expired or canceled one again."""

    reason = forms.CharField(
        max_length=2000,
        label="Reason to rerun",
        widget=forms.TextInput(attrs={"placeholder": "Reason (required)"}),
    )
    # Set when the page is drawn: the same form sent twice starts one rerun, not two.
    idempotency_key = forms.CharField(max_length=200, required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "%s-rerun")
        super().__init__(*args, **kwargs)

    def problem(self) -> str:
        return _problem(self)


class ForkForm(ConsoleForm):
    """Resume an ended task from one checkpoint version as a new task (``tasks.forks``).

    Built with ``editable=`` (the input fields the task type lets a fork change, each with the value
    it had): one ``input_<name>`` field per field, blank or unchanged meaning as it was.
    """

    INPUT = "input_"

    version = forms.IntegerField(min_value=1, max_value=2**31 - 1, widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=2000,
        label="Reason to resume from this version",
        widget=forms.TextInput(attrs={"placeholder": "Reason (required)"}),
    )
    # It starts a new task that asks every approval again: the server refuses it unticked.
    confirm = forms.BooleanField(label="Yes, start a new task from this checkpoint")
    # Set when the page is drawn: the same form sent twice starts one fork, not two.
    idempotency_key = forms.CharField(max_length=200, required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, editable: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "%s-fork")
        super().__init__(*args, **kwargs)
        self.was = {name: "" if value is None else str(value) for name, value in (editable or {}).items()}
        for name, value in self.was.items():
            self.fields[f"{self.INPUT}{name}"] = forms.CharField(
                max_length=2000, required=False, label=name, initial=value
            )

    def input_changes(self) -> dict[str, str]:
        """The editable fields given a new value (a blank or unchanged one is left as it was)."""
        found = {name: self.cleaned_data.get(f"{self.INPUT}{name}", "") for name in self.was}
        return {name: value for name, value in found.items() if value and value != self.was[name]}

    def problem(self) -> str:
        if "confirm" in self.errors:
            return "Tick the confirmation box: no task was started."
        if "reason" in self.errors:
            return "A reason is required (up to 2000 characters): no task was started."
        return _problem(self)


class CompensateForm(ConsoleForm):
    """Undo one effect a canceled task left done: a compensation run (``tasks.compensation``)."""

    action = forms.CharField(max_length=200, widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=2000,
        label="Reason to undo it",
        widget=forms.TextInput(attrs={"placeholder": "Reason (required)"}),
    )
    # It sends a new side effect to a real system: the server refuses it unticked.
    confirm = forms.BooleanField(label="Yes, send the compensating effect")

    def problem(self) -> str:
        return _problem(self)


class RevealForm(ConsoleForm):
    """Reveal one masked field (``protection.reveal``) with a reason: from a checkpoint version, or the
    newest."""

    field = forms.CharField(max_length=64, widget=forms.HiddenInput)
    state_version = forms.IntegerField(
        min_value=1, max_value=2**31 - 1, required=False, widget=forms.HiddenInput
    )
    reason = forms.CharField(max_length=500, label="Reason to reveal")

    def problem(self) -> str:
        if unstorable := self.unstorable():
            return unstorable
        if "reason" in self.errors:
            return "A reason is required to reveal a field (up to 500 characters): nothing was revealed."
        return _problem(self)


class DecisionForm(ConsoleForm):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    digest = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput)
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))
    # Approving takes a second step: the confirm page posts this back (no JavaScript needed).
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)


class InboxForm(ConsoleForm):
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
