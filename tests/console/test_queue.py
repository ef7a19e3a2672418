"""The console queue: search, filters, the per-state summary, sorting, CSV export, bounded queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from reads import queue as selectors
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import REFUND_INPUT, api_client_for, make_task

pytestmark = pytest.mark.django_db
INVOICE = {"invoice_id": "INV-1", "amount": "5.00"}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(user, **params) -> str:
    response = client_for(user).get("/console/", params)
    assert response.status_code == 200
    return response.content.decode()


def test_search_finds_a_task_by_id_prefix_short_id_objective_key_and_input_reference(operator, acme):
    target = make_task(
        acme,
        objective="Refund the cracked teapot",
        idempotency_key="shop-77-refund",
        input={**REFUND_INPUT, "order_id": "ORD-55321"},
    )
    other = make_task(acme, objective="Refund a scarf")
    hex_id = target.id.hex
    for term in (str(target.id)[:13], hex_id[-8:], "cracked TEAPOT", "shop-77", "ORD-55321", str(target.id)):
        page = listed(operator, q=term)
        assert str(target.id) in page and str(other.id) not in page, term


def test_search_needs_three_characters(operator, acme):
    make_task(acme)
    assert "at least 3 characters" in listed(operator, q="ab")


def test_search_never_reaches_another_tenant(operator, outsider, acme, globex):
    make_task(globex, objective="Refund the globex teapot")
    assert "No tasks match." in listed(operator, q="teapot")
    assert 'value="globex"' not in listed(operator)  # the tenant select offers the user's tenants only


def test_each_filter_narrows_the_queue(operator, acme, settings):
    settings.STUCK_AFTER = 60
    plain = make_task(acme, objective="Plain one")
    other_type = make_task(acme, objective="Invoice one", task_type="pay_invoice", input=INVOICE)
    eu = make_task(acme, objective="European one", region="eu")
    escalated = make_task(acme, objective="Escalated one")
    advance(escalated.id, 1, State.READY, actor=Actor.system("t"), trigger="escalate", escalation_level=1)
    held = make_task(acme, objective="Held one")
    advance(held.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="checkpoint_corrupt")
    old = make_task(acme, objective="Old one")
    Task.objects.filter(pk=old.id).update(state_entered_at=timezone.now() - timedelta(days=2))
    cases = {
        "task_type": ("pay_invoice", other_type),
        "region": ("eu", eu),
        "escalated": ("true", escalated),
        "reason": ("checkpoint_corrupt", held),
        "age": ("1d", old),
        "stuck": ("true", old),  # ready, unleased, for longer than STUCK_AFTER
        "tenant": ("acme", plain),
    }
    for name, (value, expected) in cases.items():
        page = listed(operator, **{name: value})
        assert expected.objective in page, name
        if name != "tenant":
            assert "Plain one" not in page, name


def test_the_summary_counts_each_state_up_to_a_cap(operator, outsider, acme, globex):
    for _ in range(2):
        make_task(acme)
    held = make_task(acme)
    advance(held.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="checkpoint_corrupt")
    done = make_task(acme)
    advance(done.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger="complete")
    make_task(globex)
    counts = selectors.state_counts([acme.id], cap=10)
    assert counts == {State.READY: 2, State.QUARANTINED: 1, selectors.FINISHED: 1}
    # each count stops one past the cap: "more than 1" is all the bar needs to say
    assert selectors.state_counts([acme.id], cap=1) == {
        State.READY: 2,
        State.QUARANTINED: 1,
        selectors.FINISHED: 1,
    }
    page = listed(operator)
    assert 'state=ready" class="count"' in page and "<strong>2</strong>" in page


def test_the_summary_says_more_than_the_cap_rather_than_counting_on(operator, acme, monkeypatch):
    monkeypatch.setattr("console.queue.COUNT_CAP", 1)
    make_task(acme)
    make_task(acme)
    assert "<strong>1+</strong>" in listed(operator)


def test_the_queue_sorts_by_age_in_state_and_pages_by_cursor(operator, acme, monkeypatch):
    monkeypatch.setattr("console.views.PAGE", 2)
    tasks = [make_task(acme, objective=f"Task number {n}") for n in range(3)]
    for n, task in enumerate(tasks):  # the newest task has waited longest
        Task.objects.filter(pk=task.id).update(state_entered_at=timezone.now() - timedelta(hours=n + 1))
    first = listed(operator, sort="age")
    assert first.index("Task number 2") < first.index("Task number 1") and "Task number 0" not in first
    next_link = first.split('rel="next"')[0].rsplit('href="?', 1)[1].split('"')[0].replace("&amp;", "&")
    second = client_for(operator).get(f"/console/?{next_link}").content.decode()
    assert "Task number 0" in second and "Task number 2" not in second


def test_rows_link_from_their_first_cell(operator, acme):
    task = make_task(acme)
    assert f'href="/console/tasks/{task.id}/" title="{task.id}" class="row-link"' in listed(operator)


def test_the_csv_export_streams_the_filtered_list(operator, outsider, acme, globex):
    wanted = make_task(acme, objective="=HYPERLINK(bad) refund")
    make_task(acme, objective="Not this one", task_type="pay_invoice", input=INVOICE)
    make_task(globex, objective="Not theirs")
    response = client_for(operator).get("/console/export.csv", {"task_type": "refund_request"})
    assert response.streaming and response["Content-Type"].startswith("text/csv")
    body = b"".join(response.streaming_content).decode()
    lines = body.strip().splitlines()
    assert lines[0].startswith("id,tenant,task_type,state") and len(lines) == 2
    assert str(wanted.id) in lines[1] and "'=HYPERLINK(bad) refund" in lines[1]


def test_keyset_chunks_walk_every_row_once(acme):
    made = {make_task(acme).id for _ in range(5)}
    seen = [t.id for chunk in selectors.keyset_chunks(Task.objects.all(), size=2) for t in chunk]
    assert set(seen) == made and len(seen) == 5


def test_the_queue_runs_a_bounded_number_of_queries(operator, acme, django_assert_max_num_queries):
    client = client_for(operator)
    client.get("/console/")  # warm the session
    for _ in range(3):
        make_task(acme)
    with django_assert_max_num_queries(9) as few:
        client.get("/console/", {"q": "Refund", "state": "ready", "sort": "age"})
    for _ in range(30):
        make_task(acme)
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get("/console/", {"q": "Refund", "state": "ready", "sort": "age"})


def test_the_api_list_takes_the_same_search_and_filters(operator, outsider, acme, globex):
    target = make_task(acme, input={**REFUND_INPUT, "order_id": "ORD-9"}, region="eu")
    make_task(acme)
    make_task(globex, input={**REFUND_INPUT, "order_id": "ORD-9"})
    body = api_client_for(operator).get("/api/tasks/", {"q": "ord-9", "region": "eu"}).json()
    assert [row["id"] for row in body["results"]] == [str(target.id)]
    assert api_client_for(operator).get("/api/tasks/", {"age": "ever"}).status_code == 400


def test_the_search_uses_the_trigram_index(operator, acme):
    make_task(acme)
    filters = selectors.TaskFilter({"q": "ORD-55321"}, queryset=Task.objects.all())
    sql, params = filters.qs.query.sql_with_params()
    with connection.cursor() as cursor:  # a one-row table: forbid the scans a big one would not choose
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "task_search_doc_trgm" in plan, plan


def test_the_search_document_is_written_once_and_no_change_of_state_rewrites_it(acme):
    """The document lives in ``tasks_task_search``, written by triggers on every insert path; a
    change of state leaves it (and its trigram entries) alone; a changed input rewrites it; it goes
    with its task. ``tasks_task`` keeps no trigram index, so its state changes write none."""
    from tasks.models import TaskSearch

    def doc_and_version(task_id):
        with connection.cursor() as cursor:
            cursor.execute("SELECT doc, xmin::text FROM tasks_task_search WHERE task_id = %s", [task_id])
            return cursor.fetchone()

    task = make_task(acme, input={**REFUND_INPUT, "order_id": "ORD-7781"})
    doc, written = doc_and_version(task.id)
    assert "ORD-7781" in doc and task.id.hex in doc and task.objective in doc
    Task.objects.filter(pk=task.pk).update(state=State.QUARANTINED, state_version=task.state_version + 1)
    assert doc_and_version(task.id) == (doc, written)  # not even rewritten in place
    Task.objects.filter(pk=task.pk).update(input={**REFUND_INPUT, "order_id": "ORD-9990"})
    assert "ORD-9990" in doc_and_version(task.id)[0] and "ORD-7781" not in doc_and_version(task.id)[0]

    with connection.cursor() as cursor:  # a path that is not the ORM's
        cursor.execute("CREATE TEMP TABLE copied AS SELECT * FROM tasks_task WHERE id = %s", [task.id])
        cursor.execute(
            "UPDATE copied SET id = gen_random_uuid(), objective = 'raw insert ZQX-1', idempotency_key = NULL"
        )
        cursor.execute("INSERT INTO tasks_task SELECT * FROM copied RETURNING id")
        raw_id = cursor.fetchone()[0]
    assert "ZQX-1" in doc_and_version(raw_id)[0]
    with transaction.atomic(), connection.cursor() as cursor:  # as retention deletes tasks
        cursor.execute("SET LOCAL audit.retention = on")
        Task.objects.filter(pk=raw_id).delete()  # (the other has history, which protects it)
    assert list(
        TaskSearch.objects.filter(task_id__in=[task.pk, raw_id]).values_list("task_id", flat=True)
    ) == [task.pk]
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'tasks_task'")
        assert not [row for row in cursor.fetchall() if "gin_trgm_ops" in row[0]]


def test_a_search_finds_by_document_by_id_prefix_and_by_a_pasted_id(operator, acme, globex):
    target = make_task(acme, input={**REFUND_INPUT, "order_id": "ORD-4_%2"})
    other = make_task(acme)
    make_task(globex, input={**REFUND_INPUT, "order_id": "ORD-4_%2"})  # another tenant's: never

    def found(term):
        body = api_client_for(operator).get("/api/tasks/", {"q": term}).json()
        return {row["id"] for row in body["results"]}

    assert found("ord-4_%2") == {str(target.id)}  # LIKE's wildcards are literal
    assert found("ORD-4x") == set() and found("4_%") == {str(target.id)}
    assert found(target.id.hex[:8]) >= {str(target.id)}
    assert found(str(other.id)) == {str(other.id)}  # pasted with its dashes


def test_an_id_head_shared_by_thousands_is_looked_up_by_key_not_walked_to(operator, acme, many, monkeypatch):
    # The 4,000 tasks were created in one go: their ids share a head (uuid7's time). The page used to
    # join the matches to a newest-first walk of the tenant's index, which meets an older head only past
    # every newer task (at 1M: 1.4-2.7 s). Now the matches are fetched first and read by key.
    head = many[0].id.hex[:8]
    sharing = {task.id for task in many if task.id.hex.startswith(head)}
    assert len(sharing) > 100
    cited = make_task(acme, input={**REFUND_INPUT, "order_id": f"see {head}"})  # its document names the head
    filters = selectors.TaskFilter({"q": head}, queryset=Task.objects.filter(tenant=acme))
    sql, params = filters.qs.order_by("-id")[:51].query.sql_with_params()
    assert "tasks_task_search" not in sql  # the page's query holds the matched ids
    assert "Merge Join" not in plan_of(sql, params)
    expected = sorted(sharing | {cited.id}, reverse=True)
    assert [task.id for task in filters.qs.order_by("-id")] == expected
    # Past ID_CANDIDATES matches the page walks the index with the search as before, and finds the same.
    monkeypatch.setattr(selectors, "ID_CANDIDATES", 10)
    filters = selectors.TaskFilter({"q": head}, queryset=Task.objects.filter(tenant=acme))
    assert "tasks_task_search" in str(filters.qs.query)
    assert [task.id for task in filters.qs.order_by("-id")] == expected


def plan_of(sql: str, params, *, seqscan: bool = True) -> str:
    with connection.cursor() as cursor:
        if not seqscan:  # a small table: forbid the scans a big one would not choose
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def many(acme):
    """4,000 tasks of one tenant, one in ten with a step error, each with an event by a worker but a
    few by a person; analyzed, so the planner weighs the indexes as it would on a big table."""
    from audit.models import TransitionEvent

    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(tenant=acme, task_type="refund_request", objective=f"Refund {n}", input={},
             state=State.COMPLETED, state_reason="step_error" if n % 10 == 0 else "",
             policy_version="p1", created_at=now, updated_at=now, state_entered_at=now)
        for n in range(4000)
    )  # fmt: skip
    TransitionEvent.objects.bulk_create(
        TransitionEvent(task=task, tenant=acme, state_version=1, from_state="", to_state="ready",
                        trigger="start", actor_kind="worker", actor_id="user:ann" if n % 500 == 0 else
                        f"worker:w{n % 4}", reason="started", attempt=0, policy_version="p1",
                        created_at=now, prev_hash="", hash=f"{n:064x}")
        for n, task in enumerate(tasks)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")
        cursor.execute("ANALYZE audit_transitionevent")
    return tasks


def test_the_reason_filter_reads_its_indexes_so_a_code_nobody_carries_reads_nothing(acme, many):
    filters = selectors.TaskFilter({"reason": "step_erorr"}, queryset=Task.objects.filter(tenant=acme))
    plan = plan_of(*filters.qs.order_by("-id")[:51].query.sql_with_params())
    assert "task_tenant_reason" in plan and "task_tenant_outcome_reason" in plan, plan
    # and a common code walks the newest-first index, stopping after a page
    filters = selectors.TaskFilter({"reason": "step_error"}, queryset=Task.objects.filter(tenant=acme))
    assert len(filters.qs.order_by("-id")[:51]) == 51


def test_the_audit_search_by_actor_can_use_its_trigram_index(acme, many):
    from audit.models import TransitionEvent

    events = TransitionEvent.objects.filter(actor_id__icontains="user:ann")  # the expression Django writes
    plan = plan_of(*events.order_by("-created_at", "-id")[:51].query.sql_with_params(), seqscan=False)
    assert "event_actor_trgm" in plan, plan


def test_a_count_past_the_cap_says_about_how_many_from_the_statistics(operator, acme, many, monkeypatch):
    monkeypatch.setattr("console.queue.COUNT_CAP", 100)
    page = listed(operator)
    assert "about 4,000" in page  # the 4,000 finished tasks, analyzed, rounded to two digits
    with connection.cursor() as cursor:  # never analyzed (a new table): no estimate, only "more than"
        cursor.execute("UPDATE pg_class SET reltuples = -1 WHERE oid = 'tasks_task'::regclass")
    assert "<strong>100+</strong>" in listed(operator)


def test_the_audit_search_by_to_state_reads_one_index_range(acme, many):
    from audit.models import TransitionEvent

    events = TransitionEvent.objects.filter(tenant=acme, to_state="quarantined")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a small table
        sql, params = events.order_by("-created_at", "-id")[:51].query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "event_tenant_to_state" in plan, plan
