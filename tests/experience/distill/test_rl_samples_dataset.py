"""The `rl` dataset kind and the store-side assembly of stored runs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from experience.distill import rl_samples
from experience.records import TrajectoryRecord
from experience.services import datasets
from experience.services.ingest import trajectory_ingest
from experience.services.rl_samples import assembly_summary, run_samples
from tests.experience.distill.rl_traffic import TokenServer, agent_run
from tests.experience.services.dataset_store import rows_of

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(12)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def stored_run(server, task: str, sample_index: int, *, turns: int = 4, with_ids: bool = True, edit=None):
    steps = agent_run(server, turns, with_ids=with_ids, edit=edit)
    record = TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_ref=f"{task}:{sample_index}:{with_ids}",
        task_key=task, task_set="rl-set", instruction="Fix the failing test in the repository.",
        status="completed", reward=float(sample_index % 2), success=bool(sample_index % 2),
        started_at=datetime.now(UTC), steps=steps,
        metadata={"job_id": 7, "sample_index": sample_index, "model_endpoint": "local-vllm"},
    )
    return trajectory_ingest(record=record, rollout_runner=True)[0]


def built(kind: str = "rl"):
    dataset = datasets.dataset_create(name="rl-set", kind=kind, options={})
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    return datasets.dataset_version_build(version_id=version.pk)


def test_stored_runs_give_the_samples_their_calls_made(tokenizer_path):
    server = TokenServer(tokenizer_path)
    trajectory = stored_run(server, "task-00", 0, turns=6)
    assembly = run_samples(trajectory_ids=[trajectory.pk])[trajectory.pk]
    sample = assembly.samples[0]
    assert len(assembly.samples) == 1 and assembly.exact
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == \
        [t for call in server.generated for t in call["ids"]]
    assert assembly_summary(assembly)["generated_tokens"] == sum(len(c["ids"]) for c in server.generated)


def test_a_stored_compaction_is_reported_as_a_fork(tokenizer_path):
    def compacted(turn, messages):
        return [messages[0], {"role": "user", "content": "Summary of earlier turns."}] if turn == 3 else messages

    trajectory = stored_run(TokenServer(tokenizer_path), "task-00", 0, turns=5, edit=compacted)
    summary = assembly_summary(run_samples(trajectory_ids=[trajectory.pk])[trajectory.pk])
    assert summary["samples"] == 2 and [f["cause"] for f in summary["forks"]] == ["compaction"]


def test_the_rl_kind_writes_each_sample_with_its_group_keys_reward_and_split(tokenizer_path):
    server = TokenServer(tokenizer_path)
    stored = {(task, i): stored_run(server, task, i) for task in TASKS for i in range(2)}
    version = built()
    assert version.status == "ready"
    rows = rows_of(version)
    assert len(rows) == len(stored) and {row["kind"] for row in rows} == {"rl"}
    assert version.manifest["splits"]["train"]["rows"] > 0
    for row in rows:
        trajectory = stored[(row["task_key"], row["rollout_sample_index"])]
        assert row["trajectory_id"] == str(trajectory.pk) and row["job_id"] == 7 and row["sample_index"] == 0
        assert row["exact"] is True and row["fork_cause"] is None
        assert row["policy_version"] == server.policy_version  # the weights the server said made the calls
        assert row["reward"] == float(row["rollout_sample_index"] % 2)
        assert len(row["token_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
        generated = [lp for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m]
        assert None not in generated and len(generated) == sum(row["loss_mask"])
    # One task never lands in two splits.
    assert all(len({r["split"] for r in rows if r["task_key"] == task}) == 1 for task in TASKS)
    parquet = [Path(datasets.version_dir(version)) / name for name in version.files if name.endswith(".parquet")]
    table = pq.read_table(parquet[0])
    first = table.slice(0, 1).to_pylist()[0]
    match = next(r for r in rows if r["trajectory_id"] == first["trajectory_id"])
    assert first["token_ids"] == match["token_ids"] and first["loss_mask"] == match["loss_mask"]


def test_runs_without_token_ids_are_retokenised_with_the_endpoints_tokenizer_and_marked(tokenizer_path, settings):
    server = TokenServer(tokenizer_path)
    for task in TASKS[:6]:
        stored_run(server, task, 0, with_ids=False)
        stored_run(server, task, 1)
    settings.TROVE_RL_TOKENIZERS = {"local-vllm": str(tokenizer_path)}
    rl_samples._cached_encoder.cache_clear()
    rows = rows_of(built())
    assert sorted(row["exact"] for row in rows) == [False] * 6 + [True] * 6
    assert all(row["rollout_sample_index"] == (1 if row["exact"] else 0) for row in rows)
    assert all(set(row["logprobs"][i] for i, m in enumerate(row["loss_mask"]) if m) == {None}
               for row in rows if not row["exact"])


def test_without_a_tokenizer_runs_without_ids_give_no_rows(tokenizer_path, settings):
    settings.TROVE_RL_TOKENIZERS = {}
    server = TokenServer(tokenizer_path)
    for task in TASKS[:4]:
        stored_run(server, task, 0, with_ids=False)
        stored_run(server, task, 1)
    rows = rows_of(built())
    assert len(rows) == 4 and all(row["exact"] for row in rows)


def test_a_context_stored_as_a_delta_of_a_step_that_is_no_model_call_is_still_read_whole(tokenizer_path, settings):
    """Contexts are stored as deltas on the run's earlier contexts; assembly reads model calls only, so a base
    of another kind (here: the first call's row turned into a note) is fetched rather than missed."""
    from django.db import connection

    from experience.models import Step

    settings.TROVE_RL_TOKENIZERS = {"local-vllm": str(tokenizer_path)}
    rl_samples._cached_encoder.cache_clear()
    trajectory = stored_run(TokenServer(tokenizer_path), "task-00", 0, turns=4, with_ids=False)
    if connection.vendor == "postgresql":  # the embedded store keeps whole contexts: no delta to resolve there
        assert "extends" in Step.objects.get(trajectory=trajectory, seq=1).blob_refs["request_messages"]
    Step.objects.filter(trajectory=trajectory, seq=0).update(kind="note")

    assembly = run_samples(trajectory_ids=[trajectory.pk])[trajectory.pk]

    assert assembly.calls == 3 and len(assembly.samples) == 1 and not assembly.exact
    assert assembly.samples[0].calls == [1, 2, 3]
