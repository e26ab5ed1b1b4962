"""Aligning two runs over their normalised actions (experience.compare), on synthetic and real fixture runs."""

from __future__ import annotations

import random

from experience.compare import (
    CHANGED,
    DELETED,
    INSERTED,
    MATCH,
    Action,
    align,
    counts,
    first_divergence,
    run_actions,
)
from experience.importers import iter_records
from experience.records import StepRecord
from tests.experience.importers.fixture_files import SWE_AGENT


def _actions(texts: list[str]) -> list[Action]:
    return [Action(seq, text) for seq, text in enumerate(texts)]


def _cost(pairs) -> int:
    return sum({MATCH: 0, CHANGED: 1, INSERTED: 1, DELETED: 1}[p.op] for p in pairs)


def _edit_distance(a: list[str], b: list[str]) -> int:
    """The full table, for checking: substitution allowed only between actions of the same head."""
    table = [[i + j if i == 0 or j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            same = a[i - 1] == b[j - 1]
            sub = 0 if same else (1 if a[i - 1].split()[0] == b[j - 1].split()[0] else 3)
            table[i][j] = min(table[i - 1][j - 1] + sub, table[i - 1][j] + 1, table[i][j - 1] + 1)
    return table[-1][-1]


def test_it_marks_matched_changed_inserted_and_deleted_steps():
    a = _actions(["ls", "cat a.py", "pytest -q", "git diff"])
    b = _actions(["ls", "cat b.py", "sed -i s/x/y/ a.py", "pytest -q", "git diff"])
    pairs = align(a, b)
    assert [p.op for p in pairs] == [MATCH, CHANGED, INSERTED, MATCH, MATCH]
    assert first_divergence(pairs) == 1 and pairs[1].a.seq == 1 and pairs[1].b.seq == 1
    assert counts(pairs) == {MATCH: 3, CHANGED: 1, INSERTED: 1, DELETED: 0}


def test_a_deleted_action_is_one_only_run_a_took():
    pairs = align(_actions(["ls", "rm x", "pytest"]), _actions(["ls", "pytest"]))
    assert [p.op for p in pairs] == [MATCH, DELETED, MATCH] and pairs[1].b is None


def test_runs_that_act_alike_never_diverge():
    a = _actions(["ls", "pytest"])
    assert first_divergence(align(a, _actions(["ls", "pytest"]))) is None


def test_the_alignment_is_optimal_and_keeps_every_action_in_order():
    rng = random.Random(7)
    vocabulary = ["ls", "ls -la", "cat a", "cat b", "pytest", "pytest -x", "edit f", "grep x", "git diff"]
    for _ in range(60):
        a = [rng.choice(vocabulary) for _ in range(rng.randint(0, 14))]
        b = [rng.choice(vocabulary) for _ in range(rng.randint(0, 14))]
        pairs = align(_actions(a), _actions(b))
        assert [p.a.text for p in pairs if p.a] == a and [p.b.text for p in pairs if p.b] == b
        assert _cost(pairs) == _edit_distance(a, b)


def test_two_real_swe_agent_runs_of_one_task_align_and_diverge():
    paths = sorted(SWE_AGENT.glob("trajectories/demonstrations/replay__marshmallow-code__marshmallow-1867__*/*.traj"))
    runs = [next(iter_records(path)) for path in paths[:2]]
    a, b = (run_actions(list(enumerate(run.steps))) for run in runs)
    assert a and b
    pairs = align(a, b)
    assert [p.a for p in pairs if p.a] == a and [p.b for p in pairs if p.b] == b
    divergence = first_divergence(pairs)
    assert divergence is not None and pairs[divergence].op != MATCH


def test_a_conversation_run_is_read_from_its_model_calls_tool_calls():
    call = {"id": "c1", "type": "function", "function": {"name": "get_user", "arguments": '{"id": "u1"}'}}
    steps = [(0, StepRecord(kind="model_call", tool_calls=[call])), (1, StepRecord(kind="observation", text="ok"))]
    assert [a.seq for a in run_actions(steps)] == [0]


def test_long_runs_align_in_linear_memory():
    a = _actions([f"cmd {i % 50}" for i in range(1500)])
    b = _actions([f"cmd {i % 50}" for i in range(1500) if i % 97])
    pairs = align(a, b)
    assert counts(pairs)[DELETED] == sum(1 for i in range(1500) if i % 97 == 0)
