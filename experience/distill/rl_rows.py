"""`rl` rows: one per token-exact sample of a run (`rl_samples`), for RL trainers.

A row holds the sample's token ids, loss mask and logprobs, the run's reward and outcome, the group keys a
group-relative advantage needs (job, task, the rollout's sample index, the sample's index in its run),
whether the ids are the server's own (`exact`) or re-tokenised, the fork that started the sample, and the
process rewards: the rubric labels the run earned at the steps the sample spans (`process_rewards`).
Runs whose calls cannot be assembled (no token ids and no tokenizer for their endpoint) give no rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from experience.distill.rl_samples import Assembly, Sample, assemble, configured_encoder, model_calls
from experience.distill.selection import eligible
from experience.distill.source import SourceRun, run_return, run_success
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task

Row = dict[str, Any]


def rl_rows(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """The samples of the eligible runs, as rows, run by run."""
    for run in eligible(runs, spec):
        assembly = run_assembly(run)
        earned = _earned_at(run) if assembly.samples else []
        for position, sample in enumerate(assembly.samples):
            following = assembly.samples[position + 1] if position + 1 < len(assembly.samples) else None
            yield sample_row(run, sample, spec, _within(earned, sample, following))


def run_assembly(run: SourceRun) -> Assembly:
    endpoint = str(run.record.metadata.get("model_endpoint") or "")
    return assemble(model_calls(run.record.steps), encode=configured_encoder(endpoint) if endpoint else None)


def sample_row(run: SourceRun, sample: Sample, spec: DatasetSpec, process: list[dict[str, Any]]) -> Row:
    record, fork = run.record, sample.fork
    group, split = split_for_task(record.task_key, spec)
    job_id = record.metadata.get("job_id")
    rollout_sample = record.metadata.get("sample_index")
    return {
        "kind": "rl",
        "task_key": record.task_key,
        "task_set": record.task_set,
        "group_key": group,
        "split": split,
        "trajectory_id": run.trajectory_id,
        "job_id": int(job_id) if isinstance(job_id, int) else None,
        "rollout_sample_index": int(rollout_sample) if isinstance(rollout_sample, int) else None,
        "sample_index": sample.index,
        "token_ids": sample.token_ids,
        "loss_mask": sample.loss_mask,
        "logprobs": sample.logprobs,
        "exact": sample.exact,
        "calls": sample.calls,
        "policy_version": sample.policy_version,
        "fork_cause": fork.cause if fork else None,
        "fork_message_index": fork.message_index if fork else None,
        "fork_token_index": fork.token_index if fork else None,
        "reward": run_return(record),
        "outcome": run_success(record),
        "process_rewards": process,
    }


def _earned_at(run: SourceRun) -> list[tuple[int, str]]:
    """(step index, label) of each rubric label the run earned at a step, in step order. A curator's verdict
    of false wins over the detector, as in the other kinds' rows; one of true names no step, so it places
    no label here."""
    overruled = {label for label, value in run.rubric_overrides if not value}
    changes = run.scored.label_changes()
    return sorted((step, label) for label, value, step in changes
                  if value and step is not None and label not in overruled)


def _within(earned: list[tuple[int, str]], sample: Sample, following: Sample | None) -> list[dict[str, Any]]:
    """The labels earned from the sample's first call up to the next sample's first (or the run's end)."""
    start = sample.calls[0]
    end = following.calls[0] if following is not None else None
    return [{"step": step, "label": label} for step, label in earned if step >= start and (end is None or step < end)]
