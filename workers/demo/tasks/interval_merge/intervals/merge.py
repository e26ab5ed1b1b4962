"""Closed integer intervals given as (start, end) pairs with start <= end."""

Interval = tuple[int, int]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals. The result is sorted and disjoint."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if start > end:
            raise ValueError(f"bad interval: ({start}, {end})")
        if merged and start <= merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def total_length(intervals: list[Interval]) -> int:
    return sum(end - start for start, end in merge(intervals))


def insert(intervals: list[Interval], new: Interval) -> list[Interval]:
    return merge([*intervals, new])
