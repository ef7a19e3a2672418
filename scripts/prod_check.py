"""make prod-check: start the production layout from its own files on loopback, and probe it.

What it proves is that a newcomer's deployment from ``deploy/`` works as written:

1. the environment is ``deploy/env.example`` with its blanks filled by throwaway secrets (every variable
   the file lists must end up set: a blank the script cannot fill is a failure), on a database of its own
   (``prodcheck_<pid>`` on the server in ``DATABASE_URL``, dropped at the end);
2. ``migrate``;
3. every line of ``deploy/Procfile`` started as written (``anchor`` with the anchor key, the others
   without it), with DEBUG off, and while they start the first tenant, an integrator and its token from
   the documented commands (``create_tenant``, ``grant_role``, ``drf_create_token``);
4. probes as a load balancer sends them: ``/healthz`` and ``/readyz`` with ``Host: <an IP>``; a task
   started over the API with the token is completed by the Procfile's workers; the console's login page
   answers over the proxy's forwarded HTTPS;
5. SIGTERM to every process: each must exit by itself within 45 s (workers drain).

Prints one line per check and exits 1 on the first failure, with the failing process's log tail.
Usage: python scripts/prod_check.py [--keep-database] [--from-template]

``--from-template`` (the test suite's run, ``tests/packaging/test_prod_check.py``): the database starts as
a copy of the migrated template (``scripts/migrated_template.py``, which the suite builds anyway) rather
than empty; ``migrate`` still runs as documented and finds nothing to apply. ``make prod-check`` migrates
an empty database, as a newcomer does.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import migrated_template  # scripts/, beside this file
import psycopg
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# The server in DATABASE_URL (any database of it: the check creates and drops one of its own).
SERVER_URL = urlunsplit(
    urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))._replace(
        path="/postgres"
    )
)
PROBE_HOST = "10.244.3.17:8000"  # what a Kubernetes probe sends: the pod's IP, not a served name
STOP_SECONDS = 45


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        raise CheckFailed(what)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def env_file(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of an env file (comments and blank lines skipped; no shell expansion)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def procfile(path: Path) -> dict[str, str]:
    return dict(
        (name.strip(), command.strip())
        for name, _, command in (line.partition(":") for line in path.read_text().splitlines())
        if name.strip() and not name.startswith("#") and command
    )


def anchor_keys() -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())  # fmt: skip
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(private).decode(), base64.b64encode(public).decode()


def environment(database_url: str, port: int, sandbox: str) -> tuple[dict[str, str], str]:
    """The processes' environment, from env.example, and the anchor key (for the anchor process only)."""
    listed = env_file(DEPLOY / "env.example")
    private, public = anchor_keys()
    base = f"http://127.0.0.1:{port}"
    filled = {
        **listed,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": database_url,
        "FIELD_ENCRYPTION_KEYS": f"k1:{Fernet.generate_key().decode()}",
        "AUDIT_HMAC_KEYS": f"k1:{secrets.token_urlsafe(32)}",
        "AUDIT_ANCHOR_PUBLIC_KEYS": public,
        "AUDIT_EXPORT_KEY": anchor_keys()[0],  # the web tier's own export key (not the anchor's)
        "PUBLIC_BASE_URL": base,
        "WEB_BIND": f"127.0.0.1:{port}",
        "WEB_WORKERS": "1",
        "WEB_THREADS": "4",
        # The demo's sandbox systems stand in for the outside world (a process of their own, below).
        "SANDBOX_TOKEN": secrets.token_urlsafe(32),
        "SANDBOX_BASE_URL": sandbox,
        "WORKER_CONCURRENCY": "4",
    }
    blank = sorted(key for key, value in filled.items() if not value)
    check(not blank, f"every variable deploy/env.example lists is set ({len(filled)}; blank: {blank})")
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/root"),
        "LOG_LEVEL": "WARNING",
        **filled,
    }
    return env, private


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    check(done.returncode == 0, f"manage.py {' '.join(args)}" + ("" if done.returncode == 0 else
                                                              f"\n{done.stderr[-2000:]}"))  # fmt: skip
    return done.stdout


