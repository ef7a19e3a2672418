"""Chaos soak: the demo's task types under sandbox faults, with workers killed, frozen and cut off.

How to run
    python scripts/soak.py --tasks N --kills K [--workers W] [--concurrency C] [--seed S] [--max-seconds T]
    make chaos                          # the full size (SOAK_ARGS); tests/chaos/test_soak.py runs a small one

    DATABASE_URL names the PostgreSQL *server* (default the local one). The soak creates its own
    database (``--database``, default ``soak_chaos``; only ``soak_*`` names, since it drops it), migrates
    it, and drops it at the end unless ``--keep-database``.

What runs
    The sandbox (this project under gunicorn, as ``bench/e2e.py`` serves it) and W ``manage.py run_worker
    --sweep`` processes (C tasks in flight each, a 2 s lease, a 0.5 s connector timeout, fast lookups and
    resends, 20 ms model turns). N tasks are created evenly over a chaos window of N / 6 seconds (at least
    20 s): ``refund_request`` (every kind of wait, an approval, three effects and a compensation),
    ``pay_invoice`` (one payment) and ``order_lookup`` (evidence and a model turn). Every task has
    business identities of its own (order, invoice), so two effects for one of them are two performances.

What is injected (drawn from ``--seed``; how it interleaves with the workers is up to the OS)
    people    customers answer ``waiting_input`` (some twice, some again with another answer after the
              task ended); the carrier reports returns (some before the task waits for them, some
              twice with the same event id, some after the task ended); approvers decide (some reject,
              some decide twice, some a second approver contradicts, some decide after the task ended,
              some only after the request expired). Every call must be applied, acknowledged or
              cleanly refused (a transition or approval refusal) — anything else is an error.
    expiry    the soak cannot wait a request's day: for those, it moves the request's expiry and its
              task's wait deadline (the same instant in production) into the past, as a day passing would.
    policy    at mid-window every task type's policy version changes: resumed tasks replan, approvals
              given under the old version are asked for again.
    faults    about one per two tasks, queued as sandbox ``Fault`` rows throughout the window, on
              dispatch (timeouts and ambiguous answers: committed, answer lost; errors: nothing done;
              latency: committed after the caller gave up; rejections), lookup (errors) and evidence
              reads (errors, latency). Faults still unfired when the window closes are withdrawn.
              And per 500 tasks one refund whose payment is performed but answered ambiguously, after
              which the payments system never answers about it: an outcome in doubt an operator owns.
    workers   K SIGKILLs at random moments (one per stretch of the window, a random worker, replaced at
              once); 1 + K // 10 SIGSTOPs of the busiest worker for three lease TTLs, then SIGCONT (its
              leases lapse and are taken over; its late writes must be fenced off); 1 + K // 10 terminations
              of every worker session (``pg_terminate_backend`` on the pools' and liveness locks'
              sessions, ``application_name`` ``durable-worker*``): the workers must ride through.

What is checked (once every task is terminal or owned and the plan has run, or ``--max-seconds`` passed;
workers stopped, the sandbox still answering lookups)
    lost        a task neither terminal nor owned by a person: quarantined, escalated, waiting for a
                person, or ``outcome_unknown`` while its system still cannot answer a lookup of the
                effect in doubt (asked now). Anything else — still ready, waiting for a retry or an
                event, in doubt about an effect its system can answer for — is lost. A quarantine
                for a ``step_error`` (a step raised) is owned, but still a violation: a defect.
    duplicates  a logical action is one business effect of one task: the charge of an invoice, the
                refund of an order, the ticket opened for it, the ticket closed, the customer's email
                (each task owns its invoice or order). Duplicates are the sandbox ``Effect`` rows beyond
                the first for one of them, however the ledger keyed them. The sandbox holds at most one
                effect per idempotency key by construction; a key sent more than once (``deliveries``)
                is a send the sandbox deduplicated: reported, not a duplicate (a resend after "absent"
                whose first send landed late after all).
    ledger      the ledger agrees with the sandbox: every effect was intended by a ledger action that
                is not ``intended`` or failed, and got no more sends than the ledger claimed (each
                claim counts one); every action the ledger calls succeeded has its effect (same
                reference, same request); every completed task's effects were performed.
    chains      every task's audit chain verifies (``audit.verify.verify_task``).
    and         no worker exited on its own, no call above raised an error, the sandbox answered no
                500, the run settled within the time limit.

Output: a summary, then exactly one line
    chaos: tasks N, kills K, faults F, duplicates D, lost L, chains ok|<n> broken
where F counts the faults that fired. The exit status is 1 on any violation.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import httpx
import migrated_template  # scripts/, beside this file
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python scripts/soak.py` puts scripts/ first, not the project

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest
    from demo.sandbox.models import Effect
    from ledger.models import Action
    from tasks.models import Task

DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
LEASE_TTL = 2.0
FREEZE_FOR = 3 * LEASE_TTL  # a frozen worker's leases lapse and are taken over meanwhile
CREATE_RATE = 6.0  # tasks per second over the chaos window
MIN_WINDOW = 20.0
TICK = 0.1
SANDBOX_PROCESSES, SANDBOX_THREADS = 2, 4
# DEBUG off is production, which refuses to start without a SECRET_KEY; the soak's database is thrown
# away after the run, so public soak-only values do. Its own sandbox answers only SANDBOX_TOKEN.
# The audit chain's key and the field-sealing key too: DEBUG off needs them all.
SOAK_ENV = {
    "SECRET_KEY": "soak-only-not-secret",
    "SANDBOX_TOKEN": "soak-only-sandbox-token",
    "AUDIT_HMAC_KEYS": "soak:soak-only-audit-chain-key-not-secret!",
    "FIELD_ENCRYPTION_KEYS": "soak:c29hay1vbmx5LWZpZWxkLWtleS1ub3Qtc2VjcmV0ISE=",
    "AUDIT_ANCHOR_KEY": "odiIpdLndLBkU6JRuoLCJhi9LJpAc7L5L0VtGzGIaDE=",  # public, soak-only
}
WORKER_ENV = {
    # The connector gives up after 0.5 s; every injected commit lands within 0.8 s of arriving. A lookup
    # that finds nothing is trusted as "absent" only once the send cannot land any more: past the send
    # window (runtime.dispatch.SEND_WINDOW, 2 s) plus the timeout plus that 0.8 s.
    "CONNECTOR_TIMEOUT": "0.5",
    "CONNECTOR_MAX_IN_FLIGHT": "4",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
    "LATE_EFFECT_RECHECK_EVERY": "1",
    # The payment whose system never answers (Humans._never_answered) is escalated within the run.
    "UNKNOWN_OUTCOME_ESCALATE_AFTER": "10",
    "MODEL_LATENCY_MS": "20",
    # The connections each worker's slots share: W workers, the sandbox, and a replacement starting
    # while a killed worker's sessions end stay far below max_connections (a shared server).
    "WORKER_DB_CONNECTIONS": "4",
    # Warnings too: they show the chaos reaching the recovery paths (WORKER_EVIDENCE).
    "LOG_LEVEL": "WARNING",
}
# Warnings the workers log, by how they start, that show what the chaos did to them.
WORKER_EVIDENCE = {
    "database connection lost": "sessions lost",
    "heartbeat failed": "heartbeats failed",
    "leases lost": "leases found lost",
    "not sending": "sends withheld (fenced or too late)",
    "answer arrived after": "answers arriving after others settled them",
}
WORKER_APPLICATION_NAMES = "durable-worker%"  # runtime.db's pool and tasks.liveness's lock sessions
NEW_POLICY = "2026-12-soak"
TYPE_MIX = (("refund_request", 4), ("pay_invoice", 3), ("order_lookup", 3))
ORDER_STATUSES = ("delivered", "shipped", "processing", "returned")
ITEMS = ("lid", "handle", "spout", "base")
# (system, operation, kind, weight). What each kind does: demo.sandbox.models.Fault.
FAULT_MIX = (
    ("payments", "dispatch", "timeout", 3),
    ("payments", "dispatch", "ambiguous", 3),
    ("payments", "dispatch", "error", 3),
    ("payments", "dispatch", "latency", 2),
    ("payments", "dispatch", "reject", 1),  # a refund refused: its ticket is closed again (compensation)
    ("tickets", "dispatch", "timeout", 1),
    ("tickets", "dispatch", "ambiguous", 1),
    ("tickets", "dispatch", "error", 1),
    ("email", "dispatch", "ambiguous", 1),
    ("email", "dispatch", "latency", 1),
    ("payments", "lookup", "error", 2),
    ("tickets", "lookup", "error", 1),
    ("email", "lookup", "error", 1),
    ("orders", "read", "error", 2),
    ("orders", "read", "latency", 2),
)
FAULTS_PER_TASK = 0.5
STUCK_PER_TASKS = 500  # one payment whose system never answers per this many tasks (at least one)


# ---------------------------------------------------------------------------
# The plan, drawn once from the seed
# ---------------------------------------------------------------------------


@dataclass
class Human:
    """What the people around one refund do; ``expire``: its approver waits until the request expired."""

    delay: float  # seconds after the task starts waiting
    item: str
    input_twice: bool
    input_late: bool
    event_early: bool
    event_twice: bool
    event_late: bool
    decision: str
    decide_twice: str  # "": once; "same": the approver repeats it; "other": a second approver contradicts
    decide_late: bool
    expire: bool
    stuck: bool = False  # its payment's system never answers about it (see Humans._never_answered)
    expired: bool = False  # the expiry was staged (only the first request expires)


@dataclass
class Script:
    index: int
    at: float  # seconds into the window
    task_type: str
    input: dict[str, Any]
    order: dict[str, str] | None  # the order record the task reads, None when it has none to read
    create_twice: bool  # the creation is repeated with the same idempotency key
    human: Human | None = None

    @property
    def order_id(self) -> str:
        return str(self.input.get("order_id", ""))


@dataclass(frozen=True)
class FaultSpec:
    at: float
    system: str
    operation: str
    kind: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Event:
    at: float
    what: str  # kill | freeze | thaw | cut | policy
    pick: int = 0  # which worker a kill hits: an index into those running at the time


@dataclass
class Plan:
    window: float
    scripts: list[Script]
    faults: list[FaultSpec]
    events: list[Event]

    @classmethod
    def draw(cls, rng: random.Random, tasks: int, kills: int) -> Plan:
        window = max(MIN_WINDOW, tasks / CREATE_RATE)
        scripts = [_script(rng, index, index * window / tasks) for index in range(tasks)]
        refunds = [s for s in scripts if s.human is not None and s.human.decision == "approve"]
        for script in rng.sample(refunds, min(len(refunds), 1 + tasks // STUCK_PER_TASKS)):
            assert script.human is not None and script.order is not None
            script.order["status"] = "delivered"  # triaged as a refund, so that it gets to the payment
            script.order["total"] = script.input["amount"]
            script.human.stuck, script.human.expire = True, False
        kinds = [spec[:3] for spec in FAULT_MIX]
        weights = [spec[3] for spec in FAULT_MIX]
        faults = sorted(
            (
                FaultSpec(rng.uniform(0, 0.9 * window), system, operation, kind, _fault_params(rng, kind))
                for system, operation, kind in rng.choices(
                    kinds, weights, k=max(1, int(tasks * FAULTS_PER_TASK))
                )
            ),
            key=lambda spec: spec.at,
        )
        # One kill per stretch of the window, at a random moment inside it.
        stretch = 0.8 * window / max(kills, 1)
        events = [
            Event(0.1 * window + (k + rng.random()) * stretch, "kill", rng.randrange(1000))
            for k in range(kills)
        ]
        for _ in range(1 + kills // 10):
            frozen_at = rng.uniform(0.2, 0.6) * window
            events += [Event(frozen_at, "freeze"), Event(frozen_at + FREEZE_FOR, "thaw")]
            events.append(Event(rng.uniform(0.15, 0.85) * window, "cut"))
        events.append(Event(0.5 * window, "policy"))
        return cls(window, scripts, faults, sorted(events, key=lambda event: event.at))


def _money(rng: random.Random, low: int, high: int) -> Decimal:
    return Decimal(rng.randrange(low, high)) / 100


def _script(rng: random.Random, index: int, at: float) -> Script:
    task_type = rng.choices([name for name, _ in TYPE_MIX], [weight for _, weight in TYPE_MIX])[0]
    create_twice = rng.random() < 0.05
    if task_type == "pay_invoice":
        invoice = {
            "invoice_id": f"INV-{index:05d}",
            "amount": str(_money(rng, 100, 100_000)),
            "currency": "EUR",
        }
        return Script(index, at, task_type, invoice, None, create_twice)
    if task_type == "order_lookup":
        order = {"status": rng.choice(ORDER_STATUSES)}
        missing = rng.random() < 0.03  # no such order: the task fails, evidence missing
        return Script(
            index, at, task_type, {"order_id": f"L-{index:05d}"}, None if missing else order, create_twice
        )
    amount = _money(rng, 100, 50_000)
    # Most orders support the refund; the rest are triaged to manual review (a failure, by design).
    status = "delivered" if rng.random() < 0.9 else "shipped"
    order = {
        "status": status,
        "total": str(amount + _money(rng, 0, 5_000)),
        "card": f"visa-{rng.randrange(1000, 10_000)}",
    }
    refund = {
        "order_id": f"R-{index:05d}",
        "customer_email": f"customer{index}@example.com",
        "amount": str(amount),
        "currency": "USD",
        "reason": "Item arrived damaged",
    }
    human = Human(
        delay=rng.uniform(0.1, 1.5),
        item=rng.choice(ITEMS),
        input_twice=rng.random() < 0.2,
        input_late=rng.random() < 0.1,
        event_early=rng.random() < 0.15,
        event_twice=rng.random() < 0.2,
        event_late=rng.random() < 0.15,
        decision="reject" if rng.random() < 0.1 else "approve",
        decide_twice=rng.choice(("", "", "", "same", "other")),
        decide_late=rng.random() < 0.1,
        expire=rng.random() < 0.06,
    )
    return Script(index, at, task_type, refund, order, create_twice, human)


def _fault_params(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "timeout":
        return {"seconds": 1}  # committed, then hangs past the connector's 0.5 s
    if kind == "latency":
        return {"ms": rng.choice((200, 800))}  # a slow answer, or one the caller no longer waits for
    return {}


# ---------------------------------------------------------------------------
# Processes: the database, the sandbox, the workers
# (bench/ has the like, but importing it from scripts/ would put bench/ under `make lint`'s strict mypy)
# ---------------------------------------------------------------------------


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def recreate_database(server_url: str, dbname: str, *, create: bool) -> None:
    """Drop ``dbname`` on the server (even with sessions left), and create it afresh if ``create``: a copy
    of the migrated template (``migrated_template``), which the soak's ``migrate`` then finds current."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    if create:
        migrated_template.create(server_url, dbname)


