"""Checkpoints written by code other than the running code (the demo's and the tests' helper).

A stored body edited by SQL is refused as tampering (``checkpoint_digest_mismatch``)
before anything reads it. To show how the running code treats a checkpoint that
another deployment legitimately wrote (a newer schema, a step since renamed,
an older shape), write it through a real transition inside ``written_as``: the
row's digest and its audit event then agree with the foreign body.

It lives in ``demo`` (the top layer, free to import the kernel) so that
``seed_demo`` and the tests (``tests.foreign_checkpoints``) share one helper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tasks import checkpoints, transitions
from tasks.models import Checkpoint


@contextmanager
def written_as(**fields: Any | Callable[[Checkpoint], Any]) -> Iterator[None]:
    """Checkpoints written inside carry ``fields`` (``body``, ``schema_version``, ``codec``).

    A callable value is called with the row the running code would have
    written and returns the value to store instead.
    """
    real = transitions._checkpoint_for

    def foreign(*args: Any, **kwargs: Any) -> Checkpoint:
        row = real(*args, **kwargs)
        for name, value in fields.items():
            setattr(row, name, value(row) if callable(value) else value)
        row.digest = checkpoints.digest(row.body)
        return row

    with mock.patch.object(transitions, "_checkpoint_for", foreign):
        yield
