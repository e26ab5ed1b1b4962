"""Latency histograms for the fleet page: fixed, roughly logarithmic buckets and percentiles. No database."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Bucket edges in milliseconds: fine where warm claims live (a few ms), coarse where cold starts do (seconds).
EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)


@dataclass(frozen=True)
class Bin:
    label: str
    count: int
    pct: float  # height relative to the tallest bin, 0..100


@dataclass(frozen=True)
class Histogram:
    n: int
    bins: list[Bin] = field(default_factory=list)
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


def histogram(values_ms: Sequence[float], edges: Sequence[float] = EDGES_MS) -> Histogram:
    """Counts per bucket, trimmed to the range that has values, plus p50 / p90 / p99 and the maximum."""
    values = sorted(v for v in values_ms if v is not None and v >= 0)
    if not values:
        return Histogram(n=0)
    counts = [0] * (len(edges) + 1)
    for value in values:
        counts[_bucket(value, edges)] += 1
    first = next(i for i, c in enumerate(counts) if c)
    last = max(i for i, c in enumerate(counts) if c)
    top = max(counts)
    bins = [Bin(_label(i, edges), counts[i], round(100 * counts[i] / top, 1)) for i in range(first, last + 1)]
    return Histogram(n=len(values), bins=bins, p50=percentile(values, 50), p90=percentile(values, 90),
                     p99=percentile(values, 99), max=values[-1])


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _bucket(value: float, edges: Sequence[float]) -> int:
    for index, edge in enumerate(edges):
        if value < edge:
            return index
    return len(edges)


def _label(index: int, edges: Sequence[float]) -> str:
    if index == 0:
        return f"< {_ms(edges[0])}"
    if index == len(edges):
        return f"≥ {_ms(edges[-1])}"
    return f"{_ms(edges[index - 1])}–{_ms(edges[index])}"


def _ms(value: float) -> str:
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"
