"""Decision points: the places in a run where the agent chose an action.

A decision is one model call together with the actions it led to (the `command` / `tool_call` steps that
follow it before the next model call). A model call followed by no action step is still a decision when
it answered (a final reply, or tool calls a proxy-only recording never saw run). An action step with no
model call before it (importers that keep commands but not calls) is a decision on its own. Failed model
calls (`is_error`) and empty replies decided nothing and are skipped.

Decisions are numbered t = 1..T in run order; everything else in a run (messages, observations, evals,
sandbox events) is context, not a decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experience.records import StepRecord, TrajectoryRecord

ACTION_KINDS = ("command", "tool_call")


@dataclass(frozen=True)
class Decision:
    """Decision t of a run: its model call's step index (or None) and its action steps' indices."""

    t: int
    model_call: int | None
    actions: tuple[int, ...]

    @property
    def first_step(self) -> int:
        return self.model_call if self.model_call is not None else self.actions[0]

    @property
    def last_step(self) -> int:
        return self.actions[-1] if self.actions else self.first_step

    def covers(self, step_index: int) -> bool:
        return self.first_step <= step_index <= self.last_step


def decision_points(record: TrajectoryRecord) -> list[Decision]:
    """The run's decisions in order, numbered from 1."""
    groups: list[tuple[int | None, list[int]]] = []
    open_call = False  # the last group is a model call still collecting its actions
    for index, step in enumerate(record.steps):
        if step.kind == "model_call":
            if _decided(step):
                groups.append((index, []))
                open_call = True
            else:
                open_call = False
        elif step.kind in ACTION_KINDS:
            if open_call:
                groups[-1][1].append(index)
            else:
                groups.append((None, [index]))
    kept = [(call, actions) for call, actions in groups if actions or _answered(record, call)]
    return [Decision(t, call, tuple(actions)) for t, (call, actions) in enumerate(kept, start=1)]


def decision_at(decisions: list[Decision], step_index: int) -> Decision | None:
    """The decision whose steps include `step_index`, if any."""
    return next((decision for decision in decisions if decision.covers(step_index)), None)


def model_tool_calls(step: StepRecord) -> list[dict[str, Any]]:
    """Tool calls a model call returned: `tool_calls`, else the first choice of the upstream body."""
    if step.tool_calls:
        return step.tool_calls
    body = step.response_json or {}
    choices = body.get("choices") if isinstance(body, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            return calls
    return []


def _decided(step: StepRecord) -> bool:
    return not step.is_error


def _answered(record: TrajectoryRecord, call: int | None) -> bool:
    """A model call with no action step counts only if it replied with text or tool calls."""
    if call is None:
        return False
    step = record.steps[call]
    return bool((step.response_text or "").strip()) or bool(model_tool_calls(step))
