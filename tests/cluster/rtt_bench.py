"""Throughput against database round-trip time: one worker host, latency added on its database link.

    sudo .venv/bin/python -m tests.cluster.rtt_bench [--tasks 60] [--rtt 0,1,5,10,20] [--concurrency 4]

(``make partition-test`` runs the partition scenarios; this is the figure beside
them, in ``docs/operating/scale-out.md``.) Root only: a ``run_worker`` runs in a
network namespace of its own (``tests.cluster.netns``) and reaches a private
PostgreSQL (``initdb`` in a temporary directory, never the shared cluster)
through a relay on its link's host end that holds every chunk ``rtt / 2`` in
each direction, so each round trip to the database takes ``rtt`` ms longer
(this kernel has no netem; the relay is where the latency goes). The sandbox's
payment system is gunicorn on the same host end, with no latency added.

For each round-trip time: ``--tasks`` fresh ``pay_invoice`` tasks, one worker
with ``--concurrency`` slots started, stopped once all completed. Printed per
row: tasks/s (completions between the first and the last, so start-up is not
counted), the database round trips per task (requests the relay carried from
the worker while the tasks ran, heartbeats and claims included), and the load
average at the end of the row. A JSON line follows the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "1")  # the sandbox's development token, a development secret key
DATABASE = "durable"

# Django is set up only once DATABASE_URL names the private server (``run``): these two need no Django.
from tests.chaos.standby import workspace  # noqa: E402
from tests.cluster import netns  # noqa: E402


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--rtt", default="0,1,5,10,20", help="added round-trip times, ms, comma-separated")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    rtts = [float(x) for x in args.rtt.split(",")]

    reason = netns.unavailable()
    if reason:
        print(f"rtt_bench: {reason}", file=sys.stderr)
        return 2
    return run(args.tasks, rtts, args.concurrency)


def run(count: int, rtts: list[float], concurrency: int) -> int:
    network = netns.Network.create(1)
    root = workspace()
    host = network.hosts[0]
    server = None
    sandbox = None
    relay = None
    try:
        server = netns.PrivateServer.create(root, listen=[host.host_ip], cidr=network.cidr)
        server.query(f"CREATE DATABASE {DATABASE}")
        local_url = f"postgres://postgres@127.0.0.1:{server.port}/{DATABASE}"
        os.environ["DATABASE_URL"] = local_url
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, check=True)
        import django

        django.setup()
        from tasks.models import Task
        from tasks.services import task_create
        from tasks.states import State
        from tasks.transitions import Actor
        from tenancy.models import Tenant

        tenant = Tenant.objects.create(slug="rtt-bench", name="RTT bench")
        port = free_port(host.host_ip)
        sandbox = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"{host.host_ip}:{port}",
             "--workers", "2", "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, "SANDBOX_ENABLED": "1", "ALLOWED_HOSTS": host.host_ip,
                           "LOG_LEVEL": "WARNING"},
        )  # fmt: skip
        relay = netns.Relay([host.host_ip], ("127.0.0.1", server.port))
        rows = []
        for rtt in rtts:
            batch = f"RTT{int(rtt * 10):04d}"
            ids = {
                task_create(tenant=tenant, task_type="pay_invoice", objective=f"Pay {batch}-{n}",
                            input={"invoice_id": f"{batch}-{n:04d}", "amount": "1.00", "currency": "EUR"},
                            actor=Actor.system("rtt-bench"))[0].pk
                for n in range(count)
            }  # fmt: skip
            relay.delay = rtt / 2000
            worker = netns.start_worker(
                host, database_url=f"postgres://postgres@{host.host_ip}:{relay.port}/{DATABASE}",
                sandbox_url=f"http://{host.host_ip}:{port}/sandbox", lease_ttl=30, concurrency=concurrency,
                env={"LOG_LEVEL": "WARNING"},
            )  # fmt: skip
            output: list[str] = []
            threading.Thread(target=drain, args=(worker, output), daemon=True).start()
            first_requests = last_requests = None
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                done = Task.objects.filter(pk__in=ids, state=State.COMPLETED).count()
                if done and first_requests is None:
                    first_requests, first_done = relay.requests, done
                if done == count:
                    last_requests = relay.requests
                    break
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited {worker.returncode}: {''.join(output)[-3000:]}")
                time.sleep(0.05)
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            if last_requests is None or first_requests is None:
                raise SystemExit(f"rtt {rtt} ms: not every task completed within 600 s")
            rate, trips = figures(ids, first_requests, last_requests, first_done, count)
            rows.append({"rtt_ms": rtt, "tasks": count, "tasks_per_s": rate, "round_trips_per_task": trips,
                         "loadavg": Path("/proc/loadavg").read_text().split()[:3]})  # fmt: skip
            print(f"rtt +{rtt:5.1f} ms  {rate:7.2f} tasks/s  {trips:6.1f} round trips/task  "
                  f"load {' '.join(rows[-1]['loadavg'])}", flush=True)  # fmt: skip
        print(json.dumps({"concurrency": concurrency, "rows": rows}))
    finally:
        if relay is not None:
            relay.close()
        if sandbox is not None:
            sandbox.kill()
            sandbox.wait()
        try:
            if server is not None:
                server.destroy()
        finally:
            network.destroy()
            shutil.rmtree(root, ignore_errors=True)
    return 0


def drain(process: subprocess.Popen[str], into: list[str]) -> None:
    """Keep the worker's pipe from filling (what it said is shown if it exits)."""
    assert process.stdout is not None
    into.extend(process.stdout)


def figures(
    ids: set, first_requests: int, last_requests: int, first_done: int, count: int
) -> tuple[float, float]:
    """Completions per second between the first and the last (audit times), and the database round trips
    per task the relay carried meanwhile."""
    from audit.models import TransitionEvent

    times = sorted(
        TransitionEvent.objects.filter(task_id__in=ids, to_state="completed").values_list(
            "created_at", flat=True
        )
    )
    span = (times[-1] - times[0]).total_seconds()
    rate = round((len(times) - 1) / span, 2) if span > 0 else float("nan")
    trips = round((last_requests - first_requests) / max(count - first_done, 1), 1)
    return rate, trips


if __name__ == "__main__":
    sys.exit(main())
