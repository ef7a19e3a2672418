"""The product-side handle on the peer benchmarks: their own virtualenv, and one run of the DBOS peer.

Runs in the product's environment and uses the standard library only: DBOS lives in
``bench/peers/.venv`` (git-ignored), created here from ``requirements.txt``, and is only ever
imported by the scripts run inside that environment (``run_dbos.py``, ``dbos_order_lookup.py``).

    from bench.peers.harness import ensure_venv, run_dbos

    ensure_venv()  # creates or refreshes bench/peers/.venv when requirements.txt changed
    result = run_dbos(server_url="postgres://postgres@127.0.0.1:5432/postgres",
                      sandbox_url="http://127.0.0.1:8000/sandbox",
                      tasks=200, processes=2, concurrency=16, latency_ms=300)
    result["workflows_per_s"]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
REQUIREMENTS = HERE / "requirements.txt"
STAMP = VENV / ".requirements.sha256"  # the hash of the requirements.txt the venv was built from


def _venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def _requirements_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def ensure_venv() -> Path:
    """The peers' virtualenv's Python, creating the venv (with the current interpreter) and installing
    ``requirements.txt`` into it when it is missing or was built from another ``requirements.txt``.

    Runs that start together (parallel tests) build it once: the others wait on a lock file."""
    with (HERE / ".venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_venv()


def _ensure_venv() -> Path:
    python = _venv_python()
    wanted = _requirements_hash()
    if python.exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return python
    if VENV.exists():
        shutil.rmtree(VENV)  # rebuilt from scratch: no package left over from older requirements
    try:
        _run([sys.executable, "-m", "venv", str(VENV)], "creating the peers' virtualenv")
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-r", str(REQUIREMENTS)],
            "installing bench/peers/requirements.txt",
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(VENV, ignore_errors=True)  # never leave a half-built venv that looks usable
        raise
    STAMP.write_text(wanted + "\n")
    return python


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{_tail(done.stdout + done.stderr)}")


def _stop_group(process: subprocess.Popen) -> str:
    """SIGTERM run_dbos.py's process group (it then stops its workers and drops its database),
    SIGKILL it after a grace; return what it wrote on stderr."""
    for signum, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            return process.communicate(timeout=grace)[1] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_dbos(
    *,
    server_url: str,
    sandbox_url: str,
    tasks: int,
    processes: int,
    concurrency: int,
    latency_ms: int,
    timeout: float = 600,
    polling_interval_s: float | None = None,
    database: str | None = None,
) -> dict[str, Any]:
    """One DBOS Transact run of ``tasks`` ``order_lookup`` workflows: ``processes`` workers with
    ``concurrency`` workflows in flight each, on the PostgreSQL server ``server_url`` (its database
    ``database``, by default one named for that run, is created and dropped) against the sandbox at
    ``sandbox_url``.

    Returns run_dbos.py's JSON (``workflows_per_s``, ``steps_per_s``, ``busy_s``, ...); raises
    ``RuntimeError`` with the tail of its stderr when it fails or outlives ``timeout`` (+ a margin
    for start-up and clean-up: run_dbos.py applies ``timeout`` to the work itself).
    ``polling_interval_s``: a DBOS worker's seconds between two dequeue polls (run_dbos.py's default,
    0.1 s, when None; DBOS's own default is 1 s).
    """
    python = ensure_venv()
    command = [
        str(python), str(HERE / "run_dbos.py"),
        "--server-url", server_url, "--sandbox-url", sandbox_url,
        "--tasks", str(tasks), "--processes", str(processes), "--concurrency", str(concurrency),
        "--latency-ms", str(latency_ms), "--timeout", str(timeout),
        *(["--database", database] if database else []),
        *(["--polling-interval", str(polling_interval_s)] if polling_interval_s is not None else []),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    limit = timeout + 120
    # Its own session, so a run given up on takes its workers with it (they share its process group).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stderr = _stop_group(process)
        raise RuntimeError(f"run_dbos.py did not finish within {limit:g} s:\n{_tail(stderr)}") from None
    except BaseException:  # e.g. Ctrl-C: its own session does not get it, so stop it here
        _stop_group(process)
        raise
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if done.returncode != 0:
        raise RuntimeError(f"run_dbos.py failed (exit {done.returncode}):\n{_tail(done.stderr)}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise RuntimeError(
            f"run_dbos.py printed no JSON: {done.stdout[-2000:]!r}\n{_tail(done.stderr)}"
        ) from exc