def child_env(url: str, sandbox: str) -> dict[str, str]:
    """Production settings on loopback against the soak's database, for the sandbox and the workers."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": url,
        "DEBUG": "0",
        **{name: os.environ.get(name, value) for name, value in SOAK_ENV.items()},  # secrets, sandbox token
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0",  # the sandbox is plain HTTP on loopback
        "CELERY_BROKER_URL": "memory://",  # workers poll PostgreSQL; no doorbell reaches a real broker
        "SANDBOX_BASE_URL": sandbox,
        "SANDBOX_ENABLED": "1",  # off by default with DEBUG off; this server is the soak's own sandbox
        "LOG_LEVEL": "ERROR",
    }


def _die_with_parent() -> None:
    """In each child, before exec: the kernel SIGKILLs it if the soak dies first, so none outlives a run."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Sandbox:
    """The sandbox systems: this project's WSGI app under gunicorn on a free port, logging errors only
    (a 500 shows as "Internal Server Error" in ``log``)."""

    def __init__(self, url: str, log: Path):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/sandbox"
        self.log = log
        command = [
            sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}",
            "--workers", str(SANDBOX_PROCESSES), "--threads", str(SANDBOX_THREADS),
            "--worker-class", "gthread", "--log-level", "warning",
        ]  # fmt: skip
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=child_env(url, self.url), stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the sandbox did not start: {log.read_text(errors='replace')[-2000:]}")
            try:
                httpx.get(f"{self.url}/orders/records/ping", timeout=1)  # any answer will do
                return
            except httpx.HTTPError:
                time.sleep(0.2)

    def server_errors(self) -> int:
        return self.log.read_text(errors="replace").count("Internal Server Error")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Fleet:
    """The ``run_worker --sweep`` processes: started, SIGKILLed and replaced, frozen and thawed, stopped."""

    def __init__(self, size: int, url: str, sandbox: str, logs: Path, concurrency: int):
        self.command = [
            sys.executable, "manage.py", "run_worker", "--sweep", "--concurrency", str(concurrency),
            "--lease-ttl", str(LEASE_TTL), "--idle", "0.1", "--drain", "2",
        ]  # fmt: skip
        self.env = {**child_env(url, sandbox), **WORKER_ENV}
        self.logs = logs
        self.log_of: dict[int, Path] = {}
        self.frozen: list[subprocess.Popen[bytes]] = []
        self.crashed: list[str] = []  # how each worker that exited on its own ended (its log's tail)
        self.workers = [self._start() for _ in range(size)]

    def _start(self) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{len(self.log_of) + 1}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.log_of[process.pid] = log
        return process

    @staticmethod
    def worker_id(process: subprocess.Popen[bytes]) -> str:
        return f"{socket.gethostname()}:{process.pid}"  # as runtime.workers.worker_id names it

    def running(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w not in self.frozen]

    def kill(self, victim: subprocess.Popen[bytes]) -> None:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        self.workers[self.workers.index(victim)] = self._start()

    def freeze(self, victim: subprocess.Popen[bytes]) -> bool:
        """SIGSTOP ``victim``, unless it is the last worker still running (someone must take over)."""
        if len(self.workers) - len(self.frozen) < 2:
            return False
        os.kill(victim.pid, signal.SIGSTOP)
        self.frozen.append(victim)
        return True

    def thaw(self) -> None:
        if self.frozen:
            os.kill(self.frozen.pop(0).pid, signal.SIGCONT)

    def replace_crashed(self) -> None:
        """Only the soak ends workers: one that exited is recorded (a violation) and replaced."""
        for index, worker in enumerate(self.workers):
            if worker.poll() is not None:
                tail = "\n".join(self.log_of[worker.pid].read_text(errors="replace").splitlines()[-15:])
                self.crashed.append(f"worker {worker.pid} exited {worker.returncode}:\n{tail}")
                self.workers[index] = self._start()

    def stop(self) -> None:
        for worker in self.frozen:
            os.kill(worker.pid, signal.SIGCONT)
        self.frozen.clear()
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def logged(self) -> tuple[Counter[str], Counter[str]]:
        """From the workers' logs: the exception each traceback ended with, and the WORKER_EVIDENCE seen."""
        tracebacks: Counter[str] = Counter()
        evidence: Counter[str] = Counter()
        for log in self.log_of.values():
            inside = False
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("Traceback (most recent call last):"):
                    inside = True
                elif inside and line and not line[0].isspace():
                    tracebacks[line[:160]] += 1
                    inside = False
                else:
                    evidence.update(name for start, name in WORKER_EVIDENCE.items() if line.startswith(start))
        return tracebacks, evidence


