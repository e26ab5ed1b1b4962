"""Comparing two runs step by step. ORM-free.

Each run becomes its sequence of actions (commands and tool calls with their arguments), normalised as
dedup normalises them (`experience.dedup.signature`), so temp dirs, ids and line numbers do not count as
differences. The two sequences are aligned by edit distance in linear memory (Hirschberg's algorithm, after
trimming the prefix and suffix the runs share): equal actions match, actions of the same tool or command
with other arguments are `changed`, the rest `inserted` (only in B) or `deleted` (only in A).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from experience.dedup.signature import action_sequence
from experience.records import StepRecord, TrajectoryRecord

MATCH, CHANGED, INSERTED, DELETED = "match", "changed", "inserted", "deleted"
_INDEL, _CHANGE, _MISMATCH = 1, 1, 3  # a mismatch costs more than a delete and an insert: never chosen


@dataclass(frozen=True)
class Action:
    seq: int  # the step it came from
    text: str  # normalised

    @property
    def head(self) -> str:
        return self.text.split(" ", 1)[0]


@dataclass(frozen=True)
class AlignedPair:
    op: str
    a: Action | None
    b: Action | None


def run_actions(steps: Sequence[tuple[int, StepRecord]]) -> list[Action]:
    """The normalised actions of a run's (seq, step) pairs, each with the seq it came from. A run that keeps
    its tool calls only on model calls (an OpenAI conversation) is read from those, as dedup reads it."""
    actions = _actions(steps, ("command", "tool_call"))
    return actions or _actions(steps, ("model_call",))


def _actions(steps: Sequence[tuple[int, StepRecord]], kinds: tuple[str, ...]) -> list[Action]:
    actions: list[Action] = []
    for seq, step in steps:
        if step.kind in kinds:
            single = TrajectoryRecord(source="", source_format="", source_ref="", task_key="", steps=[step])
            actions.extend(Action(seq, text) for text in action_sequence(single))
    return actions


def align(a: Sequence[Action], b: Sequence[Action]) -> list[AlignedPair]:
    """An alignment of minimal cost of `a` onto `b`: O(len(a) * len(b)) time, O(len(a) + len(b)) memory."""
    start = 0
    while start < min(len(a), len(b)) and a[start].text == b[start].text:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end].text == b[-1 - end].text:
        end += 1
    head = [AlignedPair(MATCH, a[i], b[i]) for i in range(start)]
    tail = [AlignedPair(MATCH, a[len(a) - end + i], b[len(b) - end + i]) for i in range(end)]
    middle = _hirschberg(list(a[start : len(a) - end]), list(b[start : len(b) - end]))
    return head + middle + tail


def _cost(x: Action, y: Action) -> int:
    if x.text == y.text:
        return 0
    return _CHANGE if x.head == y.head else _MISMATCH


def _pair(x: Action, y: Action) -> AlignedPair:
    return AlignedPair(MATCH if x.text == y.text else CHANGED, x, y)


def _last_row(a: Sequence[Action], b: Sequence[Action]) -> list[int]:
    """Edit costs of aligning all of `a` with each prefix of `b`: one row of the table, kept in two lists."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(previous[j - 1] + _cost(x, y), previous[j] + _INDEL, current[j - 1] + _INDEL)
        previous = current
    return previous


def _hirschberg(a: list[Action], b: list[Action]) -> list[AlignedPair]:
    if not a:
        return [AlignedPair(INSERTED, None, y) for y in b]
    if not b:
        return [AlignedPair(DELETED, x, None) for x in a]
    if len(a) == 1:
        return _align_one(a[0], b)
    middle = len(a) // 2
    left = _last_row(a[:middle], b)
    right = _last_row(a[middle:][::-1], b[::-1])
    split = min(range(len(b) + 1), key=lambda j: left[j] + right[len(b) - j])
    return _hirschberg(a[:middle], b[:split]) + _hirschberg(a[middle:], b[split:])


def _align_one(x: Action, b: list[Action]) -> list[AlignedPair]:
    """One action against several: matched (or changed) with its cheapest partner, the rest inserted."""
    best = min(range(len(b)), key=lambda j: _cost(x, b[j]))
    if _cost(x, b[best]) > 2 * _INDEL:
        return [AlignedPair(DELETED, x, None)] + [AlignedPair(INSERTED, None, y) for y in b]
    return ([AlignedPair(INSERTED, None, y) for y in b[:best]] + [_pair(x, b[best])]
            + [AlignedPair(INSERTED, None, y) for y in b[best + 1 :]])


def first_divergence(pairs: Sequence[AlignedPair]) -> int | None:
    """The position of the first pair that is not a match, or None when the runs act alike."""
    return next((index for index, pair in enumerate(pairs) if pair.op != MATCH), None)


def counts(pairs: Sequence[AlignedPair]) -> dict[str, int]:
    tally = {MATCH: 0, CHANGED: 0, INSERTED: 0, DELETED: 0}
    for pair in pairs:
        tally[pair.op] += 1
    return tally


def patch_diff(a: str, b: str) -> str:
    """A unified diff of run A's final patch against run B's (both patches are diffs themselves)."""
    lines = difflib.unified_diff(a.split("\n"), b.split("\n"), "run A's patch", "run B's patch", lineterm="", n=2)
    return "\n".join(lines)
