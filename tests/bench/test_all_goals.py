"""bench/all.py's goals table (issue 27): each figure against its goal, with the load beside it.

The figures are crafted here (a whole ``make bench-all`` takes a quarter of an hour); what is
checked is the table's arithmetic and verdicts: a ratio is ours over raw from the scripts' own
phases, a 300 ms cell needs both its ratio and its rate, and a cell not measured says so.
"""

from __future__ import annotations

from bench.all import _ratios, goals, render_goals

LOAD = {"before": [1.5, 1.0, 0.8], "after": [1.75, 1.1, 0.8]}


def e2e(c: int, latency: int, ours: float, dbos: float | None) -> dict:
    cell = {"processes": 2, "concurrency": c, "latency_ms": latency, "tasks_per_s": ours, "load": [LOAD]}
    if dbos is not None:
        cell |= {"dbos_workflows_per_s": dbos, "ours_over_dbos": ours / dbos}
    return cell


def phases(key: str, ours: str, rates: dict[int, tuple[float, float]]) -> list[dict]:
    return [
        {key: n, "impl": impl, "per_second": rate}
        for n, pair in rates.items()
        for impl, rate in zip((ours, "raw"), pair, strict=True)
    ]


def test_the_goals_table_gives_each_figure_its_verdict_and_its_load():
    writers = phases("writers", "advance", {1: (900, 1000), 8: (700, 1000)})
    claimers = phases("claimers", "ours", {1: (90, 100), 4: (30, 100)})
    results = {
        "e2e": [e2e(16, 0, 60.0, 40.0), e2e(64, 0, 50.0, 40.0), e2e(16, 300, 45.0, 30.0),
                e2e(64, 300, 60.0, 40.0)],
        "transitions": {"advance_over_raw": _ratios(writers, "writers", "advance", "raw"), "load": LOAD},
        "leases": {"ours_over_raw": _ratios(claimers, "claimers", "ours", "raw"), "load": LOAD},
    }  # fmt: skip
    rows = {r["cell"]: r for r in goals(results)}
    verdict = {cell: r["met"] for cell, r in rows.items()}
    assert verdict == {
        "ours / DBOS, 2 processes x 16 in flight, 0 ms model latency": True,  # 1.5x
        "ours / DBOS, 2 processes x 64 in flight, 0 ms model latency": False,  # 1.25x
        "ours / DBOS, 2 processes x 16 in flight, 300 ms model latency": False,  # 1.5x but 45 tasks/s
        "ours / DBOS, 2 processes x 64 in flight, 300 ms model latency": True,  # 1.5x and 60 tasks/s
        "advance() / raw SQL, 1 writer(s)": True,  # 0.9
        "advance() / raw SQL, 8 writer(s)": False,  # 0.7
        "lease claims / raw claim, 1 claimer(s)": True,  # 0.9
        "lease claims / raw claim, 4 claimer(s)": False,  # 0.3
        "lease claims / raw claim, 8 claimer(s)": None,  # not measured
        # Neither pgbench, nor an RSS sample, nor a backlog in these results: named, not measured.
        "our commits/s / pgbench's, 2 processes x 16 in flight, 0 ms model latency": None,
        "our commits/s / pgbench's, 2 processes x 64 in flight, 0 ms model latency": None,
        "RSS of one worker process, 64 in flight (the highest seen)": None,
        "tasks/s with a backlog queued before the workers start": None,
    }
    table = render_goals(goals(results))
    assert (
        "| ours / DBOS, 2 processes x 16 in flight, 300 ms model latency | 1.50x (45.0 / 30.0 tasks/s) "
        "| ≥ 1.2x and ≥ 50 tasks/s | NO | 1.50 -> 1.75 |"
    ) in table
    assert "| advance() / raw SQL, 8 writer(s) | 0.70 | ≥ 0.8 | NO | 1.50 -> 1.75 |" in table
    assert "| lease claims / raw claim, 8 claimer(s) | not measured | ≥ 0.8 |  |  |" in table


def test_a_cell_run_without_its_peer_is_not_measured():
    results = {
        "e2e": [e2e(16, 0, 60.0, None)],
        "transitions": {"advance_over_raw": {}, "load": LOAD},
        "leases": {"ours_over_raw": {}, "load": LOAD},
    }
    assert all(r["text"] == "not measured" and r["met"] is None for r in goals(results))