# ---------------------------------------------------------------------------
# The people and systems around the tasks (in this process, through the services)
# ---------------------------------------------------------------------------


@dataclass
class Humans:
    """Customers answer, the carrier reports returns, approvers decide: each after ``Human.delay``.

    Every call is tallied as applied, acknowledged (a repeat applied nothing), or refused with its
    code; anything else it raises is an error. Calls planned for after a task's end run once it has.
    """

    approvers: tuple[Any, ...]
    integrator: Any  # tasks.transitions.Actor
    humans: dict[UUID, Human] = field(default_factory=dict)
    tally: dict[str, Counter[str]] = field(
        default_factory=lambda: {"inputs": Counter(), "events": Counter(), "decisions": Counter()}
    )
    errors: list[str] = field(default_factory=list)
    stuck: set[UUID] = field(default_factory=set)
    handled: set[tuple[UUID, int]] = field(default_factory=set)  # (task, version) of the waits acted on
    after_end: dict[UUID, list[Callable[[], None]]] = field(default_factory=dict)

    def act(self) -> None:
        from django.utils import timezone

        from tasks.models import Task
        from tasks.states import TERMINAL, State

        now = timezone.now()
        answer = {
            State.WAITING_INPUT: self._answer,
            State.WAITING_EXTERNAL: self._report_return,
            State.WAITING_APPROVAL: self._decide,
        }
        for task in Task.objects.filter(state__in=list(answer)).order_by("state_entered_at"):
            human = self.humans.get(task.id)
            if human is None or (task.id, task.state_version) in self.handled:
                continue
            if now < task.state_entered_at + timedelta(seconds=human.delay):
                continue
            self.handled.add((task.id, task.state_version))
            answer[State(task.state)](task, human)
        if self.after_end:
            ended = Task.objects.filter(pk__in=list(self.after_end), state__in=TERMINAL)
            for task_id in ended.values_list("id", flat=True):
                for call in self.after_end.pop(task_id):
                    call()

    def started(self, task: Task, human: Human) -> None:
        self.humans[task.id] = human
        if human.event_early:  # kept, and applied when the task gets to the wait
            self._event(task, f"return-{task.id}", twice=human.event_twice)
        if human.event_late:
            self._after_end(task, lambda: self._event(task, f"return-{task.id}"))  # the same event id again
            self._after_end(task, lambda: self._event(task, f"return-{task.id}-late"))  # a new one

    # --- the calls -------------------------------------------------------------------------------

    def _answer(self, task: Task, human: Human) -> None:
        from tasks.services import task_provide_input

        version = task.state_version

        def provide(answer: str) -> Callable[[], object]:
            return lambda: task_provide_input(
                _fresh(task), expected_version=version, answer=answer, actor=self.integrator
            )

        self._call("inputs", provide(human.item))
        if human.input_twice:
            self._call("inputs", provide(human.item))
        if human.input_late:  # another answer to a wait long over
            self._after_end(task, lambda: self._call("inputs", provide(f"not the {human.item}")))

    def _report_return(self, task: Task, human: Human) -> None:
        if not human.event_early:
            self._event(task, f"return-{task.id}", twice=human.event_twice)

    def _event(self, task: Task, key: str, *, twice: bool = False) -> None:
        from tasks.services import task_deliver_event

        def deliver() -> object:
            return task_deliver_event(
                _fresh(task),
                event_key=key,
                event_type="shipment.returned",
                payload={"tracking_number": f"TRK-{key}"},
                actor=self.integrator,
            )

        self._call("events", deliver)
        if twice:
            self._call("events", deliver)

    def _decide(self, task: Task, human: Human) -> None:
        from approvals.models import ApprovalRequest, ApprovalStatus

        request = ApprovalRequest.objects.filter(
            task=task, status=ApprovalStatus.PENDING, waiting_version=task.state_version
        ).first()
        if request is None:
            self.errors.append(
                f"decisions: {task.id} waits for approval at v{task.state_version}, no request"
            )
            return
        first, second = self._deciders(request)
        other = "reject" if human.decision == "approve" else "approve"
        if human.stuck and task.id not in self.stuck:
            self._never_answered(task, request)
        if human.expire and not human.expired:
            human.expired = True
            _expire(task, request)
            self._call("decisions", _decision(request, first, human.decision))
            self._after_end(task, lambda: self._call("decisions", _decision(request, first, human.decision)))
            return
        self._call("decisions", _decision(request, first, human.decision))
        if human.decide_twice == "same":
            self._call("decisions", _decision(request, first, human.decision))
        elif human.decide_twice == "other":
            self._call("decisions", _decision(request, second, other))
        if human.decide_late:
            self._after_end(task, lambda: self._call("decisions", _decision(request, second, other)))

    def _deciders(self, request: ApprovalRequest) -> tuple[Any, Any]:
        """Who decides ``request`` and who contradicts: the first approver separation of duties lets
        decide it (one who decided an earlier request for this action may not: a repeat request goes
        to another), and another approver."""
        from approvals import authority

        may = [user for user in self.approvers if authority.refusal(user, request) is None]
        first = may[0] if may else self.approvers[0]
        return first, next(user for user in self.approvers if user != first)

    def _never_answered(self, task: Task, request: ApprovalRequest) -> None:
        """The refund's payment is performed but answered ambiguously, and from then on the payments
        system answers every lookup of it with an error: an outcome in doubt only an operator can settle.

        Its idempotency key is the ledger's (``ActionIntent`` in ``effect_keys.scope_of`` the task) for the
        effect this request authorizes.
        """
        from demo.sandbox.models import Fault
        from tasks import effect_keys
        from tasks.transitions import ActionIntent

        effect = request.opened("consequential")["effect"]  # the card is stored sealed to the request
        intent = ActionIntent(step=request.action_step, connector="payments", effect=effect)
        key = intent.idempotency_key(effect_keys.scope_of(task))
        Fault.objects.create(system="payments", operation="dispatch", kind="ambiguous", params={"key": key})
        Fault.objects.create(
            system="payments", operation="lookup", kind="error", params={"key": key, "standing": True}
        )
        self.stuck.add(task.id)

    # --- bookkeeping -----------------------------------------------------------------------------

    def _after_end(self, task: Task, call: Callable[[], None]) -> None:
        self.after_end.setdefault(task.id, []).append(call)

    def _call(self, kind: str, call: Callable[[], object]) -> None:
        from approvals.services import ApprovalRefused
        from tasks.checkpoints import CheckpointUnreadable
        from tasks.exceptions import TransitionError

        try:
            result = call()
        except ApprovalRefused as refusal:
            self.tally[kind][f"refused {refusal.code}"] += 1
        except TransitionError as refusal:
            self.tally[kind][f"refused {refusal.code}"] += 1
        except CheckpointUnreadable as refusal:
            self.tally[kind][f"refused {refusal.reason}"] += 1
        except Exception as error:  # a call must be applied or refused: anything else is a defect
            self.errors.append(f"{kind}: {type(error).__name__}: {error}")
        else:
            self.tally[kind][_delivered(result)] += 1


