"""Outcomes as sources name them, and success derived from a reward when a source gives only the reward.

Sources spell the outcome differently: `reward` / `score` for the number; `success`, `resolved`, `passed`,
`solved`, `correct` or SWE-agent datasets' `target` for the verdict, as true/false or as the text "True" /
"False". `outcome_of` reads whichever a source wrote.

A run with a reward but no verdict gets one by the source's rule (`derive_success`, applied by
experience.importers.iter_records to every format): with a threshold given (`--success-threshold`),
success is reward >= threshold; without one, only a 0/1 reward decides (success is reward >= 1, as
tau-bench and pass/fail scorers mean it) and any other reward leaves success unknown. A derived verdict is
recorded in metadata["outcome_derived"] = {"success": "<the rule>"}, so it is never mistaken for one the
source stated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from experience.importers.base import Location
from experience.records import TrajectoryRecord

REWARD_KEYS = ("reward", "score", "final_reward", "total_reward")
SUCCESS_KEYS = ("success", "resolved", "passed", "solved", "correct", "is_success", "target")
DERIVED_KEY = "outcome_derived"
_TRUE, _FALSE = frozenset({"true", "yes", "1", "resolved", "passed"}), frozenset({"false", "no", "0", "unresolved",
                                                                                 "failed"})


def outcome_of(obj: dict[str, Any], loc: Location) -> tuple[float | None, bool | None]:
    """(reward, success) as the object names them; a value of the wrong kind is an error naming its key."""
    return _first_reward(obj, loc), _first_verdict(obj, loc)


def _first_reward(obj: dict[str, Any], loc: Location) -> float | None:
    for key in REWARD_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise loc.invalid(key, f"must be a number, got {type(value).__name__}")
        return float(value)
    return None


def _first_verdict(obj: dict[str, Any], loc: Location) -> bool | None:
    for key in SUCCESS_KEYS:
        if obj.get(key) is not None:
            return verdict(obj[key], loc, key)
    return None


def verdict(value: Any, loc: Location, field: str) -> bool:
    """true/false, or the text of one ("True", "False", "resolved", ...), as a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise loc.invalid(field, f"must be true/false, got {value!r}")


def derive_success(record: TrajectoryRecord, threshold: float | None = None) -> TrajectoryRecord:
    """The record with success set from its reward where it has none (see module docstring)."""
    if record.success is not None or record.reward is None:
        return record
    if threshold is not None:
        success, rule = record.reward >= threshold, f"reward >= {threshold:g} (--success-threshold)"
    elif record.reward in (0.0, 1.0):
        success, rule = record.reward >= 1.0, "reward >= 1 (a 0/1 reward)"
    else:
        return record
    return replace(record, success=success, metadata={**record.metadata, DERIVED_KEY: {"success": rule}})
