"""``bench/console.py`` times each page at both sizes in interleaved rounds: no database, fake requests."""

from __future__ import annotations

from typing import Any

import pytest

from bench import console


def test_each_page_alternates_between_the_sizes_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    # Each size's answers in order: the warm-up's 1000 ms first, then the timed requests'.
    took = {"small": iter([1000.0, 10.0, 30.0, 20.0]), "large": iter([1000.0, 14.0, 12.0, 99.0])}

    def timed(read: Any, side: str) -> tuple[float, int]:
        sent.append(side)
        return next(took[side]), {"small": 7, "large": 9}[side]

    monkeypatch.setattr(console, "_timed", timed)
    monkeypatch.setattr(console, "_queries", lambda read: 4)

    pair = console._measure_pair(object(), warmup=1, repeat=3)  # type: ignore[arg-type]

    # One warm-up round, then three timed ones; each round sends one request to each size, the first
    # of a round alternating, so neither size always follows the other.
    assert sent == ["small", "large", "large", "small", "small", "large", "large", "small"]
    # Each size's median of its timed requests only (the warm-up's 1000 ms left out).
    assert (pair.small, pair.large, pair.queries, pair.rows_small, pair.rows_large) == (20.0, 14.0, 4, 7, 9)
