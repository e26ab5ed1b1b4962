"""What a dataset build is asked to produce.

A `DatasetSpec` is the whole recipe apart from the data: the kind of rows, the options that shape them and
the split. Its JSON form is canonical (sorted keys, no whitespace) because the manifest hashes it: the same
spec always serialises to the same bytes, and `from_json(to_json(spec)) == spec`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from experience.distill.errors import SpecError

KINDS = ("value", "outcome", "pairwise", "sft", "rl")
SFT_MODES = ("truncate", "mask")
GROUP_BYS = ("task", "repo")
SPLITS = ("train", "val", "test")
DEFAULT_SPLITS = {"train": 0.8, "val": 0.1, "test": 0.1}


@dataclass(frozen=True)
class DatasetSpec:
    """A validated dataset recipe. Construction raises `SpecError` naming the first bad field.

    - `kind`: `value` (one row per decision point), `outcome` (one row per run), `pairwise` (succeeded vs
      failed runs of one task), `sft` (credit-assigned supervised fine-tuning), `rl` (token-exact samples of
      each run's model calls: `rl_rows`).
    - `gamma`: discount for value targets, in (0, 1].
    - `context_budget_tokens`: the most context a row keeps; tokens are estimated as characters / 4 unless
      the model call recorded its prompt token count.
    - `neg_pos_ratio`: at most this many failed runs per successful run of a task (None keeps all).
    - `splits`: train / val / test fractions, summing to 1.
    - `group_by`: what a split keeps together, `task` or `repo` (SWE-bench style `owner__repo-123`).
    - `include_duplicates` / `include_rejected`: keep runs marked duplicate / rejected by curation.
    - `sft_mode`: a failed run's harmful tail is cut off (`truncate`) or kept with loss weight 0 (`mask`).
    - `max_pairs_per_task`: the cap that keeps one task from dominating a pairwise set.
    - `seed`: drives the split, negative sampling and pair choice; a rebuild with the same seed is identical.
    - `filters`: the caller's record query (task sets, models, dates...). Opaque here, but part of the
      spec's identity, so it is hashed with the rest.
    - `preferences`: curators' pairwise choices, `[chosen id, rejected id]`, frozen into a pairwise version
      when it is requested; its pairs come before the automatic ones. Left out of the spec's dict (and so of
      its hash) when empty, so specs without any keep the identity they had.
    """

    kind: str
    gamma: float = 0.95
    context_budget_tokens: int = 8192
    neg_pos_ratio: float | None = None
    splits: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SPLITS))
    group_by: str = "task"
    include_duplicates: bool = False
    include_rejected: bool = False
    sft_mode: str = "truncate"
    max_pairs_per_task: int = 8
    seed: int = 0
    filters: dict[str, Any] = field(default_factory=dict)
    preferences: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, KINDS)
        _check_number("gamma", self.gamma, low=0.0, high=1.0, low_open=True)
        _check_int("context_budget_tokens", self.context_budget_tokens, minimum=1)
        if self.neg_pos_ratio is not None:
            _check_number("neg_pos_ratio", self.neg_pos_ratio, low=0.0, high=math.inf)
        _check_splits(self.splits)
        _check_choice("group_by", self.group_by, GROUP_BYS)
        _check_bool("include_duplicates", self.include_duplicates)
        _check_bool("include_rejected", self.include_rejected)
        _check_choice("sft_mode", self.sft_mode, SFT_MODES)
        _check_int("max_pairs_per_task", self.max_pairs_per_task, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        _check_filters(self.filters)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["preferences"]:
            del data["preferences"]
        return data

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, compact separators, so equal specs give equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetSpec:
        if not isinstance(data, dict):
            raise SpecError("spec", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        for key in sorted(data):
            if key not in known:
                raise SpecError(key, "is not a dataset spec field")
        if "kind" not in data:
            raise SpecError("kind", f"is required (one of {', '.join(KINDS)})")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> DatasetSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecError("spec", f"is not valid JSON ({error.msg})") from error
        return cls.from_dict(data)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(name, f"must be one of {', '.join(choices)}, not {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SpecError(name, f"must be true or false, not {value!r}")


def _check_int(name: str, value: object, *, minimum: int) -> None:
    # bool is an int subclass; `true` for a seed is a mistake worth reporting
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"must be an integer, not {value!r}")
    if value < minimum:
        raise SpecError(name, f"must be at least {minimum}, not {value}")


def _check_number(name: str, value: object, *, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise SpecError(name, f"must be a number, not {value!r}")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise SpecError(name, f"must be in {bracket}{low}, {high}], not {value}")


def _check_splits(splits: object) -> None:
    if not isinstance(splits, dict) or sorted(splits) != sorted(SPLITS):
        raise SpecError("splits", f"must give exactly {', '.join(SPLITS)}, not {splits!r}")
    for name in SPLITS:
        _check_number(f"splits.{name}", splits[name], low=0.0, high=1.0)
    if abs(sum(splits.values()) - 1.0) > 1e-6:
        raise SpecError("splits", f"fractions must sum to 1, not {sum(splits.values()):g}")


def _check_filters(filters: object) -> None:
    if not isinstance(filters, dict):
        raise SpecError("filters", "must be a JSON object")
    try:
        json.dumps(filters, sort_keys=True)
    except (TypeError, ValueError) as error:
        raise SpecError("filters", f"must be JSON-serialisable ({error})") from error
