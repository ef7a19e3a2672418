"""Lease takeovers on the chain: each task's takeovers are keyed links with their head on the task row.

A takeover is taken in-process here (a short lease lapses, another worker
claims); ``tests/chaos/test_lease_takeover.py`` does it with a SIGKILLed worker.
The tampering is the database owner's, around every trigger (``tests.audit.owner``).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit.anchor import write_anchor
from audit.chain import GENESIS
from audit.keys import current_chain_key
from audit.models import LeaseTakeover
from audit.verify import TAKEOVERS_CHAINED_MIGRATION, verify_task
from tasks import leases
from tasks.models import Task
from tests.audit.owner import triggers_off
from tests.audit.test_tamper import app_role, refused  # noqa: F401 (app_role: a fixture)
from tests.conftest import make_task

pytestmark = pytest.mark.django_db

SHORT_TTL = timedelta(milliseconds=300)


def taken_over(task: Task, *workers: str) -> list[LeaseTakeover]:
    """Each of ``workers`` in turn claims ``task`` with a short lease and lets it lapse."""
    for worker in workers:
        assert leases.claim(task.id, worker_id=worker, region="default", ttl=SHORT_TTL) is not None
        time.sleep(SHORT_TTL.total_seconds() + 0.1)
    return list(LeaseTakeover.objects.filter(task=task).order_by("id"))


def verify(*args: str, capsys) -> tuple[bool, str]:
    """``verify_audit`` with ``args``: (ok, what it printed on stderr)."""
    try:
        call_command("verify_audit", *args)
        ok = True
    except CommandError:
        ok = False
    return ok, capsys.readouterr().err


def delete_takeover(takeover: LeaseTakeover, *, move_head_to: str | None = None) -> None:
    """The owner deletes a takeover row; given ``move_head_to``, also sets the task's head to it."""
    with triggers_off("audit_leasetakeover") as cursor:
        cursor.execute("DELETE FROM audit_leasetakeover WHERE id = %s", [takeover.id])
        if move_head_to is not None:
            cursor.execute(
                "UPDATE tasks_task SET takeover_head = %s WHERE id = %s", [move_head_to, takeover.task_id]
            )


def test_a_takeover_is_a_keyed_link_of_the_tasks_takeover_chain_and_the_task_holds_its_head(acme):
    task = make_task(acme)
    first, second = taken_over(task, "w1", "w2", "w3")

    moves = [(t.previous_worker_id, t.worker_id, t.stale_token, t.token) for t in (first, second)]
    assert moves == [("w1", "w2", 1, 2), ("w2", "w3", 2, 3)]
    assert (first.prev_hash, second.prev_hash) == (GENESIS, first.hash)
    assert first.key_id == second.key_id == current_chain_key().id
    assert Task.objects.get(pk=task.pk).takeover_head == second.hash
    assert verify_task(task) is None


def test_a_task_taken_over_verifies_clean_with_verify_audit(acme, capsys):
    task = make_task(acme)
    taken_over(task, "w1", "w2")
    assert verify("--task", str(task.id), capsys=capsys) == (True, "")


def test_deleting_the_newest_takeover_breaks_the_tasks_takeover_head(acme, capsys):
    task = make_task(acme)
    [takeover] = taken_over(task, "w1", "w2")
    delete_takeover(takeover)

    ok, err = verify(capsys=capsys)
    assert not ok
    assert f"task {task.id} head: task's takeover head does not match the newest takeover" in err


def test_deleting_an_earlier_takeover_breaks_the_next_ones_link(acme):
    task = make_task(acme)
    first, _ = taken_over(task, "w1", "w2", "w3")
    delete_takeover(first)
    assert "prev_hash does not match the previous takeover" in str(verify_task(task))


