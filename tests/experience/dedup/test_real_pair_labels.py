"""The hand-labelled pairs of real runs (tests/fixtures/dedup/README.md): the file holds what it says, and
the lexical embedder's clusters keep the precision and recall measured on them.

The scoring is `benchmarks/dedup.py`'s own (loaded from the file), so the benchmark's figures and this
test's cannot drift apart. Only the lexical embedder runs here: it is the default and needs no model.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter

import pytest

from experience.dedup.embed import get_embedder
from experience.dedup.signature import action_sequence
from tests.shared_paths import REPO

BENCHMARK = REPO / "benchmarks" / "dedup.py"
LABELS = REPO / "tests" / "fixtures" / "dedup" / "pair_labels.jsonl"

# Measured on this file when it was labelled (benchmarks/dedup.py, lexical at its threshold 0.88, within
# task): precision 29/31 = 0.9355, recall 29/32 = 0.9062. The margin lets one more wrong pair through and
# fails on two.
LEXICAL_PRECISION_FLOOR = 0.9355 - 0.03
LEXICAL_RECALL_FLOOR = 0.9062 - 0.035

@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_dedup", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pairs(bench):
    return bench.load_pair_labels(LABELS)


@pytest.fixture(scope="module")
def runs(bench, pairs):
    return bench.labelled_runs(pairs)


def test_every_labelled_run_exists_has_actions_and_keeps_its_task_key(runs):
    rows = [json.loads(line) for line in LABELS.read_text().splitlines()]
    for row in rows:
        for side in ("a", "b"):
            ref = row[side]
            record = runs[(ref["file"], ref["index"])]
            assert record.task_key == ref["task_key"], ref
            assert action_sequence(record), f"{ref} has no actions: the service never clusters such a run"


def test_both_classes_and_all_three_kinds_are_present(bench, pairs):
    assert {pair.duplicate for pair in pairs} == {True, False}
    assert {pair.kind for pair in pairs} == set(bench.PAIR_KINDS)
    counts = Counter(pair.kind for pair in pairs)
    assert all(counts[kind] >= 5 for kind in bench.PAIR_KINDS), counts


def test_pairs_are_distinct_and_coherent(pairs, runs):
    seen = set()
    for pair in pairs:
        assert pair.a != pair.b, pair
        key = frozenset((pair.a, pair.b))
        assert key not in seen, f"pair listed twice: {pair}"
        seen.add(key)
        assert pair.note.strip(), pair
        same_task = runs[pair.a].task_key == runs[pair.b].task_key
        if pair.kind == "different_tasks":
            assert not same_task and not pair.duplicate, pair


def test_a_bad_kind_or_a_missing_run_is_refused(bench, pairs, tmp_path):
    good = json.loads(LABELS.read_text().splitlines()[0])
    bad_kind = tmp_path / "bad_kind.jsonl"
    bad_kind.write_text(json.dumps({**good, "kind": "same_vibe"}) + "\n")
    with pytest.raises(ValueError, match="same_vibe"):
        bench.load_pair_labels(bad_kind)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({**good, "b": {**good["b"], "index": 999}}) + "\n")
    with pytest.raises(ValueError, match="run 999"):
        bench.labelled_runs(bench.load_pair_labels(missing))


def test_lexical_precision_and_recall_on_real_pairs_do_not_regress(bench, pairs, runs):
    lexical = get_embedder("lexical")
    scores = bench.real_pair_scores(pairs, runs, lexical)
    assert scores["threshold"] == lexical.threshold
    assert scores["precision"] >= LEXICAL_PRECISION_FLOOR, scores["wrong"]
    assert scores["recall"] >= LEXICAL_RECALL_FLOOR, scores["wrong"]
    # Within task (the service's default) a pair of different tasks can never be joined.
    assert scores["by_kind"]["different_tasks"]["fp"] == 0


def test_no_pair_the_service_marks_as_a_duplicate_is_labelled_distinct(bench, pairs, runs):
    """Every wrongly joined pair measured so far has runs of different outcomes, which the service keeps
    apart (`canonical.derive`): among its duplicate marks, what a dataset build leaves out, none was wrong."""
    marked = bench.real_pair_scores(pairs, runs, get_embedder("lexical"), same_outcome=True)
    assert sum(counts["fp"] for counts in marked["by_kind"].values()) == 0, marked["wrong"]


def test_the_scores_follow_the_labels(bench, pairs, runs):
    """Flipping every label turns true positives into false ones: the score reads the labels."""
    lexical = get_embedder("lexical")
    flipped = [type(pair)(pair.kind, pair.a, pair.b, not pair.duplicate, pair.note) for pair in pairs]
    straight = bench.real_pair_scores(pairs, runs, lexical)["by_kind"]
    inverted = bench.real_pair_scores(flipped, runs, lexical)["by_kind"]
    for kind in bench.PAIR_KINDS:
        assert inverted[kind]["fp"] == straight[kind]["tp"] and inverted[kind]["tn"] == straight[kind]["fn"]
