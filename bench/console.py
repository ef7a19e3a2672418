"""The console at scale, for every persona: one-tenant and two-tenant operators and auditors, an approver.

What it measures
    Wall time over real HTTP (a gunicorn per size on loopback, DEBUG off; median of ``--repeat``
    requests after ``--warmup``, in paired rounds: below) of each console page, as each persona who
    reads it, and its SQL queries (counted once, at the large size, in this process through Django's
    test client, the same code):

    queue ...            GET /console/ newest first, each common filter, ``?q=`` (text, a short id as
                         shown, an id's head), ``?sort=age``, ``?state=completed&sort=age``, ``?tenant=``
                         naming a tenant the
                         user does not hold and ``?reason=`` a typo, as an operator of one tenant and
                         as an operator of both
    quarantine, dashboard, task page (a task with ``--history`` events)   the one-tenant operator
    inbox, request       the approver, with ``--approvals`` pending
    audit ...            GET /console/audit/ unfiltered, ``?reason=``, ``?actor=``, ``?to_state=``,
                         and the CSV export's first ``--export-rows`` rows, as an auditor of one tenant
                         and of both; the long task's audit history

    at two sizes side by side: ``--small`` (10,000) bulk tasks in one database and ``--tasks``
    (1,000,000; ``--large`` is the same flag) in another, spread over two tenants (runs of 13
    alternate), beside the approvals' tasks. Both databases are served at once, each by its own
    gunicorn, and each page's requests alternate between them (round by round, small then large, then
    large then small), so a change in the machine's load weighs on both sizes alike: the two figures of
    a page are measured seconds apart, not minutes. It prints each median, the large/small ratio, the
    queries and the rows each page rendered at both sizes, and whether the goals hold: every page at
    most 1.5x from small to large, and a median of at most 150 ms at the large size (a row over either
    is marked). ``--small`` equal to ``--tasks`` compares two copies of one database: the ratios then
    show the noise alone.

    Everything but the bulk tasks beyond ``--small`` is seeded once: the personas, their sessions, the
    long task, the approvals and the first ``--small`` bulk tasks go into the large database, which is
    then copied (``CREATE DATABASE ... TEMPLATE``) into the small one, ``<database>_small``; the rest of
    the bulk tasks go into the large one only. Both hold the same ids, users and sessions.

    The bulk tasks (every state, ~1 in 200 quarantined, types, ages, some escalated, each with two
    events — its start and the step into its state, one in a hundred by a person — and a checkpoint)
    are written by SQL (``INSERT ... SELECT generate_series``), not the ORM; the script prints how
    long seeding took. The measured task page and request page are built through the real service
    path (``advance``; ``request_decision``), so they verify and decode.

How to run
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/console.py
    .venv/bin/python bench/console.py --tasks 100000 --history 1000   # a lighter run

    DATABASE_URL names the *server*; the script creates its own databases (``--database``, default
    ``bench_console_<pid>_<hex>``, the large one, copied from the migrated template, and
    ``<database>_small``) and drops both at the end (``--keep-database`` leaves them for ``EXPLAIN``).
    A million tasks take minutes to seed and the machine's load is printed before and after: read the
    figures with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/console.py` puts bench/ first, not the project

from bench.common import (  # noqa: E402
    BENCH_ENV,
    DEFAULT_SERVER_URL,
    MAX_DATABASE_NAME,
    SERVER_START_TIMEOUT,
    add_database_arguments,
    add_smoke_argument,
    copy_database,
    drop_unless_kept,
    recreate_database,
    settle,
    setup_client_benchmark,
    signed_in_client,
    with_dbname,
)

RATIO_GOAL = 1.5
MEDIAN_GOAL_MS = 150.0
# Quarantine is rare (one task in QUARANTINE_EVERY: ~5,000 at a million); the rest cycle through STATES.
QUARANTINE_EVERY = 200
STATES = [
    "ready", "waiting_input", "waiting_approval", "waiting_external", "waiting_retry", "outcome_unknown",
    "completed", "completed", "completed", "failed", "canceled", "expired",
]  # fmt: skip
TYPES = ["refund_request", "order_lookup", "pay_invoice"]
TENANTS = ("bench", "bench-two")  # the bulk tasks alternate between the two
OPERATOR_ACTOR = "user:bench-operator"  # the second event's actor on one task in a hundred

# One statement per table; %(first)s..%(last)s are the bulk tasks' numbers. Task ids are derived
# from the number (md5), so events and checkpoints find their task without a join. Each task has two
# events: its start (v1, -> ready) and the step that put it in its state (v2, ready -> its state). That
# step was its last transition, so updated_at = state_entered_at, as advance() writes them (the quarantine
# triage reads a task's own reason code when they are equal: reads.quarantine).
_STATE = f"""CASE WHEN n %% {QUARANTINE_EVERY} = 0 THEN 'quarantined'
    ELSE (%(states)s::text[])[1 + n %% %(nstates)s] END"""
_TENANT = "(%(tenants)s::int[])[1 + (n / 13) %% 2]"  # runs of 13: every state in both
_AT = "now() - ((n * 7919) %% 100003) * interval '7 seconds'"
TASKS_SQL = f"""
INSERT INTO tasks_task (id, task_type, region, state, state_version, state_reason, outcome, objective,
    input, idempotency_key, request_digest, deadline, wait_deadline, attempt, policy_version, model_id,
    prompt_id, toolset_id, escalation_level, escalated_to, escalation_reason, audit_head, created_at,
    updated_at, state_entered_at, owner_id, tenant_id, rerun_of_id, parent_id)