def with_dbname(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--from-template", action="store_true", help="start from the migrated template")
    args = parser.parse_args(argv)
    dbname = f"prodcheck_{os.getpid()}"
    if args.from_template:
        migrated_template.create(SERVER_URL, dbname)
    else:
        with psycopg.connect(SERVER_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    port, sandbox_port = free_port(), free_port()
    logs = Path(tempfile.mkdtemp(prefix="prodcheck-"))
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        sandbox = f"http://127.0.0.1:{sandbox_port}/sandbox"
        env, anchor_key = environment(with_dbname(SERVER_URL, dbname), port, sandbox)
        manage(env, "migrate", "--no-input")
        anchors = logs / "anchors"
        anchors.mkdir()
        # The outside world: the sandbox systems, plain HTTP on loopback (not part of the layout).
        outside = {**env, "SANDBOX_ENABLED": "1", "SECURE_SSL_REDIRECT": "0"}
        layout = {"sandbox": f"gunicorn config.wsgi:application --bind 127.0.0.1:{sandbox_port}"}
        layout.update(procfile(DEPLOY / "Procfile"))
        for name, command in layout.items():
            signer = {**env, "AUDIT_ANCHOR_KEY": anchor_key, "AUDIT_ANCHOR_DIR": str(anchors)}
            own = {"sandbox": outside, "anchor": signer}.get(name, env)
            log = (logs / f"{name}.log").open("wb")
            processes[name] = subprocess.Popen(["sh", "-c", f"exec {command}"], cwd=ROOT, env=own, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        print(
            f"     started {', '.join(processes)} (deploy/Procfile, and the sandbox; logs in {logs})",
            flush=True,
        )
        # The first tenant and its token while the processes start (each a Django start of its own: on a
        # small machine seconds apiece, spent before the first probe either way).
        manage(env, "create_tenant", "acme", "--name", "Acme")
        manage(env, "grant_role", "acme-bot", "acme", "integrator", "--create-user")
        printed = manage(env, "drf_create_token", "acme-bot", "--scopes", "read,integrate")
        token = re.match(r"Generated token (\S+) ", printed).group(1)  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                live = httpx.get(f"{base}/healthz", headers={"Host": PROBE_HOST}, timeout=2)
                break
            except httpx.TransportError:
                gone = [name for name, process in processes.items() if process.poll() is not None]
                if gone or time.monotonic() > deadline:
                    check(False, f"web answers within 60 s (exited: {gone})")
                time.sleep(0.3)
        check(live.status_code == 200, f"/healthz by IP: {live.status_code}")
        ready = httpx.get(f"{base}/readyz", headers={"Host": PROBE_HOST}, timeout=10)
        check(ready.status_code == 200, f"/readyz by IP: {ready.status_code} {ready.text}")
        outside_auth = {"Authorization": f"Bearer {env['SANDBOX_TOKEN']}"}
        order = httpx.put(
            f"{sandbox}/orders/records/P-1", json={"status": "shipped"}, headers=outside_auth, timeout=10
        )
        check(order.status_code == 200, f"the outside world holds order P-1: {order.status_code}")
        integrator = {"Authorization": f"Bearer {token}", "X-Forwarded-Proto": "https"}
        api = httpx.Client(base_url=base, timeout=20, headers=integrator)
        started = api.post("/api/tasks/", json={"task_type": "order_lookup", "objective": "Where is P-1?",
                                                "input": {"order_id": "P-1"}})  # fmt: skip
        check(
            started.status_code == 201, f"a task started with the integrator's token: {started.status_code}"
        )
        task_id = started.json()["id"]
        deadline = time.monotonic() + 90
        while (state := api.get(f"/api/tasks/{task_id}/").json()["state"]) not in ("completed", "failed"):
            if time.monotonic() > deadline:
                check(False, f"the task ends within 90 s (still {state})")
            time.sleep(0.5)
        check(state == "completed", f"the Procfile's workers completed it ({state})")
        login = httpx.get(f"{base}/accounts/login/", headers={"X-Forwarded-Proto": "https"}, timeout=10)
        check(login.status_code == 200, f"the console's login page over forwarded HTTPS: {login.status_code}")
        for name, process in processes.items():
            check(process.poll() is None, f"{name} still running before the stop")
        for process in processes.values():
            os.killpg(process.pid, signal.SIGTERM)
        stop_by = time.monotonic() + STOP_SECONDS
        for name, process in processes.items():
            try:
                process.wait(timeout=max(0.1, stop_by - time.monotonic()))
                check(True, f"{name} stopped on SIGTERM (exit {process.returncode})")
            except subprocess.TimeoutExpired:
                check(False, f"{name} stopped on SIGTERM within {STOP_SECONDS} s")
        print("prod-check passed", flush=True)
        return 0
    except CheckFailed:
        for name in processes:
            tail = (logs / f"{name}.log").read_text(errors="replace")[-1500:]
            print(f"--- {name} log tail ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if not args.keep_database:
            with psycopg.connect(SERVER_URL, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
                )


if __name__ == "__main__":
    sys.exit(main())
