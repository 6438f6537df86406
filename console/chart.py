"""Bar charts as server-side SVG geometry: the console ships no script, so a chart is
markup the template writes out (each bar carries its count, for readers and tests)."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape

from rmqstore.common.times import iso_time


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
    """Interval i's bar at slot i of ``width``; the tallest fills ``height``. Empty
    intervals get no bar (a day at one-minute intervals is mostly empty on many queues)."""
    peak = max(counts, default=0)
    slot = width / max(len(counts), 1)
    gap = slot * 0.15 if slot >= 4 else 0.0
    bars = []
    for i, (count, start) in enumerate(zip(counts, starts_ms)):
        if count:
            tall = round(count / peak * height, 3)
            bars.append(Bar(round(i * slot, 3), round(height - tall, 3), round(slot - gap, 3), tall, count, start))
    return Chart(width, height, bars, peak)


def svg(chart: Chart, element_id: str, css_class: str, label: str) -> Markup:
    """The chart as inline SVG. Written here rather than in a template: a day at one-minute
    intervals is 1,440 bars per chart, and a template loop took most of the page's time.
    Everything interpolated is a number or escaped."""
    parts = [
        f'<svg class="{css_class}" id="{escape(element_id)}" viewBox="0 0 {chart.width} {chart.height}" '
        f'preserveAspectRatio="none" role="img" aria-label="{escape(label)}">',
        f'<line x1="0" y1="{chart.height}" x2="{chart.width}" y2="{chart.height}" class="axis"></line>',
    ]
    parts.extend(
        f'<rect x="{b.x}" y="{b.y}" width="{b.width}" height="{b.height}" data-count="{b.count}" data-start="{b.start_ms}">'
        f"<title>{iso_time(b.start_ms)}: {b.count}</title></rect>"
        for b in chart.bars
    )
    parts.append("</svg>")
    return Markup("".join(parts))
