"""The `rl` kind's per-step process rewards: the rubric labels a run earned, placed in the sample whose calls
earned them, and a curator's verdict winning over the detectors as it does in the other kinds' rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from experience.records import TrajectoryRecord
from experience.services import datasets
from experience.services.ingest import trajectory_ingest
from experience.services.step_labels import rubric_override
from tests.experience.distill import rl_traffic
from tests.experience.distill.rl_traffic import TokenServer, agent_run
from tests.experience.services.dataset_store import rows_of

pytestmark = pytest.mark.django_db

# Call 0 writes and runs a reproduction, call 1 edits the source, call 2 re-runs the tests.
COMMANDS = ["cat > reproduce_bug.py <<'EOF'\nprint(1)\nEOF\npython reproduce_bug.py",
            "sed -i s/x/y/ calc/lexer.py",
            "python -m pytest -q tests/test_calc.py"]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture(autouse=True)
def careful_agent(monkeypatch):
    reply = rl_traffic.tool_reply
    monkeypatch.setattr(rl_traffic, "tool_reply", lambda turn, _command: reply(turn, COMMANDS[turn % len(COMMANDS)]))


def compacted_before_call_2(turn, messages):
    return [messages[0], {"role": "user", "content": "Summary of earlier turns."}] if turn == 2 else messages


def stored_run(server, *, edit=None):
    record = TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_ref=f"careful:{edit is not None}",
        task_key="task-00", task_set="rl-set", instruction="Fix the failing test in the repository.",
        status="completed", reward=1.0, success=True, started_at=datetime.now(UTC),
        steps=agent_run(server, 4, edit=edit), metadata={"job_id": 7, "sample_index": 0, "model_endpoint": "v"},
    )
    return trajectory_ingest(record=record, rollout_runner=True)[0]


def rl_rows():
    dataset = datasets.dataset_create(name="rl-set", kind="rl", options={})
    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    assert version.status == "ready", version.error
    return sorted(rows_of(version), key=lambda row: row["sample_index"])


def test_each_sample_carries_the_rubric_labels_its_own_calls_earned(tokenizer_path):
    stored_run(TokenServer(tokenizer_path), edit=compacted_before_call_2)

    first, second = rl_rows()

    assert (first["calls"], second["calls"], second["fork_cause"]) == ([0, 1], [2, 3], "compaction")
    assert first["process_rewards"] == [
        {"step": 0, "label": "ran_repro_before_fix"}, {"step": 0, "label": "wrote_repro_test"},
        {"step": 1, "label": "edited_source"}]
    assert second["process_rewards"] == [{"step": 2, "label": "reran_tests_after_edit"}]


def test_a_label_a_curator_overrode_to_false_is_no_process_reward(tokenizer_path):
    trajectory = stored_run(TokenServer(tokenizer_path))
    rubric_override(trajectory_id=trajectory.pk, name="edited_source", value=False,
                    reason="the sed matched nothing: no source changed")

    (row,) = rl_rows()

    assert row["process_rewards"] == [
        {"step": 0, "label": "ran_repro_before_fix"}, {"step": 0, "label": "wrote_repro_test"},
        {"step": 2, "label": "reran_tests_after_edit"}]
