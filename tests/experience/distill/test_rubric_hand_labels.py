"""The rubric detectors against the hand labels of tests/fixtures/rubric (see its README).

Fails when a detector change makes any label's precision or recall (same action as the hand-labelled
step) drop below 0.9, or when the labelled set stops covering what it claims to.
"""

import json
from collections import Counter

import pytest

from experience.distill.rubric import LABELS
from experience.distill.rubric_agreement import (
    LabelledRun,
    action_of_steps,
    detector_first_steps,
    load_labelled_runs,
    score,
    summary,
)
from experience.records import StepRecord, TrajectoryRecord
from tests.shared_paths import FIXTURES_DIR, REPO

LABELS_DIR = REPO / "tests" / "fixtures" / "rubric"
HAND_LABELS = LABELS_DIR / "hand_labels.jsonl"


def locate(file: str):
    if file.startswith("fixtures:"):
        return FIXTURES_DIR / file.removeprefix("fixtures:")
    if file.startswith("repo:"):
        return REPO / file.removeprefix("repo:")
    return LABELS_DIR / file


@pytest.fixture(scope="module")
def runs() -> list[LabelledRun]:
    return list(load_labelled_runs(HAND_LABELS, locate))


def test_every_detector_agrees_with_the_hand_labels(runs):
    figures = summary(score(runs), len(runs))

    assert figures["labels"] == list(LABELS)
    assert figures["min_precision"] >= 0.9, figures["per_label"]
    assert figures["min_recall"] >= 0.9, figures["per_label"]
    # Every label the hand labels hold somewhere has both figures (none is vacuous by a silent detector).
    for name, entry in figures["per_label"].items():
        if entry["hand_positives"]:
            assert entry["precision"] is not None and entry["recall"] is not None, name


def test_the_issue_runs_now_earn_their_labels(runs):
    """The demo run of the issue: a `python3 - <<'EOF'` edit, then unittest "Ran 6 tests ... OK"."""
    (date_run,) = [run for run in runs if run.record.task_key == "date_add_months" and run.record.success]
    found = detector_first_steps(date_run.record)

    assert "python3 - <<'EOF'" in date_run.record.steps[found["edited_source"]].command
    assert "Ran 6 tests" in date_run.record.steps[found["verified_fix"]].output
    assert found["reran_tests_after_edit"] == found["verified_fix"] == date_run.labels["verified_fix"]


def test_the_labelled_set_covers_demo_tasks_outcomes_and_every_source(runs):
    demo = [run for run in runs if run.file == "demo_runs.jsonl"]
    outcomes = Counter(run.record.success for run in demo)
    formats = {run.record.source_format for run in runs}

    assert len(runs) >= 60
    assert len({run.record.task_key for run in demo}) == 14
    assert outcomes[True] >= 12 and outcomes[False] >= 12
    assert {
        "trove-rollout",
        "swe-agent-traj",
        "openhands-output",
        "openhands-events",
        "inspect-eval",
    } <= formats
    assert len({(run.file, run.index) for run in runs}) == len(runs)  # no run labelled twice


def test_hand_labelled_steps_exist_in_their_runs(runs):
    for run in runs:
        for name, step in run.labels.items():
            assert step is None or 0 <= step < len(run.record.steps), (run.file, run.index, name)


def test_a_label_file_row_without_every_label_is_refused(tmp_path):
    path = tmp_path / "hand_labels.jsonl"
    path.write_text(
        json.dumps({"file": "demo_runs.jsonl", "index": 0, "labels": {"edited_source": 10}}) + "\n"
    )

    with pytest.raises(ValueError, match="line 1: no hand label for wrote_repro_test"):
        list(load_labelled_runs(path, locate))


def test_a_row_naming_a_run_the_file_lacks_is_refused(tmp_path):
    path = tmp_path / "hand_labels.jsonl"
    row = {"file": "demo_runs.jsonl", "index": 999, "labels": dict.fromkeys(LABELS)}
    path.write_text(json.dumps(row) + "\n")

    with pytest.raises(ValueError, match="demo_runs.jsonl has no run 999"):
        list(load_labelled_runs(path, locate))


def test_steps_recorded_for_an_action_belong_to_it_and_the_next_decision_starts_a_new_one(runs):
    (basic,) = [run for run in runs if run.file.endswith("trajs/basic.json")]
    record = basic.record
    actions = action_of_steps(record)

    # 1 model call, 2 its editor tool call, 3 the file change recorded for it, 4 the next model call
    assert [record.steps[i].kind for i in (1, 2, 3, 4)] == [
        "model_call",
        "tool_call",
        "file_change",
        "model_call",
    ]
    assert actions[1] == actions[2] == actions[3] != actions[4]


def test_scores_count_a_step_in_another_action_as_a_miss_both_ways():
    steps = [
        StepRecord(kind="command", command="pytest tests/test_a.py", output="1 failed", exit_code=1),
        StepRecord(kind="command", command="sed -i 's/a/b/' src/a.py", exit_code=0),
    ]
    record = TrajectoryRecord(
        source="import", source_format="test", source_ref="x", task_key="t", steps=steps
    )
    hand = dict.fromkeys(LABELS)
    hand.update(ran_repro_before_fix=0, edited_source=0)  # the edit labelled one action too early
    scores = score([LabelledRun(file="x", index=0, record=record, labels=hand)])

    assert (scores["ran_repro_before_fix"].tp, scores["ran_repro_before_fix"].fp) == (1, 0)
    assert (scores["edited_source"].tp, scores["edited_source"].fp, scores["edited_source"].fn) == (0, 1, 1)
    assert scores["edited_source"].precision == 0.0 and scores["verified_fix"].precision is None