def _fresh(task: Task) -> Task:
    """The task as it stands now (each call reads it afresh, as each API request would)."""
    return type(task).objects.get(pk=task.pk)


def _decision(request: ApprovalRequest, user: Any, decision: str) -> Callable[[], object]:
    from approvals.services import approval_decide

    def decide() -> object:
        shown = type(request).objects.get(pk=request.pk)  # what the approver's page shows now
        return approval_decide(shown, user=user, decision=decision, digest_seen=request.digest)

    return decide


def _delivered(result: Any) -> str:
    if not result.applied:
        return "acknowledged"
    note = getattr(result, "note", "")
    if note.startswith("stored"):
        return "kept until awaited"
    if "already ended" in note:
        return "recorded after the end"
    return "applied"


def _expire(task: Task, request: ApprovalRequest) -> None:
    """A day passes for this one request: its expiry and its task's wait deadline (set together, to the
    same instant, when it was asked) move into the past; the sweep expires both."""
    from django.db import transaction
    from django.utils import timezone

    from approvals.models import ApprovalStatus
    from tasks.states import State

    past = timezone.now() - timedelta(seconds=1)
    with transaction.atomic():
        still_waiting = type(task).objects.filter(
            pk=task.pk, state=State.WAITING_APPROVAL, state_version=request.waiting_version
        )
        if still_waiting.update(wait_deadline=past):
            type(request).objects.filter(pk=request.pk, status=ApprovalStatus.PENDING).update(expires_at=past)


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    in_hand_at_kills: int = 0  # live leases the killed workers held
    freezes: int = 0
    in_hand_at_freezes: int = 0
    cuts: int = 0
    sessions_cut: int = 0
    policy_changed_at: float | None = None
    faults_withdrawn: int = 0
    created: int = 0
    settled_after: float | None = None