SELECT md5('bench' || n)::uuid, (%(types)s::text[])[1 + n %% 3], 'default', {_STATE}, 2,
    CASE WHEN n %% 7 = 0 THEN 'step_error' ELSE '' END, NULL,
    'Refund order B-' || n, jsonb_build_object('order_id', 'B-' || n, 'amount', '10.00'), NULL, '',
    NULL, CASE WHEN {_STATE} LIKE 'waiting_%%'
        THEN now() + ((n %% 97) - 5) * interval '1 hour' END, 0, '2026-11', 'scripted', 'p@1', 't@1',
    CASE WHEN n %% 50 = 0 THEN 1 ELSE 0 END, CASE WHEN n %% 50 = 0 THEN 'operator' ELSE '' END, '', '',
    {_AT}, {_AT}, {_AT}, %(owner)s, {_TENANT}, NULL, NULL
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""
EVENTS_SQL = f"""
INSERT INTO audit_transitionevent (state_version, from_state, to_state, trigger, actor_kind, actor_id,
    reason, reason_code, attempt, policy_version, parent_id, trace_id, created_at, prev_hash, hash,
    task_id, tenant_id, checkpoint_digest, key_id)
SELECT 1, '', 'ready', 'start', 'system', 'bench', 'started', '', 0, '2026-11', NULL::uuid, '',
    {_AT} - interval '1 second', '', md5('e' || n) || md5('f' || n), md5('bench' || n)::uuid,
    {_TENANT}, '', ''
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
UNION ALL
SELECT 2, 'ready', {_STATE}, 'step',
    CASE WHEN n %% 100 = 0 THEN 'user' ELSE 'worker' END,
    CASE WHEN n %% 100 = 0 THEN '{OPERATOR_ACTOR}' ELSE 'worker:w' || (n %% 4) END,
    'moved', CASE WHEN n %% 7 = 0 THEN 'step_error' ELSE '' END, 0, '2026-11', NULL::uuid, '',
    {_AT}, md5('e' || n) || md5('f' || n), md5('g' || n) || md5('h' || n), md5('bench' || n)::uuid,
    {_TENANT}, '', ''
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""
CHECKPOINTS_SQL = """
INSERT INTO tasks_checkpoint (state_version, schema_version, codec, body, created_at, task_id, digest)
SELECT 2, 2, 'json/v1', '{"schema_version":2,"step":""}', now(), md5('bench' || n)::uuid, ''
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""


