"""The real SWE-agent runs through every kind, imported with the project's importer.

The fixtures carry no resolved label, so the marshmallow variants (one task, eight tool configurations)
are given alternating outcomes: enough to exercise pairing, credit assignment and the schemas on real
contexts (demonstrations, tool calls, long observations).
"""

import gzip
import json

import pyarrow.parquet as pq
import pytest
from distill_factories import SWE_AGENT_FIXTURES

from experience.distill import chat
from experience.distill.build import distill
from experience.distill.decisions import decision_points
from experience.distill.source import SourceRun
from experience.distill.spec import KINDS, DatasetSpec
from experience.importers.swe_agent import parse


def imported_runs():
    runs = []
    for number, path in enumerate(sorted(SWE_AGENT_FIXTURES.rglob("*.traj"))):
        (record,) = parse(path)
        record.success = number % 2 == 0
        runs.append(SourceRun(trajectory_id=f"swe-{number:02d}", record=record))
    return sorted(runs, key=lambda run: (run.task_key, run.trajectory_id))


# `rl` needs calls recorded with token ids, which imported runs have not (test_rl_samples_dataset.py)
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "rl"])
def test_real_runs_build_every_kind_and_fit_the_declared_schemas(tmp_path, kind):
    manifest = distill(
        iter(imported_runs()), DatasetSpec(kind=kind, context_budget_tokens=4096), out_dir=tmp_path
    )

    assert manifest["rows"] > 0
    for entry in manifest["files"]:
        if entry["name"].endswith(".parquet"):
            assert pq.read_table(tmp_path / entry["name"]).num_rows == entry["rows"]
    if kind == "pairwise":
        assert set(manifest["task_rows"]) == {"marshmallow-code__marshmallow-1867"}


def test_real_contexts_keep_the_task_and_stay_valid_chat_after_truncation(tmp_path):
    runs = imported_runs()
    instructions = {run.trajectory_id: run.record.instruction for run in runs}
    distill(
        iter(runs),
        DatasetSpec(kind="value", context_budget_tokens=2048),
        out_dir=tmp_path,
        formats=("jsonl",),
    )

    rows = []
    for path in tmp_path.glob("*.jsonl.gz"):
        with gzip.open(path, "rt") as handle:
            rows += [json.loads(line) for line in handle]
    for row in rows:
        messages = row["messages"]
        task = chat.task_index(messages, instructions[row["trajectory_id"]], strict=True)
        assert task is not None, row["trajectory_id"]
        assert messages[0]["role"] == "system"
        assert task + 1 == len(messages) or messages[task + 1]["role"] != "tool"
    assert len({row["trajectory_id"] for row in rows}) == len(runs)
    assert any(row["stats"]["context_dropped"] > 0 for row in rows)


def test_recorded_requests_supply_the_context_of_imported_runs():
    (pydicom,) = [run for run in imported_runs() if run.task_key == "pydicom__pydicom-1458"]
    record = pydicom.record
    decisions = decision_points(record)
    conversation = chat.conversation(record, decisions)

    assert len(decisions) == 12
    assert all(record.steps[d.model_call].request_messages for d in decisions)
    tagged = [
        entry.decision for entry in conversation if entry.message["role"] == "assistant" and entry.decision
    ]
    assert tagged == list(range(1, 13))