def backlog(queued: int, rate: float, rss: float) -> dict:
    return {"queued": queued, "measured": 500, "processes": 2, "concurrency": 64, "tasks_per_s": rate,
            "worker_rss_mb": rss, "load": [LOAD]}  # fmt: skip


def test_commits_over_pgbench_the_rss_at_64_in_flight_and_the_backlogs_against_their_goals():
    at_16 = e2e(16, 0, 40.0, None) | {
        "worker_rss_mb": 120.0, "commits_per_s": 120.0, "pgbench_tps": 200.0, "pgbench_clients": 20,
        "ours_over_pgbench": 0.6,
    }  # fmt: skip
    at_64 = e2e(64, 0, 30.0, None) | {
        "worker_rss_mb": 140.0, "commits_per_s": 90.0, "pgbench_tps": 200.0, "pgbench_clients": 20,
        "ours_over_pgbench": 0.45,
    }  # fmt: skip
    results = {
        "e2e": [at_16, at_64, e2e(64, 300, 50.0, None) | {"worker_rss_mb": 130.0}],
        "transitions": {"advance_over_raw": {}, "load": LOAD},
        "leases": {"ours_over_raw": {}, "load": LOAD},
        # Out of order on purpose: the base is the smallest backlog, whatever order the run made them in.
        "backlog": [backlog(10_000, 55.0, 151.0), backlog(1_000, 60.0, 145.0), backlog(100_000, 53.0, 150.0)],
    }
    rows = {r["cell"]: r for r in goals(results)}
    verdict = {cell: r["met"] for cell, r in rows.items() if "DBOS" not in cell and "raw" not in cell}
    assert verdict == {
        "our commits/s / pgbench's, 2 processes x 16 in flight, 0 ms model latency": True,  # 0.6
        "our commits/s / pgbench's, 2 processes x 64 in flight, 0 ms model latency": False,  # 0.45
        # The highest at 64 in flight anywhere: the 10,000 backlog's 151 MB (the 16 in flight cell's
        # 120 MB does not count).
        "RSS of one worker process, 64 in flight (the highest seen)": False,
        "tasks/s with 1,000 queued, 2 processes x 64 in flight": None,  # the base
        "tasks/s with 10,000 queued, 2 processes x 64 in flight": True,  # 55 / 60 = 0.92
        "tasks/s with 100,000 queued, 2 processes x 64 in flight": False,  # 53 / 60 = 0.88
    }
    assert rows["RSS of one worker process, 64 in flight (the highest seen)"]["figure"] == 151.0
    table = render_goals(goals(results))
    assert (
        "| our commits/s / pgbench's, 2 processes x 16 in flight, 0 ms model latency | 0.60 (120 / 200 "
        "transactions/s, pgbench at 20 sessions) | ≥ 0.5 | yes | 1.50 -> 1.75 |"
    ) in table
    assert "| 151 MB (2 x 64, 10,000 queued) | < 150 MB | NO |" in table
    assert (
        "| tasks/s with 100,000 queued, 2 processes x 64 in flight | 53.0 tasks/s (0.88 of 1,000 queued's) "
        "| within 10 % of 1,000 queued's (≥ 0.9) | NO | 1.50 -> 1.75 |"
    ) in table


def test_without_those_runs_the_new_rows_say_not_measured():
    results = {
        "e2e": [e2e(16, 0, 60.0, None)],
        "transitions": {"advance_over_raw": {}, "load": LOAD},
        "leases": {"ours_over_raw": {}, "load": LOAD},
    }
    rows = goals(results)
    assert [r["cell"] for r in rows][-4:] == [
        "our commits/s / pgbench's, 2 processes x 16 in flight, 0 ms model latency",
        "our commits/s / pgbench's, 2 processes x 64 in flight, 0 ms model latency",
        "RSS of one worker process, 64 in flight (the highest seen)",
        "tasks/s with a backlog queued before the workers start",
    ]
    assert all(r["text"] == "not measured" and r["met"] is None for r in rows[-4:])