def bulk_tasks(url: str, *, tenants: Sequence[int], owner: int, first: int, last: int) -> float:
    """Tasks ``first``..``last`` (alternating between ``tenants``) with two events and a checkpoint each;
    returns seconds taken."""
    if last < first:
        return 0.0
    started = time.perf_counter()
    params = {
        "first": first, "last": last, "tenants": list(tenants), "owner": owner, "types": TYPES,
        "states": STATES, "nstates": len(STATES),
    }  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (TASKS_SQL, EVENTS_SQL, CHECKPOINTS_SQL):
            conn.execute(statement, params)
    return time.perf_counter() - started


def long_task(tenant: Any, owner: Any, events: int) -> Any:
    """A task with ``events`` events, every one written by ``advance`` (STEP self-loops)."""
    from tasks import checkpoints
    from tasks.services import task_create
    from tasks.states import State, Trigger
    from tasks.transitions import Actor, advance

    task, _ = task_create(
        tenant=tenant,
        task_type="order_lookup",
        objective="Look up order L-1 (long history)",
        input={"order_id": "L-1"},
        actor=Actor.system("bench"),
        owner=owner,
    )
    worker = Actor.worker("bench")
    for turn in range(1, events - 1):
        progress = checkpoints.Progress(step="lookup", facts={"order_id": "L-1", "turn": turn})
        task = advance(task.id, task.state_version, State.READY, actor=worker, trigger=Trigger.STEP,
                       progress=progress, reason=f"turn {turn}")  # fmt: skip
    progress = checkpoints.Progress(step="summarize", facts={"order_id": "L-1"})
    return advance(task.id, task.state_version, State.WAITING_RETRY, actor=worker,
                   trigger=Trigger.ATTEMPT_FAILED, progress=progress, attempt=1,
                   wait_deadline=task.created_at.replace(year=task.created_at.year + 1))  # fmt: skip


def _die_with_parent() -> None:
    """In the server's child before exec (Linux): a SIGTERM when this script dies, even killed (a smoke
    test's timeout), so no gunicorn outlives the run holding its database."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """gunicorn serving the app on loopback with DEBUG off (one process, two threads), its log in a file.
    Started, then ``wait``ed for, so that two start side by side."""

    def __init__(self, url: str, log_path: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        # Each server its own cache (CACHE_URL in the environment would be shared): the two databases
        # hold the same tenant ids, so a shared cache would serve one size's figures to the other.
        env = {**BENCH_ENV, **os.environ, "DATABASE_URL": url, "DEBUG": "0", "SECURE_SSL_REDIRECT": "0",
               "DJANGO_SETTINGS_MODULE": "config.settings", "CELERY_BROKER_URL": "memory://",
               "CACHE_URL": "locmemcache://"}  # fmt: skip
        self.log_path = log_path
        self.deadline = time.monotonic() + SERVER_START_TIMEOUT
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "config.wsgi:application",
                 "--bind", f"127.0.0.1:{self.port}",
                 "--workers", "1", "--threads", "2", "--worker-class", "gthread", "--log-level", "warning",
                 "--keep-alive", "60", "--timeout", "300"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )  # fmt: skip

    def wait(self) -> None:
        """Until the server answers (``SERVER_START_TIMEOUT`` from its start)."""
        import httpx

        while time.monotonic() < self.deadline:
            if self.process.poll() is not None:
                log = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the server exited: {log}")
            try:
                httpx.get(f"{self.base}/healthz", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {SERVER_START_TIMEOUT:g} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


SIDES = ("small", "large")


class Persona:
    """One signed-in user: an HTTP client per size for the timings (the session cookie sent as a header:
    with DEBUG off it is marked Secure, which a client keeps off plain HTTP; both databases hold the
    session) and the test client for query counts."""

    def __init__(self, label: str, user: Any) -> None:
        self.label = label
        self.client = signed_in_client(user)
        self.http: dict[str, Any] = {}

    def connect(self, bases: dict[str, str]) -> None:
        import httpx
        from django.conf import settings

        cookie = self.client.cookies[settings.SESSION_COOKIE_NAME].value
        for side, base in bases.items():
            self.http[side] = httpx.Client(
                base_url=base, headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}, timeout=300
            )


@dataclass(frozen=True)
class Read:
    persona: Persona
    path: str
    params: dict[str, str]
    stream_rows: int = 0  # an export: time to its first ``stream_rows`` lines


def _timed(read: Read, side: str) -> tuple[float, int | None]:
    """One request over HTTP to the ``side`` ("small" or "large") server: milliseconds and the rows it
    rendered (None for a stream)."""
    http = read.persona.http[side]
    started = time.perf_counter()
    if read.stream_rows:
        seen = 0
        with http.stream("GET", read.path, params=read.params) as response:
            assert response.status_code == 200, response.status_code
            for chunk in response.iter_bytes():
                seen += chunk.count(b"\n")
                if seen >= read.stream_rows:
                    break
        return (time.perf_counter() - started) * 1000, None
    response = http.get(read.path, params=read.params)
    took = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, (read.path, read.params, response.status_code, response.text[-2000:])
    return took, response.content.count(b"<tr")


def _queries(read: Read) -> int:
    """The page's SQL queries, counted in this process through the test client (the same code)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = read.persona.client.get(read.path, read.params)
        if response.streaming:
            for _ in zip(range(3), response.streaming_content, strict=False):
                pass
            response.close()
    return len(queries)


