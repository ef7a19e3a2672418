"""Fixtures for crash tests: the sandbox over HTTP and real worker processes."""

from __future__ import annotations

import pytest

from tests.workflow import WorkerProcess, stop_all


@pytest.fixture
def sandbox(live_server) -> str:
    return f"{live_server.url}/sandbox"


@pytest.fixture
def workers(sandbox, tmp_path):
    started: list[WorkerProcess] = []

    def start(**kwargs) -> WorkerProcess:
        worker = WorkerProcess(sandbox, tmp_path, **kwargs)
        started.append(worker)
        return worker

    yield start
    stop_all(started)
