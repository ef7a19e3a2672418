"""The console's incremental chain check: a verified-through mark per task, only newer events hashed.

What is guaranteed against someone with database write access but not the chain key: a view still
catches every change after the mark, a rewritten hash of the marked event and a log cut below it; a
planted or moved mark (its MAC is the chain key's) is ignored. An edit of an older event's fields that
leaves its stored hash is caught by the full verification (the history's "verify the whole chain",
``verify_audit``, every signed export), and by the first view once the mark expires (a day after the
chain was last verified in full).
"""

from __future__ import annotations

import json
from datetime import timedelta
from unittest import mock

import pytest
from django.test import Client

from audit import chain, verify
from audit.models import TransitionEvent, VerifiedThrough
from tasks.audit_paths import verify_chain
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.audit.owner import task_with_history, triggers_off
from tests.conftest import progress

pytestmark = pytest.mark.django_db


@pytest.fixture
def hashed(monkeypatch) -> list[int]:
    """How many event links were hashed, counted at ``audit.chain.link_hash``."""
    count = [0]
    real = chain.link_hash

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(chain, "link_hash", counting)
    return count


def more(task, steps: int):
    for n in range(steps):
        task = advance(
            task.id, task.state_version, State.READY, actor=Actor.worker("w"), progress=progress(f"m{n}")
        )
    return task


def view(task):
    return verify_chain(task, since_verified=True, remember=True)


def edit_without_the_key(task, version: int, reason: str) -> None:
    """Change an event's reason in place, its stored hash left alone (no chain key needed)."""
    with triggers_off("audit_transitionevent") as cursor:
        cursor.execute(
            "UPDATE audit_transitionevent SET reason = %s WHERE task_id = %s AND state_version = %s",
            [reason, task.id, version],
        )


def test_a_view_hashes_only_the_events_after_the_mark(acme, hashed):
    task = task_with_history(acme, steps=29)  # v1..v30
    assert view(task) is None and hashed[0] == 30  # the first view verifies everything and marks it
    assert VerifiedThrough.objects.get(task_id=task.id).state_version == 30

    hashed[0] = 0
    assert view(task) is None and hashed[0] == 0  # nothing new: nothing hashed
    task = more(task, 3)
    hashed[0] = 0
    assert view(task) is None and hashed[0] == 3  # O(new events)
    assert VerifiedThrough.objects.get(task_id=task.id).state_version == 33


def test_the_incremental_result_equals_the_full_verification(acme):
    task = task_with_history(acme, steps=5)
    assert view(task) is None and verify_chain(task) is None
    task = more(task, 2)
    edit_without_the_key(task, 7, "edited after the mark")  # a new event, after the mark
    incremental, full = view(task), verify_chain(task)
    assert incremental is not None and full is not None
    assert incremental.state_version == full.state_version == 7 and incremental.problem == full.problem
    assert VerifiedThrough.objects.get(task_id=task.id).state_version == 6  # never moved past a break


def test_an_old_event_edited_in_place_is_caught_by_the_full_verification(acme, auditor, tmp_path):
    task = task_with_history(acme, steps=5)
    assert view(task) is None
    edit_without_the_key(task, 2, "rewritten history")

    full = verify_chain(task)
    assert full is not None and full.state_version == 2  # what an auditor's full check sees
    client = Client()
    client.force_login(auditor)
    page = client.get(f"/console/audit/tasks/{task.id}/", {"verify": "full"}).content.decode()
    assert "Chain broken" in page and "v2" in page
    exported = b"".join(client.get(f"/console/audit/tasks/{task.id}/export.json").streaming_content)
    assert json.loads(exported)["chain"] == {
        "verified": False,
        "problem": str(full),
        "version": 2,
        "checked": "every link with the chain keys and the path through the transition table",
    }


def test_a_rewritten_hash_of_the_marked_event_is_caught_by_a_view(acme):
    task = task_with_history(acme, steps=3)
    assert view(task) is None
    with triggers_off("audit_transitionevent") as cursor:
        cursor.execute(
            "UPDATE audit_transitionevent SET hash = %s WHERE task_id = %s AND state_version = 4",
            ["e" * 64, task.id],
        )
    broken = view(task)
    assert broken is not None and broken.state_version == 4 and "hash changed" in broken.problem


def test_a_log_cut_below_the_mark_is_caught_by_a_view(acme):
    task = task_with_history(acme, steps=3)
    assert view(task) is None
    with triggers_off("audit_transitionevent", "tasks_task") as cursor:
        cursor.execute(
            "DELETE FROM audit_transitionevent WHERE task_id = %s AND state_version = 4", [task.id]
        )
        cursor.execute("UPDATE tasks_task SET state_version = 3 WHERE id = %s", [task.id])
    broken = view(task)
    assert broken is not None and "verified through v4" in broken.problem


def test_a_mark_moved_forward_without_the_key_is_ignored(acme, hashed):
    task = task_with_history(acme, steps=3)
    assert view(task) is None
    task = more(task, 1)
    edit_without_the_key(task, 5, "forged")
    # The attacker moves the mark over the forged event; without the chain key the MAC cannot follow.
    newest = TransitionEvent.objects.get(task_id=task.id, state_version=5)
    VerifiedThrough.objects.filter(task_id=task.id).update(state_version=5, hash=newest.hash)

    hashed[0] = 0
    broken = view(task)
    assert broken is not None and broken.state_version == 5
    assert hashed[0] >= 5  # the mark was ignored: the chain was read from v1


def test_the_history_page_offers_the_full_verification(acme, auditor, hashed):
    task = task_with_history(acme, steps=4)
    client = Client()
    client.force_login(auditor)
    page = client.get(f"/console/audit/tasks/{task.id}/").content.decode()
    assert "Chain intact" in page and "?verify=full" in page
    hashed[0] = 0
    client.get(f"/console/audit/tasks/{task.id}/")
    assert hashed[0] == 0  # the second view hashes nothing
    full = client.get(f"/console/audit/tasks/{task.id}/", {"verify": "full"}).content.decode()
    assert "Verified in full" in full and hashed[0] >= 5


def test_a_mark_expires_so_a_view_verifies_in_full_again_and_sees_an_old_edit(acme, hashed):
    task = task_with_history(acme, steps=4)
    assert view(task) is None
    first = VerifiedThrough.objects.get(task_id=task.id).verified_at
    task = more(task, 1)
    assert view(task) is None  # moved on incrementally: keeps the time of the full verification
    assert VerifiedThrough.objects.get(task_id=task.id).verified_at == first
    edit_without_the_key(task, 2, "old history rewritten")
    assert view(task) is None  # within its age a view does not rehash v2 (the full check does)

    later = first + verify.MARK_MAX_AGE + timedelta(seconds=1)
    with mock.patch.object(verify.timezone, "now", return_value=later):
        hashed[0] = 0
        broken = view(task)
    assert broken is not None and broken.state_version == 2 and hashed[0] >= 2
