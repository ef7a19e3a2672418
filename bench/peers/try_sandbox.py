"""By hand (product venv): a sandbox with order records, then the DBOS peer run through the harness.

    cd /work/main && PYTHONPATH=. .venv/bin/python bench/peers/try_sandbox.py --runs 2x1x0,2x16x300

Creates the database ``bench_peers_sandbox``, migrates it, inserts records ``E-0`` ... with random
statuses, serves the sandbox with gunicorn (2 processes x 8 threads), runs the DBOS peer once per
``--runs`` entry (PROCESSESxCONCURRENCYxLATENCY_MS) and prints each result's JSON; then stops gunicorn
and drops the database. ``--verbose`` runs run_dbos.py with its diagnostics and the workers' logs
shown instead of through the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    recreate_database,
    setup_django,
    throwaway_name,
    with_dbname,
)
from bench.peers.harness import HERE, ensure_venv, run_dbos  # noqa: E402

SANDBOX_DB = throwaway_name("bench_peers_sandbox")  # one per run: runs side by side never collide
STATUSES = ("delivered", "shipped", "processing", "returned")


def make_records(count: int) -> None:
    from demo.sandbox.models import Record

    rng = random.Random(1)
    Record.objects.bulk_create(
        Record(system="orders", record_id=f"E-{i}", data={"status": rng.choice(STATUSES)})
        for i in range(count)
    )


def run_verbose(server_url: str, sandbox: str, args: argparse.Namespace, p: int, c: int, lat: int) -> None:
    command = [
        str(ensure_venv()), str(HERE / "run_dbos.py"), "--server-url", server_url, "--sandbox-url", sandbox,
        "--tasks", str(args.tasks), "--processes", str(p), "--concurrency", str(c), "--latency-ms", str(lat),
        "--timeout", str(args.timeout), "--show-worker-logs",
    ]  # fmt: skip
    if args.polling_interval is not None:
        command += ["--polling-interval", str(args.polling_interval)]
    subprocess.run(command, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--runs", default="2x1x0", help="comma-separated PxCxL: processes x concurrency x ms")
    parser.add_argument("--polling-interval", type=float, default=None, help="run_dbos.py's default if unset")
    parser.add_argument("--timeout", type=float, default=110)
    parser.add_argument(
        "--verbose", action="store_true", help="show run_dbos.py's stderr and the workers' logs"
    )
    args = parser.parse_args()
    runs = [tuple(int(x) for x in spec.split("x")) for spec in args.runs.split(",")]
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, SANDBOX_DB)
    recreate_database(server_url, SANDBOX_DB, create=True)
    server = None
    try:
        os.environ["DATABASE_URL"] = url
        setup_django(debug=False)
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0, interactive=False)
        make_records(args.tasks)
        connections.close_all()
        from bench.e2e import Server

        with tempfile.TemporaryDirectory(prefix="bench-peers-sandbox-") as logs:
            server = Server("gunicorn", url, Path(logs), workers=2, threads=8)
            for processes, concurrency, latency in runs:
                if args.verbose:
                    run_verbose(server_url, server.sandbox, args, processes, concurrency, latency)
                    continue
                result = run_dbos(
                    server_url=server_url, sandbox_url=server.sandbox, tasks=args.tasks, processes=processes,
                    concurrency=concurrency, latency_ms=latency, timeout=args.timeout,
                    polling_interval_s=args.polling_interval,
                )  # fmt: skip
                print(json.dumps(result), flush=True)
            server.stop()
            server = None
    finally:
        if server is not None:
            server.stop()
        recreate_database(server_url, SANDBOX_DB, create=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
