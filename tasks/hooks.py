"""Named points where the kernel calls back code that builds on it, registered at app loading.

A transition cannot import what calls it: ``tasks.children`` and
``tasks.cancellation`` advance tasks themselves, and the layers above import
the kernel, never the other way round. So the kernel declares a point here, and
whoever acts there registers a hook from its ``AppConfig.ready`` (the kernel's
own from ``tasks.apps``). Unlike a Django signal a point is typed, lists its
hooks in the order they run (``names()``), and holds each name once: what runs
after a transition can be read from here and ``tasks.apps``, and is tested.

When each point runs is the kernel's promise:

- ``after_task_ended(task)``: after the commit of a task's terminal transition,
  in the process that committed it, before ``advance`` returns; ``task`` is the
  row as committed. A hook that raises stops the hooks after it and reaches the
  caller of ``advance`` (the transition stays committed), so a hook catches
  what it can survive: the kernel's own log and leave the rest to the sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from tasks.models import Task

Subject = TypeVar("Subject")


class HookPoint(Generic[Subject]):
    """One point the kernel calls at, with the hooks registered there, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._hooks: dict[str, Callable[[Subject], None]] = {}  # in the order they were registered

    def register(self, name: str, hook: Callable[[Subject], None]) -> None:
        """Run ``hook`` at this point, after the hooks registered before it.

        Registering the same hook under the same name again changes nothing (an
        ``AppConfig.ready`` may run twice); another hook under a taken name is
        refused with ``ValueError``.
        """
        held = self._hooks.setdefault(name, hook)
        if held != hook:
            raise ValueError(f"{self.name} already has a hook named {name!r}: {held!r}")

    def names(self) -> tuple[str, ...]:
        """The names of the hooks, in the order they run."""
        return tuple(self._hooks)

    def run(self, subject: Subject) -> None:
        """Call every hook with ``subject``, in order (one raising stops the rest and propagates)."""
        for hook in tuple(self._hooks.values()):
            hook(subject)


after_task_ended: HookPoint[Task] = HookPoint("after_task_ended")
