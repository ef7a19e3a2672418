"""run_demo's supervisor, on real processes: a child SIGKILLed is started again and the others keep
running; a child that keeps dying stops everything with a failing status; SIGTERM stops every child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]

RUNNER = """
import json, sys
from demo.supervise import supervise
commands, pids = json.loads(sys.argv[1]), sys.argv[2]
def record(started):
    with open(pids, "a") as f:
        f.write(json.dumps(started) + "\\n")
limits = {"max_restarts": 2, "window": 30, "poll": 0.05}
sys.exit(supervise(commands, {"PATH": "/usr/bin:/bin"}, print, on_start=record, **limits))
"""


def _start(tmp_path: Path, commands: dict[str, list[str]]) -> tuple[subprocess.Popen[str], Path]:
    pids = tmp_path / "pids.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(commands), str(pids)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, pids


def _starts(pids: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in pids.read_text().splitlines()] if pids.exists() else []


def _wait_for(predicate, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    pytest.fail("timed out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (reaped later by its parent) is dead for our purpose
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


def test_a_killed_child_is_started_again_and_the_others_keep_running(tmp_path: Path) -> None:
    proc, pids = _start(tmp_path, {"web": SLEEPER, "worker": SLEEPER})
    try:
        first = _wait_for(lambda: next((s for s in _starts(pids) if len(s) == 2), None))
        os.kill(first["worker"], signal.SIGKILL)
        again = _wait_for(
            lambda: next(
                (s for s in _starts(pids) if s.get("worker", first["worker"]) != first["worker"]), None
            )
        )
        assert again["web"] == first["web"]
        assert _alive(again["worker"]) and _alive(first["web"])
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "worker exited with code -9: restarting it (1 in 30 s)" in out
    assert not _alive(again["worker"]) and not _alive(first["web"])


def test_a_child_that_keeps_dying_stops_every_child_with_a_failing_status(tmp_path: Path) -> None:
    proc, pids = _start(tmp_path, {"web": SLEEPER, "beat": CRASHER})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "beat exited 3 in 30 s (last code 3): stopping" in out
    starts = _starts(pids)
    assert len({s["beat"] for s in starts if "beat" in s}) == 3  # the first start and two restarts, no more
    assert not _alive(starts[-1]["web"])
