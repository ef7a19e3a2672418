"""The shape every console form post shares: validate, one service call, say what happened, go back.

``form_post`` takes a bound form and ``act``, the one service call (its result,
a ``Done``, says the message and, if not back, where to go next). A form with
errors is refused with the form's own sentence (``problem``); a service's
refusal is said by the ``Refusal`` listed for it; either way nothing changed
and the operator goes ``back``. ``keep`` (the task page's drafts) keeps what
they typed for another try. Views stay parse → access check → ``form_post``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect


class PostedForm(Protocol):
    """A bound console form: every one says in one sentence why it was refused."""

    cleaned_data: dict[str, Any]

    def is_valid(self) -> bool: ...

    def problem(self) -> str: ...


@dataclass(frozen=True)
class Done:
    """What the service call did: the message, its level, and where to go next ("" is back)."""

    message: str
    level: int = messages.SUCCESS
    to: str = ""


@dataclass(frozen=True)
class Refusal:
    """A refusal of the service (``errors``) and how the console says it. ``keep``: keep the typed
    text for another try; ``to``: where to go instead of back ("" is back)."""

    errors: type[Exception] | tuple[type[Exception], ...]
    say: Callable[[Any], str]
    keep: bool = True
    to: str = ""


def _nothing() -> None:
    return None


def form_post(
    request: HttpRequest,
    form: PostedForm,
    act: Callable[[dict[str, Any]], Done],
    *,
    back: str,
    refusals: Sequence[Refusal] = (),
    keep: Callable[[], None] = _nothing,
    problem: Callable[[], str] | None = None,
) -> HttpResponse:
    """Validate ``form``, call ``act`` with its data, add the message it returns, redirect.

    ``problem``: the refused form's sentence, when not the form's own ``problem()``.
    """
    if not form.is_valid():
        keep()
        messages.error(request, (problem or form.problem)())
        return redirect(back)
    caught = tuple(error for refusal in refusals for error in _kinds(refusal.errors))
    try:
        done = act(form.cleaned_data)
    except caught as exc:
        refusal = next(refusal for refusal in refusals if isinstance(exc, refusal.errors))
        if refusal.keep:
            keep()
        messages.error(request, refusal.say(exc))
        return redirect(refusal.to or back)
    messages.add_message(request, done.level, done.message)
    return redirect(done.to or back)


def _kinds(errors: type[Exception] | tuple[type[Exception], ...]) -> tuple[type[Exception], ...]:
    return errors if isinstance(errors, tuple) else (errors,)
