"""What the login page says beside its form. Nothing, unless an app above the console registers a hint
and the run is a development one (DEBUG on): the demo registers its users (``demo.apps``), so a
newcomer at ``/accounts/login/`` sees whom to log in as. A production run never lists accounts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.conf import settings

Hint = Callable[[], Sequence[str]]
_HINTS: list[Hint] = []


def register(hint: Hint) -> None:
    """Add ``hint`` (called on each login page in a development run; it answers lines to show)."""
    if hint not in _HINTS:
        _HINTS.append(hint)


def hints() -> list[str]:
    if not settings.DEBUG:
        return []
    return [line for hint in _HINTS for line in hint()]