class Soak:
    def __init__(self, plan: Plan, fleet: Fleet, humans: Humans, tenant: Any, dbname: str):
        self.plan, self.fleet, self.humans, self.tenant, self.dbname = plan, fleet, humans, tenant, dbname
        self.tally = Tally()
        self.faults_queued = 0
        self.events_done = 0
        self.window_closed = False

    def run(self, max_seconds: float) -> None:
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            self.fleet.replace_crashed()
            self._create_due(elapsed)
            self._queue_faults_due(elapsed)
            self._chaos_due(elapsed)
            if elapsed >= self.plan.window and not self.window_closed:
                self._close_window()
            self.humans.act()
            if self.window_closed and self.events_done == len(self.plan.events) and not self._moving():
                self.tally.settled_after = elapsed
                break
            if elapsed > max_seconds:
                break
            time.sleep(TICK)
        self.humans.act()  # calls due after the end of tasks that ended since the last round

    def _create_due(self, elapsed: float) -> None:
        scripts = self.plan.scripts
        while self.tally.created < len(scripts) and scripts[self.tally.created].at <= elapsed:
            self._start(scripts[self.tally.created])
            self.tally.created += 1

    def _start(self, script: Script) -> None:
        """Create the script's task (twice with the same idempotency key, for some: one task)."""
        from tasks.services import task_create

        objective = {
            "refund_request": f"Refund order {script.order_id}",
            "pay_invoice": f"Pay {script.input.get('invoice_id')}",
            "order_lookup": f"Look up {script.order_id}",
        }[script.task_type]

        def create() -> tuple[Task, bool]:
            return task_create(
                tenant=self.tenant,
                task_type=script.task_type,
                objective=objective,
                input=script.input,
                actor=self.humans.integrator,
                idempotency_key=f"soak-{script.index}",
            )

        task, _ = create()
        if script.create_twice:
            again, created = create()
            if created or again.pk != task.pk:
                self.humans.errors.append(f"creation: key soak-{script.index} started a second task")
        if script.human is not None:
            self.humans.started(task, script.human)

    def _queue_faults_due(self, elapsed: float) -> None:
        from demo.sandbox.models import Fault

        while (
            self.faults_queued < len(self.plan.faults) and self.plan.faults[self.faults_queued].at <= elapsed
        ):
            spec = self.plan.faults[self.faults_queued]
            Fault.objects.create(
                system=spec.system, operation=spec.operation, kind=spec.kind, params=spec.params
            )
            self.faults_queued += 1

    def _close_window(self) -> None:
        """Faults still queued when the window closes are withdrawn (all but the standing ones)."""
        from demo.sandbox.models import Fault

        self.tally.faults_withdrawn, _ = (
            Fault.objects.filter(remaining__gt=0).exclude(params__has_key="standing").delete()
        )
        self.window_closed = True

    def _chaos_due(self, elapsed: float) -> None:
        while self.events_done < len(self.plan.events) and self.plan.events[self.events_done].at <= elapsed:
            event = self.plan.events[self.events_done]
            self.events_done += 1
            if event.what == "kill":
                running = self.fleet.running()
                victim = running[event.pick % len(running)]
                self.tally.in_hand_at_kills += self._in_hand(victim)
                self.fleet.kill(victim)
                self.tally.kills += 1
            elif event.what == "freeze":
                # The busiest: a worker frozen with nothing in hand would leave nothing to take over.
                in_hand, _, victim = max((self._in_hand(w), w.pid, w) for w in self.fleet.running())
                if self.fleet.freeze(victim):
                    self.tally.freezes += 1
                    self.tally.in_hand_at_freezes += in_hand
            elif event.what == "thaw":
                self.fleet.thaw()
            elif event.what == "cut":
                self._cut_worker_sessions()
            else:
                self._change_policy(elapsed)

    @staticmethod
    def _in_hand(worker: subprocess.Popen[bytes]) -> int:
        """The live leases ``worker`` holds."""
        from django.utils import timezone

        from tasks.models import Lease

        return Lease.objects.filter(worker_id=Fleet.worker_id(worker), expires_at__gt=timezone.now()).count()

    def _cut_worker_sessions(self) -> None:
        """Terminate every worker session on the soak's database — never this driver's own."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name LIKE %s",
                [self.dbname, WORKER_APPLICATION_NAMES],
            )
            self.tally.sessions_cut += sum(bool(ended) for (ended,) in cursor.fetchall())
        self.tally.cuts += 1

    def _change_policy(self, elapsed: float) -> None:
        from tasks.models import Policy

        Policy.objects.update(version=NEW_POLICY, changed_by="soak")
        self.tally.policy_changed_at = elapsed

    def _moving(self) -> bool:
        """Whether any task may still move: neither terminal, quarantined, nor the payment in doubt the
        soak made unanswerable on purpose (once the reconciler has escalated it)."""
        from tasks.models import Task
        from tasks.states import TERMINAL, State

        return (
            Task.objects.exclude(state__in=TERMINAL)
            .exclude(state=State.QUARANTINED)
            .exclude(pk__in=self.humans.stuck, state=State.OUTCOME_UNKNOWN, escalation_level__gt=0)
            .exists()
        )


# Approvers enough that a request asked again (and again) still finds one who decided none before.
APPROVERS = 4


def seed(plan: Plan) -> tuple[Any, tuple[Any, ...]]:
    """The tenant, its approvers, every task type's policy at the default version, the order records."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from demo.sandbox.models import Record
    from tasks import registry
    from tasks.models import Policy
    from tenancy.models import Role, Tenant
    from tenancy.services import grant_role

    tenant = Tenant.objects.create(slug="soak", name="Soak")
    approvers = tuple(
        get_user_model().objects.create_user(username=f"soak-approver{n}") for n in range(1, APPROVERS + 1)
    )
    for approver in approvers:
        grant_role(approver, tenant, Role.APPROVER)
    Policy.objects.bulk_create(
        Policy(task_type=name, version=settings.DEFAULT_POLICY_VERSION) for name in registry.names()
    )
    Record.objects.bulk_create(
        Record(system="orders", record_id=script.order_id, data=script.order)
        for script in plan.scripts
        if script.order is not None
    )
    return tenant, approvers


