"""Bar charts as server-side SVG geometry: the console ships no script, so a chart is
markup the template writes out (each bar carries its count, for readers and tests)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    start_ms: int


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    peak: int


def bar_chart(counts: list[int], starts_ms: list[int], width: int, height: int) -> Chart:
    """Bars side by side over ``width``; the tallest fills ``height`` (an empty chart stays flat)."""
    peak = max(counts, default=0)
    slot = width / max(len(counts), 1)
    gap = slot * 0.15 if slot >= 4 else 0.0
    bars = [
        Bar(
            x=round(i * slot, 3),
            y=round(height - (count / peak * height if peak else 0.0), 3),
            width=round(slot - gap, 3),
            height=round(count / peak * height if peak else 0.0, 3),
            count=count,
            start_ms=start,
        )
        for i, (count, start) in enumerate(zip(counts, starts_ms))
    ]
    return Chart(width, height, bars, peak)
