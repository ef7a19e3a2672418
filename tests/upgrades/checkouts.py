"""An older release of this project, for rollout tests: this tree copied with one contract line changed.

A rollout runs two deployments against one database for a while. The older one
is made here as a copy of this working tree in a temporary directory in which
one line, the contract the release changed, reads as it did before. Real
``manage.py`` processes run from the copy (``started_from`` points
``tests.workflow.WorkerProcess`` at it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import workflow
from tests.workflow import ROOT

# Not part of a deployment: the environment, history, caches, test data, benchmarks (and their peers).
LEFT_OUT_AT_TOP = {".venv", ".git", "var", "bench", "test-artifacts", "tests", "node_modules", "htmlcov"}
LEFT_OUT = shutil.ignore_patterns(
    "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", ".import_linter*"
)


def older_checkout(into: Path, contract: str, line: str, older_line: str) -> Path:
    """This tree as the previous release: a copy whose file ``contract`` has ``older_line`` for ``line``."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        left_out = set(LEFT_OUT(directory, names))
        if Path(directory) == ROOT:
            left_out |= LEFT_OUT_AT_TOP & set(names)
        return left_out

    tree = into / "older-checkout"
    shutil.copytree(ROOT, tree, ignore=ignore)
    path = tree / contract
    source = path.read_text()
    assert source.count(line) == 1, (
        f"{contract} no longer has the line {line.strip()!r} exactly once: "
        "the older checkout cannot be made from it (update this test with the contract)"
    )
    path.write_text(source.replace(line, older_line))
    return tree


@contextmanager
def started_from(tree: Path, monkeypatch) -> Iterator[None]:
    """Worker processes started inside run from ``tree`` (their working directory)."""
    with monkeypatch.context() as patch:
        patch.setattr(workflow, "ROOT", tree)
        yield
