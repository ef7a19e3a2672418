"""Demo soak: `make demo` for a long while under a scripted click-through — does it keep serving?

How to run
    python scripts/demo_soak.py [--minutes 120 | --seconds S] [--port 8000] [--var DIR] [--out FILE]
    make demo-soak [MINUTES=120] [PORT=8000]

What runs
    The demo as ``make demo`` runs it (``DEBUG=1 SANDBOX_ENABLED=1``, the demo's public keys; migrate,
    seed_demo, ``run_demo 127.0.0.1:PORT``: web, worker and beat under its supervisor) on the embedded
    default — SQLite and the filesystem broker, ``DATABASE_URL`` and ``CELERY_BROKER_URL`` unset — in a
    var directory of its own (``--var``, default ``var/demo-soak``), made afresh: a user's ``var/`` is
    never touched. The demo's output goes to ``run_demo.log`` there.

    Against it, over real HTTP (httpx, one request at a time, ``--think`` seconds apart), the demo's
    personas in tenant ``acme``, round after round:
      integrator  starts an ``order_lookup`` (runs to its end) and a ``pay_invoice`` above the money
                  policy's limit (waits for an approver) through the API, with a token made by
                  ``drf_create_token``; between the others' turns, asks after the three oldest tasks
                  it started that have not ended.
      operator    logs in; the queue, three task pages, quarantine triage, the dashboard.
      approver    logs in with the demo password and a TOTP code (the public demo secret); the
                  inbox, then opens up to two pending requests and decides them (every fourth rejected,
                  with a reason), through the confirm step as a person would.
      auditor     logs in; audit searches, a task's history, the CSV export of a search.
    Each persona logs in again every ``--relogin`` minutes (and whenever a page sends it to the login).
    ``/readyz`` is polled every 30 s.

What is recorded (``--out``, default ``bench/results/demo-soak-<UTC timestamp>.json``, rewritten every
minute, so a run cut short still leaves its figures)
    Per minute: requests, errors (a 5xx answer or no answer: refused, reset, timed out), 4xx answers,
    p50/p95 latency, tasks started and completed (and ended otherwise), child restarts the supervisor
    reported, /readyz polls and failures, the RSS of the web, worker (its pool included) and beat
    processes. Then the totals and the verdict.

Verdict (exit status 1 when it fails)
    The demo stopped serving when ``run_demo`` exited, or ``/readyz`` failed twice in a row (a minute
    not ready), or the last poll after the run failed. The run also fails when it saw more than
    ``--max-errors`` errors (default 0: any 5xx or connection error is a failure), and when it was cut
    short (Ctrl-C, SIGTERM: the figures so far are written, the demo stopped).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
# What `make demo` sets (the Makefile's DEMO_ENV): a development run with the sandbox, public keys.
DEMO_ENV = {
    "DEBUG": "1",
    "SANDBOX_ENABLED": "1",
    "SECRET_KEY": "demo-only-insecure-key",
    "SANDBOX_TOKEN": "demo-only-sandbox-token",
}
# Whatever would point the demo away from its embedded default (and from its own var directory).
UNSET = ("DATABASE_URL", "TEST_DATABASE_URL", "CELERY_BROKER_URL", "BROKER_DIR", "AUDIT_ANCHOR_DIR")
UNSET_PREFIX = ("CELERY_BEAT_SCHEDULE",)
DEMO_TOTP_SECRET = "DURABLEAGENTSDEMOSECRETNOTFORUSE"  # seed_demo's (a test checks they agree)
PASSWORD = "demo"
TENANT = "acme"
MARKER = ".demo-soak"  # in a var directory this script made (it wipes only those)
READYZ_EVERY = 30.0
TERMINAL = frozenset({"completed", "failed", "canceled", "expired"})
RESTART = re.compile(r"run_demo: (\w+) exited with code -?\d+: restarting it")
Answer = httpx.Response | None
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


# --- the pure parts -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q ≤ 100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def totp_code(secret_b32: str, *, at: float | None = None, after_step: int = -1) -> tuple[str, int]:
    """The six digits an authenticator shows for ``secret_b32`` (RFC 6238: SHA-1, 30 s steps) now or
    ``at``, and their step; the next step's if ``after_step`` (a code is good once) was now or later."""
    now = time.time() if at is None else at
    step = max(int(now // 30), after_step + 1)
    digest = hmac.new(base64.b32decode(secret_b32), struct.pack(">Q", step), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    number = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return f"{number % 1_000_000:06d}", step


def restarted(line: str) -> str | None:
    """The child ``run_demo``'s supervisor says it restarted in this line of its output, if any."""
    found = RESTART.search(line)
    return found[1] if found else None


def is_failure(status: int | None) -> bool:
    """An answer that counts against the demo: a 5xx, or none at all (``None``: refused, reset, timed out)."""
    return status is None or status >= 500


def stopped_serving(readyz: Sequence[bool], demo_exit: int | None, *, in_a_row: int = 2) -> str | None:
    """Why the demo stopped serving, or None: ``run_demo`` exited, ``/readyz`` failed ``in_a_row``
    times running at any point, or its last poll failed."""
    if demo_exit is not None:
        return f"run_demo exited with code {demo_exit}"
    run = 0
    for ok in readyz:
        run = 0 if ok else run + 1
        if run >= in_a_row:
            return f"/readyz failed {run} times in a row"
    if readyz and not readyz[-1]:
        return "the last /readyz poll failed"
    return None


@dataclass
class Minute:
    """What one minute of the run saw."""

    index: int
    latencies: list[float] = field(default_factory=list)  # seconds, every answered request
    requests: int = 0
    errors: int = 0
    client_errors: int = 0  # 4xx: reported, not a failure (a stale link, a request decided already)
    tasks_started: int = 0
    tasks_completed: int = 0
    tasks_ended_otherwise: int = 0
    restarts: int = 0
    readyz_polls: int = 0
    readyz_failures: int = 0
    rss_mb: dict[str, float] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)

    def record(self, what: str, status: int | None, seconds: float, detail: str = "") -> None:
        self.requests += 1
        if status is not None:
            self.latencies.append(seconds)
            if 400 <= status < 500:
                self.client_errors += 1
        if is_failure(status):
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{what}: {status if status is not None else detail}")

    def summary(self) -> dict[str, Any]:
        p50, p95 = percentile(self.latencies, 50), percentile(self.latencies, 95)
        return {
            "minute": self.index,
            "requests": self.requests,
            "errors": self.errors,
            "client_errors": self.client_errors,
            "p50_ms": None if p50 is None else round(p50 * 1000, 1),
            "p95_ms": None if p95 is None else round(p95 * 1000, 1),
            "tasks_started": self.tasks_started,
            "tasks_completed": self.tasks_completed,
            "tasks_ended_otherwise": self.tasks_ended_otherwise,
            "restarts": self.restarts,
            "readyz_polls": self.readyz_polls,
            "readyz_failures": self.readyz_failures,
            "rss_mb": self.rss_mb,
            "error_samples": self.error_samples,
        }


def totals(minutes: Sequence[Minute]) -> dict[str, Any]:
    """The whole run's figures: sums, and the percentiles over every request (not of the minutes')."""
    every = [s for m in minutes for s in m.latencies]
    p50, p95 = percentile(every, 50), percentile(every, 95)
    summed = {
        name: sum(getattr(m, name) for m in minutes)
        for name in (
            "requests",
            "errors",
            "client_errors",
            "tasks_started",
            "tasks_completed",
            "tasks_ended_otherwise",
            "restarts",
            "readyz_polls",
            "readyz_failures",
        )
    }
    peak: dict[str, float] = {}
    for m in minutes:
        for role, mb in m.rss_mb.items():
            peak[role] = max(peak.get(role, 0.0), mb)
    first = next((m.rss_mb for m in minutes if m.rss_mb), {})
    last = next((m.rss_mb for m in reversed(minutes) if m.rss_mb), {})
    return {
        **summed,
        "minutes": len(minutes),
        "p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "p95_ms": None if p95 is None else round(p95 * 1000, 1),
        "rss_mb_first": first,
        "rss_mb_last": last,
        "rss_mb_peak": peak,
    }


# --- the demo -------------------------------------------------------------------------------------


def demo_env(var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET and not k.startswith(UNSET_PREFIX)}
    env.update(DEMO_ENV, VAR_DIR=str(var), PYTHONUNBUFFERED="1")
    return env


def fresh_var(var: Path) -> None:
    """Make ``var`` empty: refuse one this script did not make (a user's demo lives in a var directory)."""
    if var.exists():
        if not (var / MARKER).exists():
            raise SystemExit(f"demo_soak: {var} exists and is not a demo soak's: give another --var")
        shutil.rmtree(var)
    var.mkdir(parents=True)
    (var / MARKER).write_text("made by scripts/demo_soak.py; wiped by its next run\n")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Demo:
    """``make demo``'s three steps in ``var``, the last one (run_demo) left running."""

    def __init__(self, var: Path, port: int) -> None:
        self.var, self.port, self.env = var, port, demo_env(var)
        self.proc: subprocess.Popen[str] | None = None
        self.restarts: list[str] = []  # names, as run_demo reports them
        self.token = ""

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"demo_soak: manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        self.manage("seed_demo")
        out = self.manage("drf_create_token", f"{TENANT}-integrator", "--scopes", "read,integrate")
        self.token = re.search(r"Generated token (\S+)", out)[1]  # type: ignore[index]
        log = (self.var / "run_demo.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_demo", f"127.0.0.1:{self.port}"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: stopped as one, never by our terminal's Ctrl-C twice
        )
        threading.Thread(target=self._read, args=(log,), daemon=True).start()

    def _read(self, log: Any) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            log.write(line)
            log.flush()
            if name := restarted(line):
                self.restarts.append(name)
        log.close()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def rss_mb(self) -> dict[str, float]:
        """RSS of run_demo's children by role (a child's own children counted in: the worker's pool)."""
        if self.proc is None:
            return {}
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                parents[int(stat.parent.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
        rss: dict[str, float] = {}
        for pid, parent in parents.items():
            if parent != self.proc.pid:
                continue
            role = _role(pid)
            if role:
                tree = [pid, *_descendants(pid, parents)]
                rss[role] = round(rss.get(role, 0.0) + sum(_rss_kb(p) for p in tree) / 1024, 1)
        return rss

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # run_demo stops its children first
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _role(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"runserver" in argv:
        return "web"
    if b"worker" in argv:
        return "worker"
    if b"beat" in argv:
        return "beat"
    return None


def _descendants(pid: int, parents: dict[int, int]) -> list[int]:
    children = [p for p, parent in parents.items() if parent == pid]
    return children + [d for c in children for d in _descendants(c, parents)]


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --- the click-through ----------------------------------------------------------------------------


class Soak:
    def __init__(self, base: str, demo: Demo, *, think: float, relogin: float) -> None:
        self.base, self.demo, self.think, self.relogin = base, demo, think, relogin
        self.t0 = time.monotonic()
        self.minutes: list[Minute] = [Minute(0)]
        self.readyz: list[bool] = []
        self.started: dict[str, float] = {}  # task id -> when started, until it ends
        self.last_step: dict[str, int] = {}  # TOTP step each user gave last (a code is good once)
        self.logged_in: dict[str, float] = {}
        self.seen_restarts = 0
        self.serial = count()
        self.decisions = 0
        self.clients = {
            name: httpx.Client(base_url=base, timeout=30.0, follow_redirects=True)
            for name in ("operator", "approver", "auditor", "probe")
        }
        self.api = httpx.Client(base_url=base, timeout=30.0, headers={"Authorization": f"Token {demo.token}"})

    @property
    def minute(self) -> Minute:
        return self.minutes[-1]

    # one request, recorded
    def call(self, client: httpx.Client, what: str, method: str, url: str, **kw: Any) -> Answer:
        time.sleep(self.think)
        if "data" in kw and "csrftoken" in client.cookies:
            kw["data"] = {**kw["data"], "csrfmiddlewaretoken": client.cookies["csrftoken"]}
        started = time.monotonic()
        try:
            response = client.request(method, url, **kw)
            response.read()
        except httpx.HTTPError as exc:
            self.minute.record(what, None, time.monotonic() - started, type(exc).__name__)
            return None
        self.minute.record(what, response.status_code, time.monotonic() - started)
        return response if response.status_code < 500 else None

    def page(self, persona: str, what: str, url: str) -> httpx.Response | None:
        """GET a console page as ``persona``, logging in first (or again, when sent to the login page)."""
        if time.monotonic() - self.logged_in.get(persona, -1e9) > self.relogin:
            self.log_in(persona)
        response = self.call(self.clients[persona], what, "GET", url)
        if response is not None and response.url.path.startswith("/accounts/"):
            self.log_in(persona)
            response = self.call(self.clients[persona], what, "GET", url)
        return response

    def log_in(self, persona: str) -> None:
        client, username = self.clients[persona], f"{TENANT}-{persona}"
        client.cookies.clear()
        if self.call(client, "login page", "GET", "/accounts/login/") is None:
            return
        answer = self.call(
            client, "login", "POST", "/accounts/login/", data={"username": username, "password": PASSWORD}
        )
        if answer is not None and answer.url.path.startswith("/accounts/second-factor/"):
            found = re.search(r'name="next" value="([^"]*)"', answer.text)
            code, step = totp_code(DEMO_TOTP_SECRET, after_step=self.last_step.get(username, -1))
            self.last_step[username] = step
            answer = self.call(
                client,
                "second factor",
                "POST",
                "/accounts/second-factor/",
                data={"code": code, "next": found[1] if found else "/console/"},
            )
        if answer is not None and not answer.url.path.startswith("/accounts/"):
            self.logged_in[persona] = time.monotonic()

    # the personas
    def integrator(self) -> None:
        n = next(self.serial)
        for body in (
            {
                "task_type": "order_lookup",
                "objective": f"Soak lookup {n}",
                "input": {"order_id": f"A-10{n % 10}"},
            },
            {
                "task_type": "pay_invoice",
                "objective": f"Soak payment {n}",
                "input": {"invoice_id": f"SOAK-{os.getpid()}-{n}", "amount": "1500.00"},
            },
        ):
            key = f"demo-soak-{os.getpid()}-{body['task_type']}-{n}"
            answer = self.call(
                self.api, "start task", "POST", "/api/tasks/", json={**body, "idempotency_key": key}
            )
            if answer is not None and answer.status_code == 201:
                self.started[answer.json()["id"]] = time.monotonic()
                self.minute.tasks_started += 1

    def follow(self) -> None:
        """The integrator asks after the three oldest tasks it started that had not ended."""
        for task_id in sorted(self.started, key=self.started.__getitem__)[:3]:
            answer = self.call(self.api, "task (API)", "GET", f"/api/tasks/{task_id}/")
            if answer is not None and answer.status_code == 200 and answer.json()["state"] in TERMINAL:
                del self.started[task_id]
                if answer.json()["state"] == "completed":
                    self.minute.tasks_completed += 1
                else:
                    self.minute.tasks_ended_otherwise += 1

    def operator(self) -> None:
        queue = self.page("operator", "queue", "/console/")
        ids = list(dict.fromkeys(re.findall(rf"/console/tasks/({UUID})/", queue.text))) if queue else []
        for task_id in ids[:3]:
            self.page("operator", "task page", f"/console/tasks/{task_id}/")
        self.page("operator", "quarantine", "/console/quarantine/")
        self.page("operator", "dashboard", "/console/dashboard/")

    def approver(self) -> None:
        inbox = self.page("approver", "approvals", "/console/approvals/")
        ids = list(dict.fromkeys(re.findall(rf'"/console/approvals/({UUID})/"', inbox.text))) if inbox else []
        client = self.clients["approver"]
        for request_id in ids[:2]:
            detail = self.page("approver", "approval", f"/console/approvals/{request_id}/")
            digest = re.search(r'name="digest" value="([0-9a-f]{64})"', detail.text) if detail else None
            if digest is None:  # decided meanwhile, or not this approver's to decide
                continue
            self.decisions += 1
            reject = self.decisions % 4 == 0
            form = {"decision": "reject" if reject else "approve", "digest": digest[1], "comment": ""}
            url = f"/console/approvals/{request_id}/decide/"
            self.call(client, "decide (confirm step)", "POST", url, data=form)
            comment = "Soak: rejected on purpose" if reject else ""
            self.call(client, "decide", "POST", url, data={**form, "confirmed": "True", "comment": comment})

    def auditor(self) -> None:
        search = self.page("auditor", "audit search", "/console/audit/?to_state=completed")
        self.page("auditor", "audit search", "/console/audit/?actor=integrator")
        ids = re.findall(rf"/console/audit/tasks/({UUID})/", search.text) if search else []
        if ids:
            self.page("auditor", "audit history", f"/console/audit/tasks/{ids[0]}/")
        self.page("auditor", "audit export", "/console/audit/export.csv?task_type=pay_invoice")

    def poll_readyz(self) -> None:
        answer = self.call(self.clients["probe"], "readyz", "GET", "/readyz")
        ok = answer is not None and answer.status_code == 200
        self.readyz.append(ok)
        self.minute.readyz_polls += 1
        self.minute.readyz_failures += not ok

    # the run
    def tick(self, write: Callable[[], None]) -> None:
        """Close the minute once it is over: its restarts and RSS, and the file rewritten."""
        now = int((time.monotonic() - self.t0) // 60)
        if now <= self.minute.index:
            return
        self.close_minute()
        write()
        self.minutes.append(Minute(now))

    def close_minute(self) -> None:
        self.minute.restarts = len(self.demo.restarts) - self.seen_restarts
        self.seen_restarts = len(self.demo.restarts)
        self.minute.rss_mb = self.demo.rss_mb()

    def run(self, seconds: float, write: Callable[[], None]) -> None:
        end = self.t0 + seconds
        next_probe = self.t0
        steps: Iterator[Callable[[], None]] = _cycle(
            (
                self.integrator,
                self.operator,
                self.follow,
                self.approver,
                self.follow,
                self.auditor,
                self.follow,
            )
        )
        while time.monotonic() < end and self.demo.exit_code() is None:
            if time.monotonic() >= next_probe:
                self.poll_readyz()
                next_probe += READYZ_EVERY
            next(steps)()
            self.tick(write)
        if self.demo.exit_code() is None:
            self.poll_readyz()  # the verdict's last poll, after the run
        self.close_minute()


def _cycle(steps: Sequence[Callable[[], None]]) -> Iterator[Callable[[], None]]:
    while True:
        yield from steps


def wait_ready(base: str, demo: Demo, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.exit_code() is not None:
            raise SystemExit(f"demo_soak: run_demo exited with code {demo.exit_code()} before serving")
        try:
            if httpx.get(f"{base}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"demo_soak: the demo did not answer /readyz within {timeout:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--seconds", type=float, help="the run's length (a smoke); wins over --minutes")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--var", type=Path, default=ROOT / "var" / "demo-soak")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--think", type=float, default=1.0, help="seconds between two requests (default 1)")
    parser.add_argument("--relogin", type=float, default=10.0, help="minutes between a persona's logins")
    parser.add_argument("--max-errors", type=int, default=0)
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out: Path = args.out or ROOT / "bench" / "results" / f"demo-soak-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not port_free(args.port):
        raise SystemExit(f"demo_soak: port {args.port} is taken (a demo running?): give another --port")
    var = args.var.resolve()
    fresh_var(var)
    base = f"http://127.0.0.1:{args.port}"
    demo = Demo(var, args.port)
    head = {"started_at": stamp, "seconds": seconds, "port": args.port, "var": str(var), "think": args.think}
    soak: Soak | None = None

    def write(verdict: dict[str, Any] | None = None) -> None:
        minutes = soak.minutes if soak else []
        closed = minutes if verdict else minutes[:-1]  # the minute under way is not written half-done
        result = {
            **head,
            "finished": verdict is not None,
            "minutes": [m.summary() for m in closed],
            "totals": totals(closed),
            "verdict": verdict,
        }
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out)

    # SIGTERM as Ctrl-C: the figures are written and the demo (a session of its own) is stopped too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        demo.start()
        wait_ready(base, demo)
        soak = Soak(base, demo, think=args.think, relogin=args.relogin * 60)
        print(f"demo_soak: the demo serves on {base}; driving it for {seconds:.0f} s -> {out}", flush=True)
        interrupted = False
        try:
            soak.run(seconds, write)
        except KeyboardInterrupt:
            interrupted = True
            print("demo_soak: interrupted; writing what was measured", flush=True)
        stopped = stopped_serving(soak.readyz, demo.exit_code())
        figures = totals(soak.minutes)
        failed = stopped is not None or figures["errors"] > args.max_errors or interrupted
        verdict = {
            "serving": stopped is None,
            "stopped": stopped,
            "errors": figures["errors"],
            "max_errors": args.max_errors,
            "ok": not failed,
            "interrupted": interrupted,
        }
        write(verdict)
        why = stopped or ("interrupted" if interrupted else f"{figures['errors']} errors")
    finally:
        demo.stop()
    print(
        f"demo_soak: {figures['minutes']} min, {figures['requests']} requests, {figures['errors']} errors, "
        f"p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, tasks {figures['tasks_started']} started "
        f"/ {figures['tasks_completed']} completed, restarts {figures['restarts']}, "
        f"RSS last {figures['rss_mb_last']} MB; {'ok' if not failed else 'FAILED: ' + why}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