# ---------------------------------------------------------------------------
# The verdict (workers stopped, the sandbox still answering)
# ---------------------------------------------------------------------------


@dataclass
class Verdict:
    states: Counter[str]
    owned: Counter[str]
    lost: list[str]
    duplicates: list[str]  # one line per logical action performed more than once
    extra_effects: int  # the performances beyond the first, summed: the D of the last line
    mismatches: list[str]  # ledger and sandbox disagree
    broken: list[str]
    faults: Counter[str]
    deduplicated_sends: int
    late_landings: int


def _identity(system: str, request: dict[str, Any]) -> tuple[str, str, str]:
    """The logical action an effect performs: what it did, to which invoice, order or ticket."""
    kind = str(request.get("kind", ""))
    target = (
        request.get("invoice") or request.get("order_id") or request.get("ticket") or request.get("subject")
    )
    return system, kind, str(target)


def _expected(task: Task) -> list[tuple[str, str, str]]:
    """The logical actions a completed task performed."""
    if task.task_type == "pay_invoice":
        return [("payments", "charge", task.input["invoice_id"])]
    if task.task_type == "refund_request":
        order = task.input["order_id"]
        return [
            ("tickets", "ticket.open", f"Refund for order {order}"),
            ("payments", "refund", order),
            ("email", "email", order),
        ]
    return []


