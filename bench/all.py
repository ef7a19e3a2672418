"""Every benchmark that says how fast and how robust the runtime is, in one run (``make bench-all``).

What it runs, each as its own script in a subprocess (each creates and drops its own database):

1. ``transitions.py``: ``advance()`` against the same SQL issued raw, at 1 and 8 writers.
2. ``e2e.py`` throughput cells: ``order_lookup`` at 1/2/4 worker processes x 1/16/64 tasks in
   flight x 0/300 ms model latency. Tasks per cell are sized from the work's expected rate so each
   cell takes seconds, not minutes (``--cell-seconds``). Every cell samples each worker's resident
   set (``VmRSS``); the 2-process cells at 0 ms also run ``pgbench`` in the cell's own database after
   the workers stop: the database's own commit rate for a transaction shaped like a transition (an
   UPDATE of one row, two INSERTs) at the same concurrency (``e2e.py --pgbench-seconds``).
3. The peers: the same work on DBOS Transact (``bench/peers``) in the same run, against the same
   PostgreSQL server and sandbox, at 2 processes x 16/64 in flight x 0/300 ms; ratios ours/DBOS.
4. ``leases.py``: lease claims under contention, ``claim_next`` against the same claim issued raw,
   at 1/4/8 claimer processes competing for one pool of tasks.
5. Recovery: 2 victims and 2 survivors, every victim SIGKILLed mid-run, with liveness (30 s TTL)
   and without it (5 s TTL, the fallback).
6. ``sdk_agents.py``: the support agent through the Agents SDK adapter against the same tools as a
   native workflow, at 0 and 300 ms model latency, and the bytes each leaves per task.
7. ``a2a_vs_rest.py``: the same tasks started and followed through A2A (the a2a-sdk client) and through the
   REST API, same run, same workers, 300 ms model latency; A2A / REST.
8. Backlog: ``e2e.py --backlog N`` at 2 processes x 64 in flight, 0 ms, with 1,000, 10,000 and 100,000
   tasks queued before the workers start (each in its own database); tasks/s over the first
   ``--backlog-measure`` completions. Claiming must not slow as the queue grows.

Each figure is the median over ``--repeat`` runs. The run ends with the goals table of issue 27
(ours/DBOS at 16 and 64 in flight and 0 and 300 ms, advance()/raw at 1 and 8 writers, claims/raw at
1, 4 and 8 claimers, our commits/s over pgbench's at 16 and 64 in flight, the RSS of one worker at 64
in flight, tasks/s at each backlog against the smallest's, each against its goal). Results are
printed as tables and written as JSON to ``bench/results/all-<time>.json``, every figure with the load
average (``os.getloadavg()``) at the start and end of the script run that measured it. The machine
has 2 cores: cells at 4 processes x 64 measure CPU, not the runtime's waiting. ``--quick`` runs a
reduced matrix, each script with ``--smoke`` (the goals table then shows what it measured and "not
measured" for the rest), pgbench for 3 s, and one backlog of 400 tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import DEFAULT_SERVER_URL, RESULTS_DIR  # noqa: E402

RESULTS_LINE = re.compile(r"^results\s+(\S+\.json)$", re.MULTILINE)
CPU_BOUND_RATE = 60.0  # tasks/s this 2-core machine reaches when nothing waits; sizes the cells
# --quick: one backlog (each level is a run of its own, a minute on a busy machine); the full run
# compares each level with the smallest.
BACKLOGS, BACKLOGS_QUICK, BACKLOG_MEASURE_QUICK = (1_000, 10_000, 100_000), (400,), 10
BACKLOG_CELL = (2, 64)  # processes x in flight each: every slot full while the queue lasts


def _terminated(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _run(script: str, *args: str, prefix: str) -> dict[str, Any]:
    """Run ``bench/<script>`` on its own throwaway database and return the JSON it saved, with the load
    average at its start and end (``load``: what every figure it gave is reported beside)."""
    load_before = _load()
    started = time.monotonic()
    database = f"{prefix}_{script.removesuffix('.py')}"
    process = subprocess.Popen(
        [sys.executable, f"bench/{script}", "--database", database, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        # Ctrl-C or SIGTERM here: the script is asked to end (its finally stops its workers and servers
        # and drops its database) before it is killed; subprocess.run would kill it at once.
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"bench/{script} {' '.join(args)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    found = RESULTS_LINE.search(stdout)
    if found is None:
        raise RuntimeError(f"bench/{script} printed no results file:\n{stdout[-2000:]}")
    path = ROOT / found.group(1)
    result = json.loads(path.read_text())
    path.unlink()  # folded into this run's file
    result["load"] = {"before": load_before, "after": _load()}
    print(f"  {script} {' '.join(args)}  ({time.monotonic() - started:.0f} s, load {load_before[0]:.2f} "
          f"-> {result['load']['after'][0]:.2f})", flush=True)  # fmt: skip
    return result


def _tasks_for(processes: int, concurrency: int, latency_ms: int, seconds: float) -> int:
    """Enough tasks to keep the cell busy about ``seconds``: its expected rate times that."""
    step_s = 0.03 + latency_ms / 1000  # the work's own time per task, model included
    rate = min(CPU_BOUND_RATE, processes * concurrency / step_s)
    return max(40, min(1000, int(rate * seconds)))


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _ratios(phases: list[dict[str, Any]], count_key: str, ours: str, raw: str) -> dict[str, float]:
    """Per count (writers or claimers): median rate of ``ours`` over median rate of ``raw``."""
    ratios = {}
    for count in sorted({p[count_key] for p in phases}):
        rates = {
            impl: statistics.median(
                p["per_second"] for p in phases if p[count_key] == count and p["impl"] == impl
            )
            for impl in (ours, raw)
        }
        ratios[str(count)] = rates[ours] / rates[raw]
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; the median is reported")
    parser.add_argument("--cell-seconds", type=float, default=8.0, help="target busy time per cell")
    parser.add_argument("--quick", action="store_true", help="a reduced matrix (smoke test)")
    parser.add_argument("--no-peers", action="store_true", help="skip DBOS")
    parser.add_argument("--pgbench-seconds", type=float, default=10.0,
                        help="pgbench's seconds beside each 2-process 0 ms cell (--quick: 3)")  # fmt: skip
    parser.add_argument("--backlog-measure", type=int, default=500,
                        help="completions each backlog cell's rate is taken over (--quick: 10)")  # fmt: skip
    parser.add_argument(
        "--database-prefix", default=f"bench_{os.getpid()}", help="the scripts' throwaway databases' prefix"
    )
    parser.add_argument("--no-save", action="store_true", help="do not write JSON to bench/results/")
    args = parser.parse_args(argv)
    os.environ.setdefault("DATABASE_URL", DEFAULT_SERVER_URL)
    signal.signal(signal.SIGTERM, _terminated)  # through _run's clean-up, as Ctrl-C
    started = time.monotonic()
    results: dict[str, Any] = {"started": datetime.now(UTC).isoformat(), "load": os.getloadavg()}

    processes, concurrencies, latencies = (
        ([2], [16], [0]) if args.quick else ([1, 2, 4], [1, 16, 64], [0, 300])
    )
    seconds = 1.0 if args.quick else args.cell_seconds
    smoke = ["--smoke"] if args.quick else []
    pgbench_s = "3" if args.quick else str(args.pgbench_seconds)

    print("transitions", flush=True)
    prefix = args.database_prefix
    transitions = _run(
        "transitions.py", "--seconds", "0.5" if args.quick else "3", "--writers", "1,8", *smoke, prefix=prefix
    )
    results["transitions"] = {
        "table": transitions["table"],
        "ratio_at_8_writers": transitions["ratio_at_max_writers"],
        "advance_over_raw": _ratios(transitions["phases"], "writers", "advance", "raw"),
        "load": transitions["load"],
    }

    print("lease claims", flush=True)
    claims = _run("leases.py", "--seconds", "0.3" if args.quick else "3",
                  "--claimers", "1,4" if args.quick else "1,4,8", *smoke, prefix=prefix)  # fmt: skip
    results["leases"] = {
        "table": claims["table"],
        "ratio_at_max_claimers": claims["ratio_at_max_claimers"],
        "ours_over_raw": _ratios(claims["phases"], "claimers", "ours", "raw"),
        "load": claims["load"],
    }

    print("end to end", flush=True)
    cells = []
    for latency in latencies:
        for p in processes:
            for c in concurrencies:
                tasks = _tasks_for(p, c, latency, seconds)
                common = ["--tasks", str(tasks), "--workers", str(p), "--concurrency", str(c),
                          "--latency-ms", str(latency), "--recovery-tasks", "0", *smoke]  # fmt: skip
                peer = not args.no_peers and p == 2 and c in (16, 64)
                pgbench = p == 2 and c in (16, 64) and latency == 0
                extra = [
                    *(["--peers"] if peer else []),
                    *(["--pgbench-seconds", pgbench_s] if pgbench else []),
                ]
                runs = [_run("e2e.py", *common, *extra, prefix=prefix) for _ in range(args.repeat)]
                cell: dict[str, Any] = {
                    "processes": p, "concurrency": c, "latency_ms": latency, "tasks": tasks,
                    "tasks_per_s": statistics.median(r["throughput"]["tasks_per_s"] for r in runs),
                    "transitions_per_s": statistics.median(
                        r["throughput"]["transitions_per_s"] for r in runs
                    ),
                    "load": [r["load"] for r in runs],
                    "worker_rss_mb": max(max(r["throughput"]["worker_rss_mb"], default=0) for r in runs),
                }  # fmt: skip
                if pgbench:
                    cell["commits_per_s"] = statistics.median(
                        r["pgbench"]["ours_commits_per_s"] for r in runs
                    )
                    cell["pgbench_tps"] = statistics.median(r["pgbench"]["tps"] for r in runs)
                    cell["pgbench_clients"] = runs[0]["pgbench"]["clients"]
                    cell["ours_over_pgbench"] = statistics.median(
                        r["pgbench"]["ours_over_pgbench"] for r in runs
                    )
                if peer:
                    cell["dbos_workflows_per_s"] = statistics.median(
                        r["peer"]["workflows_per_s"] for r in runs
                    )
                    cell["ours_over_dbos"] = cell["tasks_per_s"] / cell["dbos_workflows_per_s"]
                cells.append(cell)
    results["e2e"] = cells

    print("backlog", flush=True)
    measure = BACKLOG_MEASURE_QUICK if args.quick else args.backlog_measure
    backlogs = []
    for queued in BACKLOGS_QUICK if args.quick else BACKLOGS:
        runs = [
            _run("e2e.py", "--backlog", str(queued), "--backlog-measure", str(measure),
                 "--workers", str(BACKLOG_CELL[0]), "--concurrency", str(BACKLOG_CELL[1]),
                 "--latency-ms", "0", "--recovery-tasks", "0", *smoke, prefix=prefix)
            for _ in range(args.repeat)
        ]  # fmt: skip
        backlogs.append({
            "queued": queued, "measured": measure,
            "processes": BACKLOG_CELL[0], "concurrency": BACKLOG_CELL[1],
            "tasks_per_s": statistics.median(r["backlog"]["tasks_per_s"] for r in runs),
            "worker_rss_mb": max(max(r["backlog"]["worker_rss_mb"], default=0) for r in runs),
            "load": [r["load"] for r in runs],
        })  # fmt: skip
    results["backlog"] = backlogs

    print("recovery", flush=True)
    recovery_tasks = "100" if args.quick else "1000"
    recoveries = []
    kinds = (("30", "--liveness"),) if args.quick else (("30", "--liveness"), ("5", "--no-liveness"))
    for ttl, liveness in kinds:
        run = _run("e2e.py", "--tasks", "40", "--recovery-tasks", recovery_tasks, "--concurrency", "16",
                   "--lease-ttl", ttl, liveness, *smoke, prefix=prefix)  # fmt: skip
        recoveries.append({**run["recovery"], "load": run["load"]})
    results["recovery"] = recoveries

    print("agents", flush=True)
    agents = _run("sdk_agents.py", "--tasks", "6" if args.quick else "120",
                  "--latencies", "0" if args.quick else "0,300", "--repeat", str(args.repeat), *smoke,
                  prefix=prefix)  # fmt: skip
    results["agents"] = {"summary": agents["summary"], "storage": agents["storage"], "table": agents["table"],
                         "load": agents["load"]}  # fmt: skip

    print("a2a against rest", flush=True)
    a2a = _run("a2a_vs_rest.py", "--tasks", "10" if args.quick else "400",
               "--repeat", "1" if args.quick else "3",
               "--warmup", "2" if args.quick else "20", "--callers", "8" if args.quick else "64",
               prefix=prefix)  # fmt: skip
    results["a2a"] = {"summary": a2a["summary"], "table": a2a["table"], "load": a2a["load"]}
    results["seconds"] = time.monotonic() - started

    results["goals"] = goals(results)
    print(render(results))
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"all-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"\nresults     {path.relative_to(ROOT)}")
    return 0


def _cell(cell: dict[str, Any]) -> tuple[int, int, int]:
    return cell["processes"], cell["concurrency"], cell["latency_ms"]


GOAL_RATIO_0MS, GOAL_RATIO_300MS, GOAL_RATE_300MS, GOAL_OVER_RAW = 1.5, 1.2, 50.0, 0.8
GOAL_OVER_PGBENCH, GOAL_RSS_MB, GOAL_BACKLOG = 0.5, 150.0, 0.9


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 27's table: each figure, its goal, whether it is met, and the load average beside it
    (the 1-minute load at the start and end of the script run that measured it)."""
    rows: list[dict[str, Any]] = []

    def row(cell: str, figure: float | None, text: str, goal: str, met: bool | None, load: Any) -> None:
        rows.append({"cell": cell, "figure": figure, "text": text, "goal": goal, "met": met, "load": load})

    for c, latency in ((16, 0), (64, 0), (16, 300), (64, 300)):
        cell = next(
            (x for x in results["e2e"] if _cell(x) == (2, c, latency) and "ours_over_dbos" in x), None
        )
        name = f"ours / DBOS, 2 processes x {c} in flight, {latency} ms model latency"
        if latency == 0:
            goal = f"≥ {GOAL_RATIO_0MS}x"
            met = None if cell is None else cell["ours_over_dbos"] >= GOAL_RATIO_0MS
        else:
            goal = f"≥ {GOAL_RATIO_300MS}x and ≥ {GOAL_RATE_300MS:g} tasks/s"
            met = None if cell is None else (
                cell["ours_over_dbos"] >= GOAL_RATIO_300MS and cell["tasks_per_s"] >= GOAL_RATE_300MS
            )  # fmt: skip
        if cell is None:
            row(name, None, "not measured", goal, None, None)
        else:
            rates = f"{cell['tasks_per_s']:.1f} / {cell['dbos_workflows_per_s']:.1f} tasks/s"
            text = f"{cell['ours_over_dbos']:.2f}x ({rates})"
            row(name, cell["ours_over_dbos"], text, goal, met, cell["load"])
    for label, section, key, counts in (
        ("advance() / raw SQL, {} writer(s)", "transitions", "advance_over_raw", ("1", "8")),
        ("lease claims / raw claim, {} claimer(s)", "leases", "ours_over_raw", ("1", "4", "8")),
    ):
        ratios = results[section][key]
        for n in counts:
            figure = ratios.get(n)
            text = "not measured" if figure is None else f"{figure:.2f}"
            met = None if figure is None else figure >= GOAL_OVER_RAW
            row(
                label.format(n),
                figure,
                text,
                f"≥ {GOAL_OVER_RAW}",
                met,
                results[section]["load"] if figure is not None else None,
            )
    for c in (16, 64):
        cell = next((x for x in results["e2e"] if _cell(x) == (2, c, 0) and "ours_over_pgbench" in x), None)
        name = f"our commits/s / pgbench's, 2 processes x {c} in flight, 0 ms model latency"
        goal = f"≥ {GOAL_OVER_PGBENCH}"
        if cell is None:
            row(name, None, "not measured", goal, None, None)
        else:
            text = (f"{cell['ours_over_pgbench']:.2f} ({cell['commits_per_s']:,.0f} / "
                    f"{cell['pgbench_tps']:,.0f} transactions/s, pgbench at {cell['pgbench_clients']} "
                    "sessions)")  # fmt: skip
            row(name, cell["ours_over_pgbench"], text, goal, cell["ours_over_pgbench"] >= GOAL_OVER_PGBENCH,
                cell["load"])  # fmt: skip
    at_64 = [x for x in [*results["e2e"], *results.get("backlog", [])] if x["concurrency"] == 64]
    measured = [x for x in at_64 if x.get("worker_rss_mb")]
    name, goal = "RSS of one worker process, 64 in flight (the highest seen)", f"< {GOAL_RSS_MB:g} MB"
    if not measured:
        row(name, None, "not measured", goal, None, None)
    else:
        top = max(measured, key=lambda x: x["worker_rss_mb"])
        where = (f"{top['processes']} x 64, {top['latency_ms']} ms" if "latency_ms" in top
                 else f"{top['processes']} x 64, {top['queued']:,} queued")  # fmt: skip
        text = f"{top['worker_rss_mb']:.0f} MB ({where})"
        row(name, top["worker_rss_mb"], text, goal, top["worker_rss_mb"] < GOAL_RSS_MB, top["load"])
    backlogs = sorted(results.get("backlog", []), key=lambda x: x["queued"])
    for b in backlogs:
        name = (
            f"tasks/s with {b['queued']:,} queued, {b['processes']} processes x {b['concurrency']} in flight"
        )
        base = backlogs[0]
        if b is base:
            row(name, b["tasks_per_s"], f"{b['tasks_per_s']:.1f} tasks/s", "(the smallest backlog: the base)",
                None, b["load"])  # fmt: skip
            continue
        ratio = b["tasks_per_s"] / base["tasks_per_s"]
        text = f"{b['tasks_per_s']:.1f} tasks/s ({ratio:.2f} of {base['queued']:,} queued's)"
        row(name, ratio, text, f"within 10 % of {base['queued']:,} queued's (≥ {GOAL_BACKLOG})",
            ratio >= GOAL_BACKLOG, b["load"])  # fmt: skip
    if not backlogs:
        row("tasks/s with a backlog queued before the workers start", None, "not measured",
            f"within 10 % of the smallest backlog's (≥ {GOAL_BACKLOG})", None, None)  # fmt: skip
    return rows


