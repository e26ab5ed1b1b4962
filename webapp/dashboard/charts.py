"""Outcome bars for the overview, drawn as inline SVG by the template (no chart library, no CDN).

Plain geometry over counts: each bar is a row of segments, one per outcome, whose widths are proportional to
the counts, scaled to the largest bar so bars compare across rows.
"""

from __future__ import annotations

from dataclasses import dataclass

BAR_WIDTH = 480  # px of the longest bar (labels take the first 200, totals the last 40)
ROW_HEIGHT = 22
OUTCOME_COLOURS = {"succeeded": "#16a34a", "failed": "#dc2626", "infra_error": "#9ca3af", "cancelled": "#d1d5db",
                   "open": "#93c5fd", "unknown": "#e5e7eb"}


@dataclass(frozen=True)
class Segment:
    outcome: str
    count: int
    x: float
    width: float
    colour: str


@dataclass(frozen=True)
class Bar:
    label: str
    href: str
    total: int
    y: int
    segments: list[Segment]


def outcome_bars(rows: list[tuple[str, str, dict[str, int]]], *, width: int = BAR_WIDTH) -> list[Bar]:
    """(label, link, {outcome: count}) rows as bars, outcomes in OUTCOME_COLOURS order, zero counts left out."""
    largest = max((sum(counts.values()) for _, _, counts in rows), default=0) or 1
    bars = []
    for index, (label, href, counts) in enumerate(rows):
        x, segments = 0.0, []
        for outcome, colour in OUTCOME_COLOURS.items():
            n = counts.get(outcome, 0)
            if n:
                segment_width = width * n / largest
                segments.append(Segment(outcome, n, round(x, 1), round(segment_width, 1), colour))
                x += segment_width
        bars.append(Bar(label, href, sum(counts.values()), index * ROW_HEIGHT, segments))
    return bars


def chart_height(bars: list[Bar]) -> int:
    return max(1, len(bars)) * ROW_HEIGHT
