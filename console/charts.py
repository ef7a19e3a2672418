"""Geometry for the dashboard's inline SVG charts: numbers in, rectangles and points out.

No charting library and no script: the page draws these with ``<rect>`` and
``<polyline>`` in its template. Sizes and positions are SVG presentation
attributes (``x``, ``width``, ``points``…), which the Content-Security-Policy
allows, unlike ``style`` attributes; colours come from classes in
``static/console/dashboard.css``, so both themes apply. Each chart sits beside a
table or a caption with the same numbers: the SVG is decoration for the eye,
the text is what a screen reader reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SERIES_CLASSES = 6  # dashboard.css defines .series-0 … .series-5; more series reuse them in turn


@dataclass(frozen=True)
class Segment:
    key: str
    value: int
    x: float  # in the bar's own 0..100 box
    width: float
    css: str


@dataclass(frozen=True)
class StackedBar:
    key: str
    label: str
    total: int
    segments: tuple[Segment, ...]


def series_class(index: int) -> str:
    return f"series-{index % SERIES_CLASSES}"


def stacked_bars(
    rows: Sequence[tuple[str, str, dict[str, int]]], series: Sequence[str]
) -> tuple[StackedBar, ...]:
    """One bar per ``(key, label, {series: value})`` row, its segments in ``series`` order, every bar
    on the same scale (the largest total spans the whole 0..100 box)."""
    largest = max((sum(values.values()) for _, _, values in rows), default=0) or 1
    bars = []
    for key, label, values in rows:
        x, segments = 0.0, []
        for index, name in enumerate(series):
            value = values.get(name, 0)
            if value:
                width = 100.0 * value / largest
                segments.append(Segment(name, value, round(x, 3), round(width, 3), series_class(index)))
                x += width
        bars.append(StackedBar(key, label, sum(values.values()), tuple(segments)))
    return tuple(bars)


@dataclass(frozen=True)
class Column:
    label: str
    value: int
    x: float
    y: float
    width: float
    height: float


COLUMN_BOX = (180, 48)  # width, height of a column chart's viewBox


def columns(values: Sequence[int], labels: Sequence[str], *, scale: int | None = None) -> tuple[Column, ...]:
    """Columns side by side in a ``COLUMN_BOX``, heights relative to ``scale`` (default: the largest
    value), each at least a hairline when not zero so a single task still shows."""
    width, height = COLUMN_BOX
    top = scale or max(values, default=0) or 1
    step = width / max(len(values), 1)
    drawn = []
    for index, (value, label) in enumerate(zip(values, labels, strict=True)):
        tall = 0.0 if not value else max(height * value / top, 1.0)
        x, y = round(index * step + 1, 3), round(height - tall, 3)
        drawn.append(Column(label, value, x, y, round(step - 2, 3), round(tall, 3)))
    return tuple(drawn)


@dataclass(frozen=True)
class Sparkline:
    points: str  # the polyline's "x,y x,y …"
    area: str  # the same line closed along the bottom, for a filled area
    width: int
    height: int
    peak: int
    total: int


def sparkline(values: Sequence[int], *, height: int = 40) -> Sparkline:
    """A line over ``values`` (one x unit each), scaled so the peak touches the top of the box."""
    width = max(len(values) - 1, 1)
    peak = max(values, default=0)
    top = peak or 1
    coords = [(x, round(height - height * value / top, 2)) for x, value in enumerate(values)]
    points = " ".join(f"{x},{y}" for x, y in coords)
    area = f"0,{height} {points} {width},{height}" if coords else ""
    return Sparkline(points, area, width, height, peak, sum(values))
