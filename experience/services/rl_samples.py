"""RL samples of stored runs: their model-call steps read back and chained (`experience.distill.rl_samples`).

A fixed number of queries for any number of runs: the runs, their model-call steps, the blobs and the
contexts those refer to. Runs whose calls carry no token ids are re-tokenised with the tokenizer the
operator named for their model endpoint (`TROVE_RL_TOKENIZERS`), or give no samples, with a note.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from experience.distill.rl_samples import Assembly, Fork, Sample, assemble, configured_encoder, model_calls
from experience.models import Step, Trajectory
from experience.services.stored import stored_step_records


def run_samples(*, trajectory_ids: Iterable[int]) -> dict[int, Assembly]:
    """Each run's assembly, by trajectory id (a run without model calls: an assembly with no samples)."""
    ids = list(trajectory_ids)
    endpoints = dict(Trajectory.objects.filter(pk__in=ids).values_list("pk", "metadata__model_endpoint"))
    steps = list(Step.objects.filter(trajectory_id__in=ids, kind=Step.Kind.MODEL_CALL).order_by("trajectory_id", "seq"))
    by_run: dict[int, list[Step]] = defaultdict(list)
    for step in steps:
        by_run[step.trajectory_id].append(step)
    records = dict(zip((step.pk for step in steps), stored_step_records(steps), strict=True))
    assemblies = {}
    for run_id in ids:
        run_steps = by_run.get(run_id, [])
        calls = model_calls([records[step.pk] for step in run_steps], seqs=[step.seq for step in run_steps])
        encode = configured_encoder(endpoints[run_id]) if endpoints.get(run_id) else None
        assemblies[run_id] = assemble(calls, encode=encode)
    return assemblies


def sample_data(sample: Sample) -> dict[str, Any]:
    """A sample as plain JSON data (the API's and the dataset's shape)."""
    return {
        "sample": sample.index,
        "exact": sample.exact,
        "token_ids": sample.token_ids,
        "loss_mask": sample.loss_mask,
        "logprobs": sample.logprobs,
        "calls": sample.calls,
        "policy_version": sample.policy_version,
        "policy_versions": sorted({v for v in sample.policy_versions if v is not None}),
        "fork": fork_data(sample.fork),
    }


def fork_data(fork: Fork | None) -> dict[str, Any] | None:
    return None if fork is None else fork.to_dict()


def assembly_summary(assembly: Assembly) -> dict[str, Any]:
    """What a page shows of a run's samples: how many, how made, and each fork (where, why)."""
    return {
        "samples": len(assembly.samples),
        "exact": assembly.exact,
        "calls": assembly.calls,
        "note": assembly.note,
        "tokens": sum(len(sample.token_ids) for sample in assembly.samples),
        "generated_tokens": sum(sample.generated_tokens for sample in assembly.samples),
        "forks": [fork.to_dict() for fork in assembly.forks],
    }
