"""Keep a few child processes running: start them, restart one that dies, stop them all together.

What ``run_demo`` runs its web server, Celery worker and beat under, so that one child's crash (a bad
message, the OOM killer, a SIGKILL) costs a restart of that child, not the whole demo. A child that keeps
dying — ``max_restarts`` times within ``window`` seconds — is a fault a restart will not fix: then every
child is stopped and the exit status says so. Stdlib only, and no Django, so it can be tested on its own.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import NoReturn


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)  # when it died, within the window


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def supervise(
    commands: Mapping[str, Sequence[str]],
    env: Mapping[str, str],
    say: Callable[[str], object] = print,
    *,
    max_restarts: int = 5,
    window: float = 60.0,
    poll: float = 0.5,
    on_start: Callable[[Mapping[str, int]], object] | None = None,
) -> int:
    """Run ``commands`` (name → argv) until Ctrl-C or SIGTERM (0) or until a child dies too often (1).

    ``on_start`` is told each start's pids by name (every child's, after each start or restart).
    """
    children = [Child(name, argv) for name, argv in commands.items()]
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's SIGTERM stops the children too, like Ctrl-C

    def start(child: Child) -> None:
        child.proc = subprocess.Popen(list(child.argv), env=dict(env))
        if on_start is not None:
            on_start({c.name: c.proc.pid for c in children if c.proc is not None})

    status = 0
    try:
        for child in children:
            start(child)
        while status == 0:
            time.sleep(poll)
            for child in children:
                assert child.proc is not None
                code = child.proc.poll()
                if code is None:
                    continue
                now = time.monotonic()
                child.deaths.append(now)
                while child.deaths and child.deaths[0] < now - window:
                    child.deaths.popleft()
                deaths = f"{len(child.deaths)} in {window:.0f} s"
                if len(child.deaths) > max_restarts:
                    say(f"{child.name} exited {deaths} (last code {code}): stopping")
                    status = 1
                    break
                say(f"{child.name} exited with code {code}: restarting it ({deaths})")
                start(child)
    except KeyboardInterrupt:
        pass
    finally:
        _stop(children)
    return status


def _stop(children: Sequence[Child], timeout: float = 15.0) -> None:
    running = [c.proc for c in children if c.proc is not None and c.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