@dataclass(frozen=True)
class Pair:
    """One page at both sizes: median milliseconds and the rows rendered by each, the queries (counted
    at the large size)."""

    small: float
    large: float
    queries: int
    rows_small: int | None
    rows_large: int | None


def _rounds(count: int) -> list[tuple[str, str]]:
    """The order of each round's two requests: small then large, then large then small, and so on, so
    that neither size is always the one measured right after the other."""
    return [SIDES if turn % 2 == 0 else SIDES[::-1] for turn in range(count)]


def _measure_pair(read: Read, *, warmup: int, repeat: int) -> Pair:
    """``warmup`` then ``repeat`` rounds, each one request to either server (``_rounds``, alternating
    through both: the warm-up's first)."""
    timings: dict[str, list[tuple[float, int | None]]] = {side: [] for side in SIDES}
    for turn, sides in enumerate(_rounds(warmup + repeat)):
        for side in sides:
            took = _timed(read, side)
            if turn >= warmup:
                timings[side].append(took)
    small, large = (statistics.median(took for took, _ in timings[side]) for side in SIDES)
    return Pair(small, large, _queries(read), timings["small"][-1][1], timings["large"][-1][1])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=10_000, help="bulk tasks in the small database")
    parser.add_argument(
        "--tasks", "--large", dest="large", type=int, default=1_000_000, help="bulk tasks in the large one"
    )
    parser.add_argument("--approvals", type=int, default=10_000, help="pending approval requests")
    parser.add_argument("--history", type=int, default=10_000, help="events of the measured task page")
    parser.add_argument("--export-rows", type=int, default=500, help="rows read from the audit export")
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per read (median)")
    parser.add_argument("--warmup", type=int, default=2)
    add_database_arguments(parser, "bench_console")
    add_smoke_argument(parser)
    args = parser.parse_args(argv)
    if args.large < args.small:
        parser.error("--tasks (the large size) must be at least --small")
    if len(f"{args.database}_small".encode()) > MAX_DATABASE_NAME:
        parser.error(f"--database: at most {MAX_DATABASE_NAME - 6} bytes (the small copy adds _small)")
    return args


