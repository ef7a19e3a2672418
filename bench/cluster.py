"""What a PostgreSQL failover costs the workers: unavailability, stranded tasks, throughput around it.

What it measures
    The ``make cluster-test`` scenario (``tests/cluster/test_failover.py``), run once at size: a
    pg_auto_failover monitor, primary and synchronous secondary on loopback, the API and three
    workers on a multi-host ``DATABASE_URL`` (``target_session_attrs=read-write``), ``--tasks``
    payment tasks (each payment 300 ms at the sandbox), and the primary's node SIGKILLed (keeper and
    postmaster) with one worker, a quarter of the way in. From the audit log on the new primary:

    write_unavailable_s     the primary's death to the first commit on the new primary
    promoted_s              the death to the monitor showing the secondary as primary
    stranded                tasks whose lease was held when the primary died
    all_back_in_progress_s  the death until every stranded task has committed a step again
    tasks_per_s_before / _during / _after
                            completions per second from the first create to the death, from the
                            death until every stranded task moved again, and from then to the end;
                            the ratios during/before and after/before are the figures to compare
                            (the baseline is the same run's "before")
    takeovers               lease takeovers on the record

    The scenario's own checks hold too (each invoice paid once, no acknowledged create lost, the
    API never answering 500): a run that breaks one fails instead of reporting.

How to run
    make bench-cluster                      (installs pg_auto_failover with scripts/ensure-cluster-packages)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/cluster.py --tasks 200

    DATABASE_URL names the shared server, which keeps only the sandbox's records (pytest-django's
    test database); the formation is made and destroyed in a temporary directory. Results are
    written as JSON to ``bench/results/cluster.json`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/cluster/test_failover.py::test_a_primary_killed_mid_run_pays_nothing_twice_and_loses_nothing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "cluster.json"
        env = {**os.environ, "CLUSTER_TASKS": str(args.tasks), "CLUSTER_RESULTS": str(results)}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "0", "-q", "-m", "cluster", TEST],
            cwd=ROOT,
            env=env,
        )
        if run.returncode != 0 or not results.exists():
            print(f"bench/cluster.py: the scenario failed (pytest exited {run.returncode})", file=sys.stderr)
            return 1
        figures = json.loads(results.read_text())
    before = figures["tasks_per_s_before"] or float("nan")
    figures["during_over_before"] = round(figures["tasks_per_s_during"] / before, 2)
    figures["after_over_before"] = round(figures["tasks_per_s_after"] / before, 2)
    print(json.dumps(figures, indent=2))
    if not args.no_save:
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "cluster.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
