"""The console pictures the docs show: which pages, as whom, and the files they are saved as.

`tests/docs/test_screenshots_browser.py` takes them from the demo world in a real browser and rewrites
`docs/images/<name>-<theme>.png` on every run (a changed page changes its picture);
`tests/docs/test_images.py` checks, without a browser, that the files are exactly these and that the
docs pages show every one of them and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
THEMES = ("light", "dark")
VIEWPORT = {"width": 1280, "height": 800}  # the viewport, not the full page: small files, one screen


@dataclass(frozen=True)
class Shot:
    name: str
    persona: str  # the demo user (seed_demo) whose view the picture is
    page: str  # the page, described; the test maps it to its path in the seeded world
    what: str  # what the picture shows, its alt text


SHOTS: tuple[Shot, ...] = (
    Shot("queue", "acme-operator", "queue", "The queue: every task of the tenant, with a count per state"),
    Shot(
        "task-why",
        "acme-operator",
        "task",
        "A task's page: its why panel says what it waits for and what comes next",
    ),
    Shot("approval", "acme-approver", "approval", "An approval request: the action, its evidence and digest"),
    Shot(
        "approval-repeat",
        "acme-approver",
        "repeat",
        "A repeat approval request: the diff from the earlier one",
    ),
    Shot("quarantine", "acme-operator", "quarantine", "Quarantine triage: held tasks grouped by reason"),
    Shot("audit-history", "acme-auditor", "history", "A task's audit history with its integrity badge"),
    Shot(
        "dashboard",
        "acme-operator",
        "dashboard",
        "The dashboard: tasks by state, waits, alerts and throughput",
    ),
)


def file_name(shot: Shot, theme: str) -> str:
    return f"{shot.name}-{theme}.png"


def expected_files() -> set[str]:
    return {file_name(shot, theme) for shot in SHOTS for theme in THEMES}