def _reads(people: dict[str, Persona], long: Any, request: Any, export_rows: int) -> dict[str, Read]:
    """Every measured page, named ``page (persona)``."""
    op1, op2, aud1, aud2, appr = (people[k] for k in ("op1", "op2", "aud1", "aud2", "appr"))
    reads: dict[str, Read] = {}
    for op in (op1, op2):
        for name, params in {
            "queue": {},
            "queue state": {"state": "waiting_input"},
            "queue type": {"task_type": "order_lookup"},
            "queue escalated": {"escalated": "true"},
            "queue stuck": {"stuck": "true"},
            "queue reason": {"reason": "step_error"},
            "queue age": {"age": "1d"},
            "queue q": {"q": "order B-1"},  # matches a full page at any size
            # The short id the console shows (an id's last 8 hex digits: its heads repeat, uuid7), and
            # the head, which every task created in the same ~65 s shares.
            "queue q id": {"q": long.id.hex[-8:]},
            "queue q id head": {"q": long.id.hex[:8]},
            "queue sort age": {"sort": "age"},
            "queue completed sort age": {"state": "completed", "sort": "age"},
            "queue tenant not held": {"tenant": "nobody-holds-this"},
            "queue reason typo": {"reason": "step_erorr"},
        }.items():
            reads[f"{name} ({op.label})"] = Read(op, "/console/", params)
    for name, params in {"quarantine": "/console/quarantine/", "dashboard": "/console/dashboard/"}.items():
        reads[f"{name} ({op1.label})"] = Read(op1, params, {})
    reads[f"task page ({op1.label})"] = Read(op1, f"/console/tasks/{long.id}/", {})
    reads[f"inbox ({appr.label})"] = Read(appr, "/console/approvals/", {})
    reads[f"request ({appr.label})"] = Read(appr, f"/console/approvals/{request.pk}/", {})
    for aud in (aud1, aud2):
        for name, params in {
            "audit": {},
            "audit reason": {"reason": "step_error"},
            "audit actor": {"actor": OPERATOR_ACTOR},
            "audit to_state": {"to_state": "quarantined"},
        }.items():
            reads[f"{name} ({aud.label})"] = Read(aud, "/console/audit/", params)
        reads[f"audit export ({aud.label})"] = Read(aud, "/console/audit/export.csv", {}, export_rows)
    reads[f"audit history ({aud2.label})"] = Read(aud2, f"/console/audit/tasks/{long.id}/", {})
    return reads


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    small_database = f"{args.database}_small"
    url, small_url = with_dbname(server_url, args.database), with_dbname(server_url, small_database)
    recreate_database(server_url, args.database, create=True)
    servers: list[Server] = []
    copied = False
    try:
        setup_client_benchmark(url, server_url, args.database, fresh_migrate=args.fresh_migrate)
        from django.contrib.auth import get_user_model
        from django.db import connections

        from bench.approvals import _bulk_requests, _real_request
        from tenancy.models import Role, Tenant
        from tenancy.services import grant_role, role_group

        first, second = (Tenant.objects.create(slug=slug, name=slug) for slug in TENANTS)
        users = get_user_model().objects
        grants = {  # persona: (label, role, tenants)
            "op1": ("operator, 1 tenant", Role.OPERATOR, [first]),
            "op2": ("operator, 2 tenants", Role.OPERATOR, [first, second]),
            "aud1": ("auditor, 1 tenant", Role.AUDITOR, [first]),
            "aud2": ("auditor, 2 tenants", Role.AUDITOR, [first, second]),
            "appr": ("approver", Role.APPROVER, [first]),
        }
        accounts = {}
        for key, (_, role, tenants) in grants.items():
            accounts[key] = users.create_user(username=f"bench-{key}", password="x")
            for tenant in tenants:
                grant_role(accounts[key], tenant, role)
        operator = accounts["op1"]

        started = time.perf_counter()
        long = long_task(first, operator, args.history)
        real = _real_request(first, operator)
        _bulk_requests(first, role_group(first, Role.APPROVER), args.approvals - 1, offset=1)
        print(f"setup       task with {args.history:,} events and {args.approvals:,} pending approvals "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        base = long.__class__.objects.count()  # the approvals' tasks and the long one, beside the bulk ones
        # Signed in before the copy, so both databases hold the sessions.
        people = {key: Persona(label, accounts[key]) for key, (label, _, _) in grants.items()}
        reads = _reads(people, long, real, args.export_rows)

        # Bulk tasks in every state are seeded *beside* the approvals' tasks, so each filter has full
        # pages at both sizes: comparing an empty page with a full one would measure nothing.
        def seed(low: int, high: int) -> None:
            if high < low:
                return
            took = bulk_tasks(url, tenants=[first.pk, second.pk], owner=operator.pk, first=low, last=high)
            added = high - low + 1
            print(f"seeded      {added:,} tasks (+ 2 events, checkpoint each) by SQL in {took:.1f} s "
                  f"({added / max(took, 1e-9):,.0f} tasks/s); {high + base:,} in two tenants")  # fmt: skip

        seed(1, args.small)
        connections.close_all()  # the copy's template must be idle
        took = copy_database(server_url, args.database, small_database)
        copied = True
        print(f"copied      {args.database} into {small_database} (CREATE DATABASE ... TEMPLATE) in "
              f"{took:.1f} s: {args.small + base:,} tasks")  # fmt: skip
        seed(args.small + 1, args.large)  # into the large database only
        for each in (small_url, url):
            settle(each, smoke=args.smoke)

        started = time.perf_counter()
        servers = [
            Server(each, Path(tempfile.gettempdir()) / f"{name}-gunicorn.log")
            for each, name in ((small_url, small_database), (url, args.database))
        ]
        for server in servers:
            server.wait()
        for person in people.values():
            person.connect({side: server.base for side, server in zip(SIDES, servers, strict=True)})
        print(f"servers     2 gunicorns started side by side in {time.perf_counter() - started:.1f} s, "
              f"one per database")  # fmt: skip
        load = os.getloadavg()
        print(f"load        {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.repeat} timed requests per read "
              f"and size over HTTP (gunicorn, DEBUG off)")  # fmt: skip
        print(f"paired      each page's requests alternate between the {args.small:,}-task and the "
              f"{args.large:,}-task server, {args.warmup} + {args.repeat} rounds (small, large; then large, "
              f"small)")  # fmt: skip
        results = {
            name: _measure_pair(read, warmup=args.warmup, repeat=args.repeat) for name, read in reads.items()
        }
        load = os.getloadavg()
        print(f"load        {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
        worst, slowest = 0.0, 0.0
        print(f"\n| page (persona) | {args.small:,} tasks | {args.large:,} tasks | ratio | queries | rows |")
        print("|---|---|---|---|---|---|")
        for name, pair in results.items():
            ratio = pair.large / pair.small
            worst, slowest = max(worst, ratio), max(slowest, pair.large)
            rows = "stream" if pair.rows_large is None else f"{pair.rows_small} / {pair.rows_large}"
            flag = "" if ratio <= RATIO_GOAL and pair.large <= MEDIAN_GOAL_MS else " **over**"
            print(f"| {name} | {pair.small:.1f} ms | {pair.large:.1f} ms | {ratio:.2f}x{flag} "
                  f"| {pair.queries} | {rows} |")  # fmt: skip
        verdict = "met" if worst <= RATIO_GOAL else "NOT met"
        print(f"\nworst ratio {worst:.2f}x (goal <= {RATIO_GOAL}x): {verdict}")
        print(f"slowest median at {args.large:,}: {slowest:.1f} ms (goal <= {MEDIAN_GOAL_MS:.0f} ms): "
              f"{'met' if slowest <= MEDIAN_GOAL_MS else 'NOT met'}")  # fmt: skip
        return 0
    finally:
        for server in servers:
            server.stop()
        if "django.db" in sys.modules:
            sys.modules["django.db"].connections.close_all()
        if copied:
            drop_unless_kept(server_url, small_database, args.keep_database)
        drop_unless_kept(server_url, args.database, args.keep_database)


if __name__ == "__main__":
    sys.exit(main())