def render_goals(rows: list[dict[str, Any]]) -> str:
    lines = ["| cell | now | goal | met | load (1 min) before -> after |", "|---|---|---|---|---|"]
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        loads = r["load"] if isinstance(r["load"], list) else [r["load"]] if r["load"] else []
        load = ", ".join(f"{x['before'][0]:.2f} -> {x['after'][0]:.2f}" for x in loads)
        lines.append(f"| {r['cell']} | {r['text']} | {r['goal']} | {met} | {load} |")
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    lines = [f"\n## issue 27's goals (same run)\n\n{render_goals(results['goals'])}"]
    lines.append(f"\n## transitions (advance vs raw SQL)\n\n{results['transitions']['table']}")
    lines.append(f"\n## lease claims under contention (claim_next vs raw)\n\n{results['leases']['table']}")
    lines.append("\n## order_lookup end to end (tasks/s; ours / DBOS where measured)\n")
    lines.append(
        "| model ms | processes | in flight | tasks | ours tasks/s | DBOS workflows/s | ours / DBOS "
        "| our commits/s / pgbench's | worker RSS MB |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for cell in results["e2e"]:
        dbos = f"{cell['dbos_workflows_per_s']:.1f}" if "dbos_workflows_per_s" in cell else ""
        ratio = f"{cell['ours_over_dbos']:.2f}x" if "ours_over_dbos" in cell else ""
        pgbench = (f"{cell['commits_per_s']:,.0f} / {cell['pgbench_tps']:,.0f} = "
                   f"{cell['ours_over_pgbench']:.2f}" if "ours_over_pgbench" in cell else "")  # fmt: skip
        rss = f"{cell['worker_rss_mb']:.0f}" if cell.get("worker_rss_mb") else ""
        lines.append(f"| {cell['latency_ms']} | {cell['processes']} | {cell['concurrency']} "
                     f"| {cell['tasks']} | "
                     f"{cell['tasks_per_s']:.1f} | {dbos} | {ratio} | {pgbench} | {rss} |")  # fmt: skip
    lines.append("\n## backlog queued before the workers start (tasks/s over the first completions)\n")
    lines.append("| queued | processes x in flight | measured | tasks/s | worker RSS MB |")
    lines.append("|---|---|---|---|---|")
    for b in results.get("backlog", []):
        lines.append(f"| {b['queued']:,} | {b['processes']} x {b['concurrency']} | {b['measured']} "
                     f"| {b['tasks_per_s']:.1f} | {b['worker_rss_mb']:.0f} |")  # fmt: skip
    lines.append("\n## recovery after SIGKILL of every victim\n")
    lines.append("| liveness | lease TTL s | stranded | back in progress s | first commit s | all done s |")
    lines.append("|---|---|---|---|---|---|")
    for r in results["recovery"]:
        lines.append(f"| {'on' if r['liveness'] else 'off'} | {r['lease_ttl_s']:g} | {r['leased_at_kill']} | "
                     f"{r['back_in_progress_s']:.2f} | {r['first_commit_s']:.2f} "
                     f"| {r['all_done_s']:.1f} |")  # fmt: skip
    lines.append(f"\n## support agent: SDK adapter vs the same tools native\n\n{results['agents']['table']}")
    lines.append(f"\n## A2A against REST (same tasks, same workers)\n\n{results['a2a']['table']}")
    lines.append(f"\nwhole run {results['seconds'] / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
