"""A run with no actions has no exact-duplicate signature and joins no cluster by its empty action list."""

from __future__ import annotations

import numpy as np

from experience.dedup.cluster import DedupItem, Member, assign, cluster_items
from experience.dedup.embed import get_embedder
from experience.dedup.index import VectorIndex
from experience.dedup.signature import NO_SIGNATURE, exact_hash, signature_text
from experience.records import StepRecord, TrajectoryRecord

LEXICAL = get_embedder("lexical")


def quiet_run(ref: str, *, reward: float, task: str = "calc_expr") -> TrajectoryRecord:
    """A run that did nothing an action signature reads: a model call without a tool call, a note, an eval."""
    steps = [
        StepRecord(kind="model_call", response_text="I think the task is already done."),
        StepRecord(kind="note", text="harness ended: submitted"),
        StepRecord(kind="eval", command="python -m unittest", output="OK" if reward else "FAILED", exit_code=0),
    ]
    return TrajectoryRecord(source="rollout", source_format="trove", source_ref=ref, task_key=task,
                            instruction="Fix calc.", reward=reward, steps=steps)


def test_a_run_with_no_actions_has_no_exact_hash():
    failed, solved = quiet_run("a", reward=0.0), quiet_run("b", reward=1.0)

    assert exact_hash(failed) == exact_hash(solved) == NO_SIGNATURE == ""
    with_one = TrajectoryRecord(source="rollout", source_format="trove", source_ref="c", task_key="calc_expr",
                                steps=[StepRecord(kind="command", command="ls")])
    assert len(exact_hash(with_one)) == 64


def test_runs_with_no_actions_are_never_clustered_even_with_identical_signatures():
    records = [quiet_run("a", reward=0.0), quiet_run("b", reward=1.0), quiet_run("c", reward=0.0)]
    vectors = LEXICAL.embed([signature_text(r) for r in records])
    assert float(vectors[0] @ vectors[1]) > 0.99  # the signatures are the same text: a task head only
    items = [DedupItem(i, r.task_key, exact_hash(r), v) for i, (r, v) in enumerate(zip(records, vectors, strict=True))]

    assignments = cluster_items(items, threshold=LEXICAL.threshold)

    assert [a.canonical_id for a in assignments] == [0, 1, 2]
    assert not any(a.is_duplicate for a in assignments)


def test_a_new_run_with_no_actions_is_placed_alone_whatever_its_neighbours():
    vector = np.ones(8, dtype=np.float32) / np.sqrt(8)
    index = VectorIndex(8)
    index.add(np.array([1]), vector[None, :])
    twin = Member(1, "calc_expr", "c1", 1)

    result = assign(DedupItem(2, "calc_expr", NO_SIGNATURE, vector), index=index, lookup=lambda ids: {1: twin},
                    threshold=0.5, exact_match=twin)

    assert result.canonical_id == 2 and not result.is_duplicate and result.match == "canonical"
