"""The canonical rule and the duplicate marks of a cluster, from its members' outcomes (no database)."""

from __future__ import annotations

import itertools
import random

import pytest

from experience.dedup.canonical import Candidate, canonical_key, derive, outcome_of

WON = outcome_of(success=True, reward=1.0)
LOST = outcome_of(success=False, reward=0.0)
UNKNOWN = outcome_of(success=None, reward=None)


def run(run_id: int, outcome=LOST, curation: str = "pending") -> Candidate:
    return Candidate(run_id, outcome, curation)


def test_an_outcome_is_the_success_flag_else_a_positive_reward_and_the_reward_itself():
    assert outcome_of(success=None, reward=0.5) == outcome_of(success=True, reward=0.5)
    assert outcome_of(success=None, reward=0.0).solved is False
    assert outcome_of(success=None, reward=None) == UNKNOWN and not UNKNOWN.known
    assert outcome_of(success=True, reward=0.5) != outcome_of(success=True, reward=1.0)  # another reward
    assert outcome_of(success=False, reward=1.0) != WON  # the flag wins over the reward
    assert outcome_of(success=True, reward=1) == WON  # an int reward is the same reward


def test_the_canonical_is_a_success_even_when_a_failure_came_first():
    derivation = derive([run(1, LOST), run(2, WON), run(3, WON)])

    assert derivation.canonical_id == 2
    assert derivation.duplicate_of == {3: 2}  # the other success; the failure is nobody's duplicate
    assert derivation.mixed_outcomes and derivation.representatives == (2, 1)


@pytest.mark.parametrize(
    ("members", "canonical"),
    [
        ([run(1, UNKNOWN), run(2, LOST)], 2),  # labelled (an outcome recorded) before unlabelled
        ([run(1, LOST, "approved"), run(2, WON)], 2),  # successful before approved
        ([run(1, WON, "pending"), run(2, WON, "approved")], 2),  # approved before pending
        ([run(1, WON, "rejected"), run(2, WON, "pending")], 2),  # pending before rejected
        ([run(1, outcome_of(success=True, reward=0.5)), run(2, WON)], 2),  # the higher reward
        ([run(7, WON, "approved"), run(3, WON, "approved")], 3),  # then the earliest
    ],
)
def test_the_rule_prefers_a_labelled_successful_approved_run_then_the_earliest(members, canonical):
    assert derive(members).canonical_id == canonical
    assert derive(list(reversed(members))).canonical_id == canonical


def test_a_run_is_only_ever_a_duplicate_of_a_run_with_the_same_outcome():
    rng = random.Random(7)
    outcomes = [WON, LOST, UNKNOWN, outcome_of(success=True, reward=0.5), outcome_of(success=None, reward=0.0)]
    for _ in range(300):
        members = [run(i, rng.choice(outcomes), rng.choice(["approved", "pending", "rejected"]))
                   for i in rng.sample(range(1, 1000), rng.randint(1, 9))]
        by_id = {member.id: member for member in members}

        derivation = derive(members, pinned=rng.choice([None, members[0].id]))

        for duplicate, representative in derivation.duplicate_of.items():
            assert by_id[duplicate].outcome == by_id[representative].outcome
            assert representative not in derivation.duplicate_of
        kept = {by_id[i].outcome for i in by_id if i not in derivation.duplicate_of}
        assert kept == {member.outcome for member in members}  # every outcome keeps exactly one run
        assert len(derivation.representatives) == len(kept)
        assert derivation.mixed_outcomes == (len(kept) > 1)


def test_a_mixed_cluster_keeps_one_representative_per_outcome():
    members = [run(1, LOST), run(2, LOST, "approved"), run(3, WON), run(4, UNKNOWN), run(5, UNKNOWN)]

    derivation = derive(members)

    assert derivation.canonical_id == 3
    assert derivation.duplicate_of == {1: 2, 5: 4}  # the approved failure stands for the failures
    assert derivation.representatives == (3, 2, 4) and derivation.mixed_outcomes and derivation.duplicates == 2


def test_a_cluster_of_one_outcome_is_not_mixed():
    derivation = derive([run(4, WON), run(2, WON), run(9, WON)])

    assert not derivation.mixed_outcomes and derivation.canonical_id == 2
    assert derivation.duplicate_of == {4: 2, 9: 2}


def test_a_curators_canonical_stands_and_the_other_outcomes_still_follow_the_rule():
    members = [run(1, WON), run(2, LOST), run(3, LOST), run(4, WON)]

    derivation = derive(members, pinned=3)

    assert derivation.canonical_id == 3 and derivation.representatives == (3, 1)
    assert derivation.duplicate_of == {2: 3, 4: 1}
    assert derive(members, pinned=99).canonical_id == 1  # not a member: the rule decides


def test_the_derivation_does_not_depend_on_the_members_order():
    members = [run(5, LOST), run(2, WON, "rejected"), run(8, WON), run(3, UNKNOWN), run(9, LOST, "approved")]
    first = derive(members)

    for order in itertools.permutations(members):
        assert derive(list(order)) == first


def test_the_rule_key_orders_as_documented():
    ranked = sorted([run(1, UNKNOWN, "approved"), run(2, LOST, "approved"), run(3, WON, "rejected"),
                     run(4, WON, "pending"), run(5, WON, "approved")], key=canonical_key)

    assert [c.id for c in ranked] == [5, 4, 3, 2, 1]


def test_a_cluster_needs_members_with_distinct_ids():
    with pytest.raises(ValueError, match="at least one member"):
        derive([])
    with pytest.raises(ValueError, match="unique"):
        derive([run(1), run(1, WON)])