def judge() -> Verdict:
    from audit.verify import verify_task
    from demo.sandbox.models import Effect, Fault
    from ledger.models import Action
    from tasks.models import Task

    tasks = list(Task.objects.order_by("created_at"))
    actions = list(Action.objects.order_by("id"))
    effects = list(Effect.objects.order_by("id"))
    owned, lost = _owned_or_lost(tasks, actions)
    performed = Counter(_identity(effect.system, effect.request) for effect in effects)
    mismatches, late_landings = _disagreements(tasks, actions, effects, performed)
    # A standing fault never runs out: it counts once, if the effect it keeps in doubt was performed.
    keys = {effect.idempotency_key for effect in effects}
    fired = [
        f
        for f in Fault.objects.all()
        if f.remaining == 0 or f.params.get("standing") and f.params["key"] in keys
    ]
    return Verdict(
        states=Counter(task.state for task in tasks),
        owned=owned,
        lost=lost,
        duplicates=[
            f"{' '.join(identity)} performed {n} times" for identity, n in performed.items() if n > 1
        ],
        extra_effects=sum(n - 1 for n in performed.values() if n > 1),
        mismatches=mismatches,
        broken=[str(link) for task in tasks if (link := verify_task(task)) is not None],
        faults=Counter(f"{f.system} {f.operation} {f.kind}" for f in fired),
        deduplicated_sends=sum(effect.deliveries - 1 for effect in effects),
        late_landings=late_landings,
    )


def _owned_or_lost(tasks: list[Task], actions: list[Action]) -> tuple[Counter[str], list[str]]:
    """Each task that has not ended: who owns it now, or a line saying why it is lost."""
    from ledger import connectors
    from ledger.connectors.base import OutcomeUnknown
    from ledger.models import IN_DOUBT
    from tasks.states import TERMINAL, State

    def answers(action: Action) -> bool:
        try:
            connectors.get(action.connector).lookup(action.idempotency_key)
        except OutcomeUnknown:
            return False
        return True

    owned: Counter[str] = Counter()
    lost = []
    for task in tasks:
        if task.state in TERMINAL:
            continue
        if task.state == State.QUARANTINED:
            owned[f"quarantined ({task.state_reason})"] += 1
        elif task.state == State.OUTCOME_UNKNOWN:
            doubt = [a for a in actions if a.task_id == task.pk and a.dispatch_state in IN_DOUBT]
            silent = sorted({a.connector for a in doubt if not answers(a)})
            if silent:
                owned[f"outcome_unknown ({', '.join(silent)} cannot answer)"] += 1
            else:
                lost.append(f"{task.id} {task.task_type} outcome_unknown, yet its systems answer")
        elif task.escalation_level:
            owned[f"escalated ({task.state})"] += 1
        elif task.state in (State.WAITING_INPUT, State.WAITING_APPROVAL):
            owned[f"{task.state} (a person's turn)"] += 1
        else:
            lost.append(f"{task.id} {task.task_type} {task.state} ({task.state_reason})")
    return owned, lost


def _disagreements(
    tasks: list[Task], actions: list[Action], effects: list[Effect], performed: Counter[tuple[str, str, str]]
) -> tuple[list[str], int]:
    """Where the ledger and the sandbox disagree (and how many effects landed after being found absent)."""
    from audit import sealing
    from ledger.models import SETTLED_FAILED, SETTLED_OK, DispatchState
    from tasks.states import State

    by_key = {action.idempotency_key: action for action in actions}
    effect_of = {(effect.system, effect.idempotency_key): effect for effect in effects}
    mismatches = []
    late_landings = 0
    for effect in effects:
        action = by_key.get(effect.idempotency_key)
        if action is None or action.connector != effect.system:
            mismatches.append(
                f"{effect.system} {effect.idempotency_key}: performed, no ledger action intended it"
            )
            continue
        if action.dispatch_state == DispatchState.INTENDED or action.dispatch_state in SETTLED_FAILED:
            mismatches.append(f"{action}: performed, yet the ledger says {action.dispatch_state}")
        elif action.dispatch_state == DispatchState.RECONCILED_ABSENT:
            late_landings += 1  # landed after it was found absent: sent again (same key) or rechecked later
        if effect.deliveries > action.attempts:  # each claim counts one send: these sends nobody claimed
            mismatches.append(
                f"{action}: the system got {effect.deliveries} sends, the ledger claimed {action.attempts}"
            )
    for action in actions:
        if action.dispatch_state not in SETTLED_OK:
            continue
        found = effect_of.get((action.connector, action.idempotency_key))
        if found is None:
            mismatches.append(f"{action}: succeeded in the ledger, the system has no such effect")
        elif (action.external_ref, sealing.open_effect(action.idempotency_key, action.effect)) != (
            str(found.pk),
            found.request,
        ):  # the ledger keeps sensitive keys sealed; the system got them opened
            mismatches.append(f"{action}: the ledger's reference or request is not the system's")
    for task in tasks:
        if task.state == State.COMPLETED:
            missing = [" ".join(i) for i in _expected(task) if i not in performed]
            mismatches += [f"{task.id} completed, but {identity} was never performed" for identity in missing]
    return mismatches, late_landings


def history() -> Counter[str]:
    """How often the recovery paths ran, from the audit log and the lease takeovers."""
    from django.db.models import Count

    from approvals.models import ApprovalRequest
    from audit.models import LeaseTakeover, TransitionEvent

    triggers = (
        "dispatch_unknown",
        "reconciled",
        "resend_backoff",
        "attempt_failed",
        "escalate",
        "quarantine",
    )
    seen: Counter[str] = Counter(
        dict(
            TransitionEvent.objects.filter(trigger__in=triggers)
            .values_list("trigger")
            .annotate(n=Count("id"))
        )
    )
    seen["replanned (policy)"] = TransitionEvent.objects.filter(reason_code="policy_changed").count()
    requests = ApprovalRequest.objects.values("task").annotate(n=Count("id"))
    seen["approvals asked again"] = sum(row["n"] - 1 for row in requests)
    seen["lease takeovers"] = LeaseTakeover.objects.count()
    return seen


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items())) or "none"


