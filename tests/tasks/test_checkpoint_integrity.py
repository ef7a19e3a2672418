"""A stored checkpoint is used only if it is exactly what its transition wrote.

Every checkpoint row carries the SHA-256 of its body, and the audit event of
the same version records that digest inside its chain hash. Loading checks the
size, the codec, the digest (row and event) and the ``schema_version`` column;
any mismatch quarantines the task with a precise reason. Rows written before
digests existed stay readable.
"""

from __future__ import annotations

import hashlib
import json
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, event_hash
from audit.models import TransitionEvent
from audit.verify import verify_task
from tasks import checkpoints, services
from tasks.models import Checkpoint, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import api_client_for, make_task, progress
from tests.foreign_checkpoints import written_as

pytestmark = pytest.mark.django_db


def stepped(tenant, **facts) -> Task:
    """A task one worker step in (v2), whose checkpoint holds ``facts``."""
    task = make_task(tenant)
    return advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("pay", **facts))


def edit_latest(task: Task, sql_set: str, params: list) -> None:
    """Change the newest checkpoint row by SQL, behind the application's back: as its owner, around
    the trigger that lets only ``body`` change (tasks migration 0007)."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses pending FK checks
        cursor.execute("ALTER TABLE tasks_checkpoint DISABLE TRIGGER tasks_checkpoint_append_only")
        cursor.execute(
            f"UPDATE tasks_checkpoint SET {sql_set} WHERE task_id = %s AND state_version = %s",
            [*params, task.id, task.state_version],
        )
        assert cursor.rowcount == 1
        cursor.execute("ALTER TABLE tasks_checkpoint ENABLE TRIGGER tasks_checkpoint_append_only")


def resumed(task: Task) -> Task:
    """Load the resume point as a worker would; return the task as stored afterwards."""
    services.task_resume_point(task.id, actor=Actor.system("tests"))
    return Task.objects.get(pk=task.pk)


def assert_quarantined(task: Task, reason: str) -> None:
    stored = resumed(task)
    assert (stored.state, stored.state_reason) == (State.QUARANTINED, reason)
    assert stored.events.get(state_version=stored.state_version).reason_code == reason


def test_every_checkpoint_carries_the_digest_of_its_body_and_its_event_records_it(acme):
    task = stepped(acme, amount="12.34")
    row = Checkpoint.objects.get(task=task, state_version=2)
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert row.digest == hashlib.sha256(row.body.encode()).hexdigest() == event.checkpoint_digest
    assert services.latest_checkpoint(task).facts == {"amount": "12.34"}


def test_the_vouched_read_of_the_newest_checkpoint_is_one_round_trip(acme):
    """What a worker resumes from: the newest checkpoint and the whole event vouching for it (its keyed
    link checked), read together in one statement."""
    task = stepped(acme, amount="12.34")
    task = advance(task.id, 2, State.READY, actor=Actor.worker("w1"), progress=progress("ship", amount="1"))
    with CaptureQueriesContext(connection) as captured:
        point = services.latest_checkpoint(task, vouched=True)
    assert (point.step, point.facts, point.state_version) == ("ship", {"amount": "1"}, 3)
    assert len(captured.captured_queries) == 1, [q["sql"] for q in captured.captured_queries]


def test_a_vouched_read_refuses_an_event_not_written_with_the_chain_key(acme):
    task = stepped(acme, amount="12.34")
    with connection.cursor() as cursor:  # as the app role could insert it: no chain key, no keyed link
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE audit_transitionevent DISABLE TRIGGER audit_transitionevent_append_only")
        cursor.execute(
            "UPDATE audit_transitionevent SET hash = %s WHERE task_id = %s AND state_version = 2",
            ["f" * 64, task.id],
        )
        cursor.execute("ALTER TABLE audit_transitionevent ENABLE TRIGGER audit_transitionevent_append_only")
    assert services.latest_checkpoint(task).facts == {"amount": "12.34"}  # its digest alone still matches
    with pytest.raises(checkpoints.CheckpointUnreadable, match="without the chain key") as refused:
        services.latest_checkpoint(task, vouched=True)
    assert refused.value.reason == checkpoints.CheckpointUnreadable.DIGEST_MISMATCH


def test_one_byte_of_a_body_changed_by_sql_quarantines_with_the_digest_reason(acme):
    task = stepped(acme, amount="12.34")
    edit_latest(task, "body = replace(body, '12.34', '92.34')", [])
    assert_quarantined(task, checkpoints.CheckpointUnreadable.DIGEST_MISMATCH)


def test_an_edited_body_with_a_recomputed_row_digest_is_refused_by_its_audit_event(acme):
    task = stepped(acme, amount="12.34")
    body = Checkpoint.objects.get(task=task, state_version=2).body.replace("12.34", "92.34")
    edit_latest(task, "body = %s, digest = %s", [body, checkpoints.digest(body)])
    with pytest.raises(checkpoints.CheckpointUnreadable, match="audit event recorded") as refused:
        services.latest_checkpoint(task)
    assert refused.value.reason == checkpoints.CheckpointUnreadable.DIGEST_MISMATCH


def test_a_body_over_the_size_limit_quarantines_as_too_large(acme, settings):
    task = stepped(acme, blob="x" * 5000)
    settings.CHECKPOINT_MAX_BYTES = 4096
    assert_quarantined(task, checkpoints.CheckpointUnreadable.TOO_LARGE)


def test_a_transition_refuses_to_write_a_checkpoint_over_the_size_limit(acme, settings):
    task = make_task(acme)
    settings.CHECKPOINT_MAX_BYTES = 4096
    with pytest.raises(ValueError, match="checkpoint_too_large"):
        advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("pay", blob="x" * 5000))
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_codec_label_the_code_does_not_read_quarantines_as_codec_mismatch(acme):
    task = make_task(acme)
    with written_as(codec="msgpack/v1"):
        task = advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("pay"))
    assert_quarantined(task, checkpoints.CheckpointUnreadable.CODEC_MISMATCH)


def test_a_schema_column_that_disagrees_with_the_body_quarantines_as_schema_mismatch(acme):
    task = stepped(acme)
    edit_latest(task, "schema_version = 1", [])
    assert_quarantined(task, checkpoints.CheckpointUnreadable.SCHEMA_MISMATCH)


def test_a_checkpoint_written_before_digests_existed_stays_readable(acme):
    task = make_task(acme)
    with mock.patch.object(checkpoints, "digest", return_value=""):  # what the code wrote before
        task = advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("old"))
    row = Checkpoint.objects.get(task=task, state_version=2)
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert (row.digest, event.checkpoint_digest) == ("", "")
    assert services.latest_checkpoint(task).step == "old"
    assert verify_task(task) is None


def test_an_event_without_a_checkpoint_digest_hashes_exactly_as_before_digests_existed():
    fields = {name: "" for name in HASHED_FIELDS} | {"state_version": 1, "attempt": 0}
    before = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(("0" * 64 + before).encode()).hexdigest()
    assert OPTIONAL_HASHED_FIELDS == ("checkpoint_digest",)
    assert (
        event_hash("0" * 64, fields) == event_hash("0" * 64, {**fields, "checkpoint_digest": ""}) == expected
    )
    assert event_hash("0" * 64, {**fields, "checkpoint_digest": "ab" * 32}) != expected


def test_an_event_whose_recorded_checkpoint_digest_is_edited_breaks_the_chain(acme):
    task = stepped(acme)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE audit_transitionevent DISABLE TRIGGER audit_transitionevent_append_only")
        cursor.execute(
            "UPDATE audit_transitionevent SET checkpoint_digest = %s"
            " WHERE task_id = %s AND state_version = 2",
            ["0" * 64, task.id],
        )
        cursor.execute("ALTER TABLE audit_transitionevent ENABLE TRIGGER audit_transitionevent_append_only")
    link = verify_task(task)
    assert link is not None and link.state_version == 2 and "contents do not match" in link.problem


def test_checkpoints_check_reports_a_tampered_checkpoint_with_its_reason(acme, capsys):
    healthy, tampered = stepped(acme, amount="12.34"), stepped(acme, amount="12.34")
    edit_latest(tampered, "body = replace(body, '12.34', '92.34')", [])
    with pytest.raises(CommandError, match="1 checkpoints"):
        call_command("checkpoints", "check")
    out = capsys.readouterr().out
    assert f"UNREADABLE {tampered.id} checkpoint_digest_mismatch:" in out and str(healthy.id) not in out


def test_the_api_and_console_show_a_tampered_checkpoint_as_unreadable_not_a_500(acme, operator):
    task = stepped(acme, amount="12.34")
    edit_latest(task, "body = replace(body, '12.34', '92.34')", [])

    response = api_client_for(operator).get(f"/api/tasks/{task.id}/checkpoints/")
    assert response.status_code == 200
    rows = {row["state_version"]: row for row in response.json()["results"]}
    assert rows[1]["readable"] is True and rows[1]["digest"]
    assert (rows[2]["readable"], rows[2]["document"]["reason"]) == (False, "checkpoint_digest_mismatch")

    console = Client()
    console.force_login(operator)
    assert console.get(f"/console/tasks/{task.id}/").status_code == 200
    assert api_client_for(operator).get(f"/api/tasks/{task.id}/").status_code == 200
