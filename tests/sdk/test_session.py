"""Agents' conversation memory in our database (``runtime.sdk.session``, ``runtime.AgentSessionItem``).

Through the real Agents SDK (``Runner.run`` with a ``DurableSession`` and a scripted SDK model: no
network) and through the sync functions the adapter calls, on PostgreSQL: items sealed at rest,
tenant-scoped, refused when malformed or too large, appended once per committed step even with two
writers at once, and erased and deleted with their task by retention.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import agents
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from audit import sealing
from protection import retention
from runtime.models import AgentSessionItem
from runtime.sdk import session as memory
from runtime.sdk.session import DurableSession, SessionError, SessionItemRefused, SessionItemUnreadable
from tasks import services
from tasks.models import Archive, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

SECRET = "my card is 4242 4242 4242 1881"  # words a customer typed: never stored in clear


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def raw_items() -> list[str]:
    """The ``item`` column as the database holds it, as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT item::text FROM runtime_agentsessionitem ORDER BY position")
        return [text for (text,) in cursor.fetchall()]


def positions() -> list[int]:
    return list(AgentSessionItem.objects.order_by("position").values_list("position", flat=True))


# --- through the SDK -----------------------------------------------------------------------------------


class ScriptedSdkModel(agents.Model):
    """An SDK model answering each call with the next line of its script, keeping what it was sent."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: agents.ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
    ) -> agents.ModelResponse:
        sent = [user(input)] if isinstance(input, str) else [dict(item) for item in input]
        self.inputs.append(json.loads(json.dumps(sent, default=str)))
        text = self.answers.pop(0)
        message = ResponseOutputMessage(
            id=f"msg_{len(self.inputs)}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return agents.ModelResponse(output=[message], usage=agents.Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests do not stream")


def texts(items: list[dict[str, Any]]) -> list[str]:
    """The words of each message item, whatever shape the SDK gave its content."""
    found = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            found.append(content)
        elif isinstance(content, list):
            found.append("".join(part.get("text", "") for part in content if isinstance(part, dict)))
    return found


@pytest.fixture(autouse=True)
def no_tracing():
    agents.set_tracing_disabled(True)  # these runs drive the SDK themselves: nothing of theirs traced
    yield
    agents.set_tracing_disabled(False)  # the process's agent steps trace again (runtime.sdk.tracing)


def test_a_second_run_on_the_session_is_given_the_first_runs_messages(acme):
    model = ScriptedSdkModel("Hello, how can I help?", "You said hi before.")
    agent = agents.Agent(name="support", instructions="Be brief.", model=model)
    run = async_to_sync(agents.Runner.run)

    first = run(agent, "hi", session=DurableSession(acme.pk, "chat-1"))
    second = run(agent, "what did I say?", session=DurableSession(acme.pk, "chat-1"))

    assert (first.final_output, second.final_output) == ("Hello, how can I help?", "You said hi before.")
    assert texts(model.inputs[0]) == ["hi"]
    assert texts(model.inputs[1]) == ["hi", "Hello, how can I help?", "what did I say?"]
    stored = memory.read(acme.pk, "chat-1")
    assert texts(stored) == ["hi", "Hello, how can I help?", "what did I say?", "You said hi before."]
    assert positions() == [0, 1, 2, 3]


def test_the_sdk_session_pops_limits_and_clears(acme):
    session = DurableSession(acme.pk, "chat-2", session_settings=agents.SessionSettings(limit=2))
    async_to_sync(session.add_items)([user("one"), user("two"), user("three")])

    assert texts(async_to_sync(session.get_items)()) == ["two", "three"]  # the settings' default limit
    assert texts(async_to_sync(session.get_items)(1)) == ["three"]
    assert async_to_sync(session.pop_item)() == user("three")
    async_to_sync(session.clear_session)()
    assert async_to_sync(session.get_items)() == [] and async_to_sync(session.pop_item)() is None


# --- sealing -------------------------------------------------------------------------------------------


def test_items_are_stored_sealed_and_the_column_holds_no_clear_text(acme):
    memory.append(acme.pk, "chat", [user(SECRET), {"type": "function_call_output", "output": SECRET}])

    stored = raw_items()
    assert len(stored) == 2
    for text in stored:
        assert "4242" not in text and "card" not in text and "user" not in text
        assert sealing.is_envelope(json.loads(text))
    assert memory.read(acme.pk, "chat")[0] == user(SECRET)


def test_an_item_copied_into_another_session_or_place_is_refused_when_read(acme, globex):
    memory.append(acme.pk, "mine", [user(SECRET), user("second")])
    memory.append(globex.pk, "theirs", [user("theirs")])
    first, second = AgentSessionItem.objects.filter(session_id="mine").order_by("position")
    # Someone with write access moves acme's sealed item into globex's session: it does not open there.
    AgentSessionItem.objects.filter(session_id="theirs").update(item=first.item)
    with pytest.raises(SessionItemUnreadable) as refused:
        memory.read(globex.pk, "theirs")
    assert refused.value.problem == sealing.Unopenable.MISPLACED and SECRET not in str(refused.value)
    # Nor in another place of its own session; and pop removes nothing it cannot open.
    AgentSessionItem.objects.filter(pk=second.pk).update(item=first.item)
    with pytest.raises(SessionItemUnreadable):
        memory.pop(acme.pk, "mine")
    assert AgentSessionItem.objects.filter(session_id="mine").count() == 2


def test_an_update_of_anything_but_the_item_is_refused_by_the_database(acme):
    memory.append(acme.pk, "chat", [user("one"), user("two")])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AgentSessionItem.objects.filter(position=1).update(position=7)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AgentSessionItem.objects.update(session_id="another")
    assert texts(memory.read(acme.pk, "chat")) == ["one", "two"]


def test_key_rotation_reseals_session_items_and_they_open_under_the_new_key_alone(acme, settings):
    old, new = f"old:{Fernet.generate_key().decode()}", f"new:{Fernet.generate_key().decode()}"
    settings.FIELD_ENCRYPTION_KEYS = old
    memory.append(acme.pk, "chat", [user(SECRET)])
    settings.FIELD_ENCRYPTION_KEYS = f"{new},{old}"

    out = io.StringIO()
    call_command("rotate_keys", stdout=out, stderr=io.StringIO())

    assert "agent sessions: 1 rows re-sealed under 'new' (fields from old: 1)" in out.getvalue()
    settings.FIELD_ENCRYPTION_KEYS = new
    assert memory.read(acme.pk, "chat") == [user(SECRET)]


# --- tenants, order, limits ------------------------------------------------------------------------------


def test_a_session_of_one_tenant_is_invisible_to_another_with_the_same_id(acme, globex):
    memory.append(acme.pk, "support", [user("acme's words")])
    theirs = DurableSession(globex.pk, "support")

    assert async_to_sync(theirs.get_items)() == []
    assert async_to_sync(theirs.pop_item)() is None
    async_to_sync(theirs.clear_session)()
    async_to_sync(theirs.add_items)([user("globex's words")])

    assert texts(memory.read(acme.pk, "support")) == ["acme's words"]
    assert texts(memory.read(globex.pk, "support")) == ["globex's words"]
    stored = set(AgentSessionItem.objects.values_list("tenant_id", "position"))
    assert stored == {(acme.pk, 0), (globex.pk, 0)}


def test_a_limit_gives_the_latest_items_oldest_first(acme):
    memory.append(acme.pk, "chat", [user(f"m{n}") for n in range(5)])
    memory.append(acme.pk, "other", [user("elsewhere")])

    assert texts(memory.read(acme.pk, "chat", limit=2)) == ["m3", "m4"]
    assert texts(memory.read(acme.pk, "chat", limit=50)) == [f"m{n}" for n in range(5)]
    assert memory.read(acme.pk, "chat", limit=0) == []
    with pytest.raises(SessionError, match="limit"):
        memory.read(acme.pk, "chat", limit=-1)


def test_pop_takes_the_last_item_and_appending_continues_after_what_is_left(acme):
    memory.append(acme.pk, "chat", [user("a"), user("b"), user("c")])

    assert memory.pop(acme.pk, "chat") == user("c")
    memory.append(acme.pk, "chat", [user("d")])

    assert texts(memory.read(acme.pk, "chat")) == ["a", "b", "d"]
    assert memory.pop(acme.pk, "empty") is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("just text", "a JSON object is expected, not str"),
        (["a", "list"], "a JSON object is expected, not list"),
        ({"role": "user", "content": float("nan")}, "not JSON"),
        ({"role": "user", "content": {1, 2}}, "not JSON"),
        ({"role": "user", "content": object()}, "not JSON"),
    ],
)
def test_an_item_that_is_not_a_json_object_refuses_the_whole_batch(acme, bad, reason):
    with pytest.raises(SessionItemRefused) as refused:
        memory.append(acme.pk, "chat", [user("fine"), bad])

    assert isinstance(refused.value, ValueError) and refused.value.index == 1
    assert reason in str(refused.value) and "nothing of the batch was stored" in str(refused.value)
    assert not AgentSessionItem.objects.exists()


def test_an_item_over_the_size_limit_is_refused_and_one_at_it_is_kept(acme, settings):
    settings.AGENT_SESSION_ITEM_MAX_BYTES = 100
    at_limit = user("x" * (100 - len('{"content":"","role":"user"}')))
    too_large = r"101 bytes, more than AGENT_SESSION_ITEM_MAX_BYTES \(100\)"
    with pytest.raises(SessionItemRefused, match=too_large):
        memory.append(acme.pk, "chat", [at_limit, user("x" * 73)])
    assert not AgentSessionItem.objects.exists()

    memory.append(acme.pk, "chat", [at_limit])
    assert memory.read(acme.pk, "chat") == [at_limit]


@pytest.mark.parametrize("session_id", ["", "   ", "s" * 201, 42])
def test_a_bad_session_id_is_refused_before_anything_is_read_or_written(acme, session_id):
    for call in (
        lambda: memory.read(acme.pk, session_id),
        lambda: memory.append(acme.pk, session_id, [user("hi")]),
        lambda: memory.pop(acme.pk, session_id),
        lambda: memory.clear(acme.pk, session_id),
        lambda: DurableSession(acme.pk, session_id),
    ):
        with pytest.raises(SessionError, match="session_id"):
            call()


def test_items_may_not_be_filed_under_another_tenants_task(acme, globex):
    theirs = make_task(globex)
    with pytest.raises(SessionError, match="is not of tenant"):
        memory.append(acme.pk, "chat", [user("hi")], task=theirs)
    with pytest.raises(SessionError, match="is not of tenant"):
        memory.append(acme.pk, "chat", [user("hi")], task=theirs.pk)
    memory.append(acme.pk, "chat", [user("hi")], task=make_task(acme).pk)
    assert AgentSessionItem.objects.get().task.tenant_id == acme.pk


# --- exactly once, and two writers ---------------------------------------------------------------------


def test_items_appended_in_a_step_that_rolls_back_are_gone_and_the_replay_appends_them_once(acme):
    memory.append(acme.pk, "chat", [user("before")])

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic(durable=True):
        memory.append(acme.pk, "chat", [user("turn 2"), user("reply 2")])
        raise Crash  # the step's transition never committed

    with transaction.atomic(durable=True):  # the replayed step
        memory.append(acme.pk, "chat", [user("turn 2"), user("reply 2")])

    assert texts(memory.read(acme.pk, "chat")) == ["before", "turn 2", "reply 2"]
    assert positions() == [0, 1, 2]


def waiting_on_advisory_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2"
        )
        (count,) = cursor.fetchone()
    return int(count)


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = timezone.now() + timedelta(seconds=seconds)
    while timezone.now() < deadline:
        if condition():
            return True
        threading.Event().wait(0.02)
    return False


@pytest.mark.django_db(transaction=True)
def test_a_second_appender_waits_for_the_first_to_commit_and_continues_after_its_items(acme):
    first_appended, commit_first, second_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                memory.append(acme.pk, "chat", [user("a1"), user("a2")])
                first_appended.set()
                commit_first.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def second() -> None:
        try:
            first_appended.wait(10)
            memory.append(acme.pk, "chat", [user("b1")])
            second_done.set()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert first_appended.wait(10)
        assert wait_for(lambda: waiting_on_advisory_locks() == 1), "the second appender is not waiting"
        assert not second_done.is_set()
    finally:
        commit_first.set()
        for thread in threads:
            thread.join(10)

    assert errors == [] and second_done.is_set()
    assert texts(memory.read(acme.pk, "chat")) == ["a1", "a2", "b1"]


@pytest.mark.django_db(transaction=True)
def test_many_appenders_at_once_lose_nothing_and_keep_each_ones_order(acme):
    writers, each = 6, 5
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            start.wait(10)
            for k in range(each):
                memory.append(acme.pk, "busy", [user(f"w{n}-{k}")])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    said = texts(memory.read(acme.pk, "busy"))
    assert sorted(said) == sorted(f"w{n}-{k}" for n in range(writers) for k in range(each))
    for n in range(writers):
        assert [text for text in said if text.startswith(f"w{n}-")] == [f"w{n}-{k}" for k in range(each)]
    assert positions() == list(range(writers * each))


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_add_finishes_its_write_before_the_cancellation_is_raised(acme):
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # another writer of the session, in the middle of its transaction
        try:
            with transaction.atomic():
                memory.append(acme.pk, "chat", [user("held")])
                held.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    session = DurableSession(acme.pk, "chat")

    def someone_waits() -> bool:  # on a connection of its own thread, closed after
        try:
            return wait_for(lambda: waiting_on_advisory_locks() == 1)
        finally:
            connection.close()

    async def scenario() -> None:
        await asyncio.to_thread(held.wait, 10)
        adding = asyncio.ensure_future(session.add_items([user("added")]))
        assert await asyncio.to_thread(someone_waits)
        adding.cancel()
        await asyncio.sleep(0.2)
        assert not adding.done(), "gave up on the write while it was still under way"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await adding
        await sync_to_async(lambda: connection.close())()  # the connection of the thread that wrote

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        thread.join(10)
        connection.close()

    assert texts(memory.read(acme.pk, "chat")) == ["held", "added"]


# --- retention -----------------------------------------------------------------------------------------


def ended_days_ago(tenant: Any, days: int) -> Task:
    task = make_task(tenant)
    outcome = services.seal_outcome(task, {"order_id": "A-1", "damaged_item": "a lamp", "payment_ref": "p-1"})
    task = advance(
        task.id, task.state_version, State.COMPLETED, actor=Actor.worker("w"), progress=progress("done"),
        outcome=outcome,
    )  # fmt: skip
    Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - timedelta(days=days))
    return task


def test_archiving_a_task_erases_its_session_items_and_deleting_it_removes_them(acme, settings):
    settings.RETENTION_ARCHIVE_AFTER_DAYS, settings.RETENTION_DELETE_AFTER_DAYS = 10, 100
    archived, deleted, live = ended_days_ago(acme, 50), ended_days_ago(acme, 200), make_task(acme)
    memory.append(acme.pk, "chat", [user(f"{SECRET} (archived)")], task=archived)
    memory.append(acme.pk, "chat", [user("deleted words")], task=deleted.pk)
    memory.append(acme.pk, "chat", [user("live words")], task=live)
    memory.append(acme.pk, "chat", [user("no task")])

    report = retention.run(dry_run=False)

    assert (report.archived, report.deleted) == (1, 1)
    assert Archive.objects.filter(task=archived).exists() and not Task.objects.filter(pk=deleted.pk).exists()
    assert not AgentSessionItem.objects.filter(task_id=deleted.pk).exists()
    erased = AgentSessionItem.objects.get(task=archived)
    assert erased.item == {sealing.MARK: sealing.ERASED, sealing.TOKEN: ""}
    assert not any("4242" in text for text in raw_items())
    # What is left of the conversation: the erased item is no longer part of it.
    assert texts(memory.read(acme.pk, "chat")) == ["live words", "no task"]
    assert texts(memory.read(acme.pk, "chat", limit=2)) == ["live words", "no task"]
    assert memory.pop(acme.pk, "chat") == user("no task")
    assert memory.pop(acme.pk, "chat") == user("live words")
    assert memory.pop(acme.pk, "chat") is None, "the erased item is dropped, never returned"
    assert not AgentSessionItem.objects.exists()


def test_a_mark_from_end_reads_the_same_items_however_the_session_grows(acme):
    assert memory.end(acme.id, "chat-mark") == 0
    memory.append(acme.id, "chat-mark", [user("one"), user("two"), user("three")])
    mark = memory.end(acme.id, "chat-mark")
    memory.append(acme.id, "chat-mark", [user("four")])

    assert mark == 3
    assert [i["content"] for i in memory.read(acme.id, "chat-mark", before=mark)] == ["one", "two", "three"]
    assert [i["content"] for i in memory.read(acme.id, "chat-mark", 2, before=mark)] == ["two", "three"]
    assert memory.end(acme.id, "chat-mark") == 4


def test_a_mark_taken_on_an_empty_session_reads_nothing_however_the_session_grows(acme):
    mark = memory.end(acme.id, "chat-empty")
    memory.append(acme.id, "chat-empty", [user("later")])

    assert mark == 0
    assert memory.read(acme.id, "chat-empty", before=mark) == []
    assert [i["content"] for i in memory.read(acme.id, "chat-empty")] == ["later"]