def report(args: argparse.Namespace, plan: Plan, soak: Soak, verdict: Verdict, sandbox: Sandbox) -> int:
    """Print the summary and the last line; return the exit status."""
    tally, humans = soak.tally, soak.humans
    types = Counter(script.task_type for script in plan.scripts)
    fleet, server_errors = soak.fleet, sandbox.server_errors()
    settled = f"settled {tally.settled_after:.1f} s" if tally.settled_after is not None else "NOT settled"
    print(f"soak: {args.tasks} tasks ({_counts(types)}), seed {args.seed}, {args.workers} workers x "
          f"{args.concurrency}, lease {LEASE_TTL:g} s; {settled} after the workers started "
          f"(window {plan.window:.0f} s, limit {args.max_seconds:.0f} s)")  # fmt: skip
    print(f"  states      {_counts(verdict.states)}")
    print(f"  owned       {_counts(verdict.owned)}")
    print(f"  workers     SIGKILLed {tally.kills} ({tally.in_hand_at_kills} leases in hand), SIGSTOPped "
          f"{tally.freezes} for {FREEZE_FOR:g} s ({tally.in_hand_at_freezes} leases in hand), sessions "
          f"terminated {tally.sessions_cut} in {tally.cuts} rounds, "
          f"exited on their own {len(fleet.crashed)}")  # fmt: skip
    print(f"  faults      fired {verdict.faults.total()} ({_counts(verdict.faults)}); "
          f"withdrawn unfired at the window's end {tally.faults_withdrawn}")  # fmt: skip
    print(f"  recovery    {_counts(history())}")
    print(f"  policy      {NEW_POLICY} from {tally.policy_changed_at or 0:.0f} s")
    for kind, counts in humans.tally.items():
        print(f"  {kind:<11} {_counts(counts)}")
    print(f"  sandbox     sends it deduplicated {verdict.deduplicated_sends}, landed after found absent "
          f"{verdict.late_landings}, 500s {server_errors}")  # fmt: skip
    tracebacks, evidence = fleet.logged()
    print(f"  worker logs {_counts(evidence)}; tracebacks {tracebacks.total()}" + "".join(
        f"\n    {n} x {line}" for line, n in tracebacks.most_common(5)))  # fmt: skip
    violations = [
        *(f"lost: {line}" for line in verdict.lost),
        *(f"duplicate: {line}" for line in verdict.duplicates),
        *(f"ledger: {line}" for line in verdict.mismatches),
        *(f"chain: {line}" for line in verdict.broken),
        *(f"step error: {n} task(s) {what}" for what, n in verdict.owned.items() if "step_error" in what),
        *(f"crashed: {text}" for text in fleet.crashed),
        *(f"error: {line}" for line in humans.errors),
        *([f"sandbox: {server_errors} answers were 500s (see its log)"] if server_errors else []),
        *(
            [f"time: tasks still moving after {args.max_seconds:.0f} s"]
            if tally.settled_after is None
            else []
        ),
    ]
    for line in violations[:40]:
        print(f"  VIOLATION {line}")
    if len(violations) > 40:
        print(f"  ... and {len(violations) - 40} more violations")
    chains = "ok" if not verdict.broken else f"{len(verdict.broken)} broken"
    print(f"chaos: tasks {args.tasks}, kills {tally.kills}, faults {verdict.faults.total()}, "
          f"duplicates {verdict.extra_effects}, lost {len(verdict.lost)}, chains {chains}")  # fmt: skip
    return 1 if violations else 0


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, required=True, help="tasks created over the run")
    parser.add_argument("--kills", type=int, required=True, help="workers SIGKILLed (and replaced) in all")
    parser.add_argument("--workers", type=int, default=3, help="run_worker processes (default 3, at least 2)")
    parser.add_argument("--concurrency", type=int, default=8, help="tasks in flight per worker (default 8)")
    parser.add_argument("--seed", type=int, default=1, help="draws the plan (default 1)")
    parser.add_argument("--max-seconds", type=float, help="give up this long after the workers started "
                        "(default: 60 s + twice the chaos window)")  # fmt: skip
    parser.add_argument(
        "--database", default="soak_chaos", help="throwaway database (soak_*; default soak_chaos)"
    )
    parser.add_argument("--keep-database", action="store_true", help="leave the database for inspection")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.kills < 0 or args.workers < 2 or args.concurrency < 1:
        parser.error("--tasks, --concurrency: at least 1; --kills: at least 0; --workers: at least 2")
    if not args.database.startswith("soak_"):
        parser.error("--database must start with soak_ (the soak drops it)")
    if args.max_seconds is None:
        args.max_seconds = 60 + 2 * max(MIN_WINDOW, args.tasks / CREATE_RATE)
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: workers, sandbox and database go


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    plan = Plan.draw(random.Random(args.seed), args.tasks, args.kills)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    try:
        os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=url, DEBUG="0")
        for name, value in SOAK_ENV.items():  # the verdict's lookups reach the sandbox; children inherit
            os.environ.setdefault(name, value)
        os.environ["CELERY_BROKER_URL"] = "memory://"  # the doorbells this driver rings reach no broker
        # This driver's own product calls log errors only (kombu warns of the in-memory doorbell's host).
        os.environ.setdefault("LOG_LEVEL", "ERROR")
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        from tasks.states import ActorKind
        from tasks.transitions import Actor

        call_command("migrate", verbosity=0, interactive=False)
        tenant, approvers = seed(plan)
        humans = Humans(approvers, Actor(ActorKind.INTEGRATOR, "integrator:soak"))
        with tempfile.TemporaryDirectory(prefix="soak-") as logs_dir:
            logs = Path(logs_dir)
            sandbox = Sandbox(url, logs / "sandbox.log")
            try:
                settings.SANDBOX_BASE_URL = sandbox.url  # for the lookups the verdict makes
                fleet = Fleet(args.workers, url, sandbox.url, logs, args.concurrency)
                soak = Soak(plan, fleet, humans, tenant, args.database)
                try:
                    soak.run(args.max_seconds)
                finally:
                    fleet.stop()
                return report(args, plan, soak, judge(), sandbox)
            finally:
                sandbox.stop()
    finally:
        if "django.db" in sys.modules:
            sys.modules["django.db"].connections.close_all()
        if not args.keep_database:
            recreate_database(server_url, args.database, create=False)


if __name__ == "__main__":
    sys.exit(main())