def test_an_anchor_reports_a_takeover_deleted_after_it_even_with_the_head_moved_back(acme, tmp_path, capsys):
    task = make_task(acme)
    first, second = taken_over(task, "w1", "w2", "w3")
    anchor = write_anchor(tmp_path).path
    delete_takeover(second, move_head_to=first.hash)  # the chain alone now looks whole
    assert verify("--task", str(task.id), capsys=capsys) == (True, "")

    ok, err = verify("--against", str(anchor), capsys=capsys)
    assert not ok
    assert f"task {task.id} v1 (tenant {acme.id}): the anchored lease takeover is missing" in err


def test_a_takeover_row_forged_with_another_key_is_reported(acme, capsys):
    task = make_task(acme)
    [real] = taken_over(task, "w1", "w2")
    forged = LeaseTakeover(
        task=task, worker_id="mallory", token=3, previous_worker_id="w2", stale_token=2,
        previous_heartbeat_at=real.taken_at, previous_expires_at=real.taken_at, taken_at=timezone.now(),
        prev_hash=real.hash, key_id=real.key_id,
    )  # fmt: skip
    forged.hash = "f" * 64  # made without the chain key
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_leasetakeover (task_id, worker_id, token, previous_worker_id, stale_token,"
            " previous_heartbeat_at, previous_expires_at, taken_at, prev_hash, hash, key_id)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [task.id, forged.worker_id, forged.token, forged.previous_worker_id, forged.stale_token,
             forged.previous_heartbeat_at, forged.previous_expires_at, forged.taken_at, forged.prev_hash,
             forged.hash, forged.key_id],
        )  # fmt: skip
        cursor.execute("UPDATE tasks_task SET takeover_head = %s WHERE id = %s", [forged.hash, task.id])

    ok, err = verify(capsys=capsys)
    assert not ok
    assert "takeover #2 (token 2 -> 3): contents do not match the stored hash" in err


def test_an_unchained_takeover_written_since_takeovers_were_chained_is_reported(acme):
    task = make_task(acme)
    LeaseTakeover.objects.create(
        task=task, worker_id="mallory", token=2, previous_worker_id="w1", stale_token=1,
        previous_heartbeat_at=timezone.now(), previous_expires_at=timezone.now(), taken_at=timezone.now(),
    )  # fmt: skip
    assert "unchained, but written after takeovers were chained" in str(verify_task(task))


def test_an_ordinary_claim_writes_no_takeover_and_its_task_verifies_clean(acme):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="w1", region="default")
    leases.release(held)
    assert leases.claim(task.id, worker_id="w2", region="default") is not None
    assert Task.objects.get(pk=task.pk).takeover_head == ""
    assert verify_task(task) is None


def test_unchained_takeovers_from_before_they_were_chained_verify_and_the_chain_starts_after_them(acme):
    task = make_task(acme)
    LeaseTakeover.objects.create(
        task=task, worker_id="w1", token=2, previous_worker_id="w0", stale_token=1,
        previous_heartbeat_at=timezone.now(), previous_expires_at=timezone.now(), taken_at=timezone.now(),
    )  # fmt: skip
    with connection.cursor() as cursor:  # takeovers chained only now: the row above is older history
        cursor.execute(
            "UPDATE django_migrations SET applied = clock_timestamp() WHERE app = %s AND name = %s",
            list(TAKEOVERS_CHAINED_MIGRATION),
        )
    [chained] = [t for t in taken_over(task, "w1", "w2") if t.key_id]  # w1's token 2 lapses, w2 takes it

    assert chained.prev_hash == GENESIS
    assert verify_task(task) is None


def test_the_app_role_moves_a_takeover_head_but_cannot_rewrite_a_takeover(acme, app_role):  # noqa: F811
    task = make_task(acme)
    [takeover] = taken_over(task, "w1", "w2")
    conn = app_role[1]()
    with conn.transaction():  # what a takeover claim writes is the app's (db_roles grants the new column)
        conn.execute("UPDATE tasks_task SET takeover_head = takeover_head WHERE id = %s", [task.id])
    refused(conn, "UPDATE audit_leasetakeover SET hash = prev_hash WHERE id = %s", [takeover.id])
    refused(conn, "DELETE FROM audit_leasetakeover WHERE id = %s", [takeover.id])
