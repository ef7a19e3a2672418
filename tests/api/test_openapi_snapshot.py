"""The OpenAPI document is pinned: a change to it is a change to the API's contract, made on purpose.

Refactors of the read side (issue 22) must leave it byte-identical. A deliberate API change
regenerates the pinned copy in the same commit::

    UPDATE_OPENAPI_SNAPSHOT=1 .venv/bin/pytest tests/api/test_openapi_snapshot.py

The document is generated the way ``manage.py spectacular`` writes it, in the test settings (so it
names the task types the suite registers, as the served ``/api/schema/`` does in a test run).
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management import call_command

PINNED = Path(__file__).resolve().parent.parent / "fixtures" / "openapi.json"


def test_the_openapi_document_is_the_pinned_one(tmp_path: Path) -> None:
    built = tmp_path / "openapi.json"
    call_command("spectacular", format="openapi-json", file=str(built))
    if os.environ.get("UPDATE_OPENAPI_SNAPSHOT") == "1":
        PINNED.write_bytes(built.read_bytes())
    assert built.read_bytes() == PINNED.read_bytes(), (
        "the OpenAPI document changed; if on purpose, regenerate tests/fixtures/openapi.json"
        " (see this module's docstring)"
    )
