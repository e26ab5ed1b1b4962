"""Which run of a duplicate cluster stands for it, and which runs are duplicates for training.

A cluster groups runs that did the same thing (exact or near duplicates of actions). It may still hold
runs whose outcomes differ: one solved the task, one did not. Dedup must never hide a success behind a
failure, so:

- **Outcome.** Two runs have the same outcome when they agree on whether they solved the task
  (`success`, else `reward > 0`, else unknown: `distill.source.run_success`) and on the reward itself
  (exactly, or both missing). Runs whose outcomes differ are never duplicates of each other.
- **Outcome groups.** A cluster's runs are split by outcome. Each group has one representative, chosen
  by the canonical rule; every other run of the group is a duplicate *of its representative* (a run
  with the same outcome). A cluster with more than one group is marked `mixed_outcomes`: it is still
  one cluster for browsing, but each group keeps a run in every dataset.
- **The canonical rule** (`CANONICAL_RULE_VERSION`), smallest key first:
  1. labelled: the run has an outcome (a success flag or a reward) before a run without one;
  2. successful before failed;
  3. approved before pending, pending before rejected (a rejected run never stands for others that
     a build would then drop with it);
  4. the higher reward;
  5. the earliest run (smallest id).
  The cluster's canonical is the representative of the group that sorts first. A curator's choice
  (`pinned`, a manual cluster's canonical) overrides the rule for the cluster's canonical and its own
  group; the other groups still follow the rule.

Change the rule, bump `CANONICAL_RULE_VERSION`: the store re-derives every cluster derived under an
older version (`experience.services.dedup.clusters_rederive_stale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CANONICAL_RULE_VERSION = 1
_CURATION_ORDER = {"approved": 0, "pending": 1, "rejected": 2}


@dataclass(frozen=True)
class Outcome:
    """What a run achieved, as dedup compares it: solved (True / False / None unknown) and the reward."""

    solved: bool | None
    reward: float | None

    @property
    def known(self) -> bool:
        return self.solved is not None


def outcome_of(*, success: bool | None, reward: float | None) -> Outcome:
    """The outcome of a run with this success flag and reward (the flag wins; else reward > 0)."""
    solved = success if success is not None else (reward > 0 if reward is not None else None)
    return Outcome(solved, None if reward is None else float(reward))


@dataclass(frozen=True)
class Candidate:
    """A cluster member as the rule sees it."""

    id: int
    outcome: Outcome
    curation: str = "pending"


@dataclass(frozen=True)
class Derivation:
    """A cluster's canonical and marks. `duplicate_of` maps each duplicate to its group's representative;
    representatives (the canonical among them) are not in it."""

    canonical_id: int
    duplicate_of: dict[int, int]
    mixed_outcomes: bool
    representatives: tuple[int, ...]  # one per outcome group, the canonical first

    @property
    def duplicates(self) -> int:
        return len(self.duplicate_of)


def canonical_key(candidate: Candidate) -> tuple[int, int, int, float, int]:
    """The rule's sort key (smallest first); see the module docstring."""
    outcome = candidate.outcome
    return (
        0 if outcome.known else 1,
        0 if outcome.solved else 1,
        _CURATION_ORDER.get(candidate.curation, 1),
        -(outcome.reward if outcome.reward is not None else float("-inf")),
        candidate.id,
    )


def derive(members: Sequence[Candidate], *, pinned: int | None = None) -> Derivation:
    """The canonical and duplicate marks of a cluster of these members (at least one).

    `pinned`: a member a curator chose as the canonical (ignored when it is not a member).
    Deterministic: the same members give the same derivation in any order.
    """
    if not members:
        raise ValueError("a cluster has at least one member")
    if len({member.id for member in members}) != len(members):
        raise ValueError("member ids must be unique")
    groups: dict[Outcome, list[Candidate]] = {}
    for member in sorted(members, key=canonical_key):
        groups.setdefault(member.outcome, []).append(member)
    pinned_member = next((member for member in members if member.id == pinned), None)
    representatives = {
        outcome: pinned_member if pinned_member is not None and pinned_member.outcome == outcome else group[0]
        for outcome, group in groups.items()
    }
    ordered = sorted(representatives.values(), key=canonical_key)
    if pinned_member is not None:
        ordered.remove(pinned_member)
        ordered.insert(0, pinned_member)
    duplicate_of = {
        member.id: representatives[outcome].id
        for outcome, group in groups.items()
        for member in group
        if member.id != representatives[outcome].id
    }
    return Derivation(
        canonical_id=ordered[0].id,
        duplicate_of=duplicate_of,
        mixed_outcomes=len(groups) > 1,
        representatives=tuple(member.id for member in ordered),
    )
