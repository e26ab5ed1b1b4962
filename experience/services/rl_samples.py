"""RL samples of stored runs: their model-call steps read back and chained (`experience.distill.rl_samples`).

A fixed number of queries for any number of runs. The lean read comes first: only each model call's
payload (token ids, logprobs, policy version), which is all exact chaining needs. Runs that fork, or whose
calls carry no token ids, are read again with their request messages (blobs and contexts), to tell each
fork's cause or to re-tokenise them with the tokenizer the operator named for their model endpoint
(`TROVE_RL_TOKENIZERS`); without one they give no samples, with a note.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import orjson
from django.db import connection

from experience.distill.rl_samples import (
    Assembly,
    Fork,
    ModelCall,
    Sample,
    assemble,
    call_of_payload,
    configured_encoder,
    model_calls,
)
from experience.models import Step, Trajectory
from experience.records import StepRecord
from experience.services.blobs import blob_get_many
from experience.services.stored import step_contexts
from experience.steps import (
    CONTEXT,
    ContextMessages,
    context_bases,
    is_context_delta,
    referenced_hashes,
    step_record_from_parts,
)

_PAYLOADS_SQL = (
    "SELECT trajectory_id, seq, payload::text FROM experience_step"
    " WHERE kind = 'model_call' AND NOT is_error AND trajectory_id = ANY(%s) ORDER BY trajectory_id, seq"
)


def run_samples(*, trajectory_ids: Iterable[int]) -> dict[int, Assembly]:
    """Each run's assembly, by trajectory id (a run without model calls: an assembly with no samples)."""
    ids = list(trajectory_ids)
    assemblies: dict[int, Assembly] = {}
    for run_id, calls in _lean_calls(ids).items():
        if calls and all(call.has_ids for call in calls):
            assembly = assemble(calls)
            if not assembly.forks:
                assemblies[run_id] = assembly
    again = [run_id for run_id in ids if run_id not in assemblies]
    endpoints = dict(Trajectory.objects.filter(pk__in=again).values_list("pk", "metadata__model_endpoint"))
    for run_id, calls in _full_calls(again).items():
        encode = configured_encoder(endpoints[run_id]) if endpoints.get(run_id) else None
        assemblies[run_id] = assemble(calls, encode=encode)
    return assemblies


def _lean_calls(ids: list[int]) -> dict[int, list[ModelCall]]:
    """The runs' model calls from their payloads alone (no messages; error calls left out, as
    `model_calls` does)."""
    calls: dict[int, list[ModelCall]] = {run_id: [] for run_id in ids}
    if connection.vendor != "postgresql":  # the embedded store: no ANY() or ::text; its JSON is small
        rows = Step.objects.filter(trajectory_id__in=ids, kind=Step.Kind.MODEL_CALL, is_error=False).order_by(
            "trajectory_id", "seq").values_list("trajectory_id", "seq", "payload")
        for run_id, seq, payload in rows:
            calls[run_id].append(call_of_payload(payload or {}, seq=seq))
        return calls
    with connection.cursor() as cursor:  # payload as text, parsed by orjson: far faster than psycopg's json
        cursor.execute(_PAYLOADS_SQL, [ids])
        for run_id, seq, text in cursor.fetchall():
            calls[run_id].append(call_of_payload(orjson.loads(text) if text else {}, seq=seq))
    return calls


def _full_calls(ids: list[int]) -> dict[int, list[ModelCall]]:
    """The runs' model calls with their request messages and responses. Each context message is parsed once
    and the same record shared by every call whose context holds it (`ContextMessages`), so chaining
    compares a call's request with the sample's history by identity, in C, and the cost stays linear in the
    messages a run adds, not in the sum of its calls' contexts."""
    steps = list(Step.objects.filter(trajectory_id__in=ids, kind=Step.Kind.MODEL_CALL).order_by("trajectory_id", "seq"))
    refs_by_step = {step.pk: step.blob_refs for step in steps if CONTEXT in step.blob_refs}
    if context_bases(refs_by_step):  # a context extends a step that is no model call: resolve them in full
        stored: dict[int, Any] = step_contexts(steps)
    else:
        stored = {step_id: refs[CONTEXT] for step_id, refs in refs_by_step.items()}
    hashes = [h for step in steps for h in referenced_hashes(step.blob_refs, context=False)]
    hashes += [h for value in stored.values() for h in (value["append"] if is_context_delta(value) else value)]
    blobs = blob_get_many(hashes)
    contexts = ContextMessages(blobs).contexts(stored)
    records = [_step_record(step, blobs, contexts.get(step.pk)) for step in steps]
    by_run: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for step, record in zip(steps, records, strict=True):
        by_run[step.trajectory_id].append((step.seq, record))
    return {
        run_id: model_calls([record for _, record in by_run[run_id]], seqs=[seq for seq, _ in by_run[run_id]])
        for run_id in ids
    }


def _step_record(step: Step, blobs: dict[str, bytes], context: list | None) -> StepRecord:
    return step_record_from_parts(
        kind=step.kind, payload=step.payload, blob_refs=step.blob_refs, blobs=blobs, context=context,
        started_at=step.started_at, ended_at=step.ended_at, duration_ms=step.duration_ms, exit_code=step.exit_code,
        tokens_in=step.tokens_in, tokens_out=step.tokens_out, call_id=step.call_id, is_error=step.is_error,
    )


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
        "policy_versions": sorted({v for sample in assembly.samples for v in sample.policy_versions if v is not None}),
        "forks": [fork.to_dict() for fork in assembly.forks],
    }


def samples_overview(assemblies: Iterable[Assembly]) -> dict[str, Any]:
    """Across runs: how many are one sample, how many were assembled exactly, how many gave none, and the
    forks' causes by count (most frequent first)."""
    runs = list(assemblies)
    causes: dict[str, int] = defaultdict(int)
    for assembly in runs:
        for fork in assembly.forks:
            causes[fork.cause] += 1
    with_samples = [assembly for assembly in runs if assembly.samples]
    one = sum(1 for assembly in with_samples if len(assembly.samples) == 1)
    return {
        "runs": len(runs),
        "one_sample": one,
        "with_samples": len(with_samples),
        "one_sample_share": one / len(with_samples) if with_samples else None,
        "exact_runs": sum(1 for assembly in with_samples if assembly.exact),
        "without_samples": len(runs) - len(with_samples),
        "samples": sum(len(assembly.samples) for assembly in runs),
        "fork_causes": sorted(causes.items(), key=lambda item: (-item[1], item[0])),
    }
