"""The chaos soak (``scripts/soak.py``) at a small size: every demo task type under sandbox faults, with
workers SIGKILLed, frozen past their lease and cut off from the database — and no duplicate effect, no
lost task, no broken audit chain.

The soak runs as a subprocess against a database of its own on the test server (``soak_test_<xdist
worker>``, created, migrated and dropped by the soak), so this test neither needs nor touches the test
database. ``make chaos`` runs it at full size. Run with ``-s`` for the soak's summary.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench.common import with_dbname
from tests.workflow import ROOT, database_url

pytestmark = [pytest.mark.timeout(300)]

TASKS, KILLS = 120, 4
MAX_SECONDS = 150  # the soak's own limit, from its workers' start; set-up and the checks come on top
GIVE_UP_AFTER = 240  # then SIGTERM: the soak stops its processes and drops its database on the way out
LAST_LINE = re.compile(rf"chaos: tasks {TASKS}, kills {KILLS}, faults \d+, duplicates 0, lost 0, chains ok")


def test_a_small_soak_loses_nothing_duplicates_nothing_and_keeps_every_chain():
    command = [
        *(sys.executable, "scripts/soak.py", "--tasks", str(TASKS), "--kills", str(KILLS)),
        *("--max-seconds", str(MAX_SECONDS)),
        *("--database", f"soak_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"),
    ]
    # database_url() names the test database; the soak wants the server and creates its own database there.
    env = {**os.environ, "DATABASE_URL": with_dbname(database_url(), "postgres")}
    soak = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = soak.communicate(timeout=GIVE_UP_AFTER)
    except subprocess.TimeoutExpired:
        soak.terminate()
        output, _ = soak.communicate(timeout=45)
        pytest.fail(f"the soak ran past {GIVE_UP_AFTER} s:\n{output[-6000:]}")
    print(output)
    assert soak.returncode == 0, output[-6000:]
    assert LAST_LINE.fullmatch(output.strip().splitlines()[-1]), output[-6000:]
