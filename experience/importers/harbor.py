"""Harbor (Terminal-Bench 2) trial directories: one trial, one run, with the verifier's reward.

Harbor writes, per trial, `<job>/<trial_name>/`:
- `result.json` (TrialResult): {id, task_name, trial_name, task_id, source (the dataset), task_checksum,
  config, agent_info {name, version, model_info}, agent_result {n_input_tokens, n_cache_tokens,
  n_output_tokens, cost_usd, ...}, verifier_result {rewards {reward, ...}} | null, exception_info | null,
  started_at, finished_at, and the phases' times};
- `config.json` (the TrialConfig, also inside result.json);
- `agent/trajectory.json`, the agent's ATIF trajectory (any version up to v1.7; read by
  experience.importers.atif, subagents included);
- `verifier/reward.txt` or `verifier/reward.json`, the verifier's reward, which result.json repeats.

Any of a trial's files (result.json, agent/trajectory.json or another ATIF file in agent/) is detected as the
trial and yields the same runs, so importing the folder, the result or the trajectory gives one run, source_ref
"harbor:<trial id>" (the result's `id`, else its trial_name): task key = task_name, task set = the dataset
(`source`), harness and model from the config, reward from verifier_result.rewards ("reward", or the only
reward; all of them in metadata["harbor"]["rewards"]), else from the verifier's reward file. Success is not
something Harbor records: a 0/1 reward sets it, as on every import (experience.importers.outcomes). A trial
that raised and got no reward (exception_info, no verifier result) is status `infra_error`, the exception in
metadata["harbor"]["exception"]. A trial whose agent wrote no trajectory is a run with no steps.

The job folder's own result.json (JobResult: n_total_trials, stats) is not a trial, and is not detected.
Importing a folder reads each trial once, from agent/trajectory.json (`read_with_trial`): its bytes are the
original the runs keep.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers import atif
from experience.importers.base import (
    Location,
    as_dict,
    count_or_none,
    load_json_document,
    number_or_none,
    optional,
    parse_time,
    read_head,
)
from experience.importers.limits import loads_json
from experience.records import TrajectoryRecord

FORMAT = "harbor"
SOURCE_FORMAT = "harbor-trial"
RESULT, TRAJECTORY = "result.json", "trajectory.json"
_TRIAL_KEYS = re.compile(rb'"trial_name"\s*:')
_RESULT_KEYS = re.compile(rb'"(verifier_result|agent_info|exception_info)"\s*:')


def detect(path: Path, head: bytes) -> bool:
    if path.name == RESULT:
        return _is_trial_result(head)
    return path.parent.name == "agent" and path.suffix == ".json" and _trial_result(path.parent.parent) is not None


_JOB_KEYS = re.compile(rb'"n_total_trials"\s*:')


def is_job_summary(path: Path, head: bytes) -> bool:
    """A Harbor job's own result.json (JobResult): it says how the job's trials did, and is no trial itself."""
    return path.name == RESULT and head.lstrip()[:1] == b"{" and bool(_JOB_KEYS.search(head[:65536]))


def read_with_trial(path: Path) -> bool:
    """Whether importing a folder may leave this file out because another file of its trial reads it: the
    trial is read from agent/trajectory.json (the file kept as the runs' original), so its result.json and
    the agent's other JSON files are read with it. A trial with no trajectory is read from its result.json."""
    if path.name == RESULT:
        return (path.parent / "agent" / TRAJECTORY).is_file() and _trial_result(path.parent) is not None
    return (path.parent.name == "agent" and path.suffix == ".json" and path.name != TRAJECTORY
            and (path.parent / TRAJECTORY).is_file() and _trial_result(path.parent.parent) is not None)


def _is_trial_result(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{" and bool(_TRIAL_KEYS.search(head)) and bool(_RESULT_KEYS.search(head))


def _trial_result(folder: Path) -> Path | None:
    """The folder's result.json when it is a Harbor trial result."""
    result = folder / RESULT
    return result if result.is_file() and _is_trial_result(read_head(result)) else None


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    folder = path.parent if path.name == RESULT else path.parent.parent
    result_path = _trial_result(folder)
    if result_path is None:  # detect() saw one; the file went away or changed in between
        raise Location(path).malformed("not a Harbor trial: no trial result.json beside it")
    yield from trial_records(folder, result_path)


def trial_records(folder: Path, result_path: Path) -> list[TrajectoryRecord]:
    """The trial's run (first) and its agent's subagent runs."""
    loc = Location(result_path)
    result = load_json_document(result_path)
    if not isinstance(result, dict):
        raise loc.invalid(None, "a Harbor trial result must be a JSON object")
    ref = "harbor:" + _trial_id(result, loc)
    trajectory = folder / "agent" / TRAJECTORY
    records = (atif.document_records(load_json_document(trajectory), Location(trajectory), ref=ref)
               if trajectory.is_file() else [])
    root = _trial(result, loc, folder, records[0] if records else None, ref)
    for child in records[1:]:
        child.metadata["harbor"] = {"trial": ref}
    return [root, *records[1:]]


def _trial_id(result: dict[str, Any], loc: Location) -> str:
    identity = optional(result, "id", str, loc) or optional(result, "trial_name", str, loc)
    if not identity:
        raise loc.invalid("trial_name", "missing (and no id names the trial)")
    return identity


def _trial(
    result: dict[str, Any], loc: Location, folder: Path, agent_run: TrajectoryRecord | None, ref: str
) -> TrajectoryRecord:
    config = as_dict(result.get("config")) or as_dict(_json_or_none(folder / "config.json"))
    agent_config, info = as_dict(config.get("agent")), as_dict(result.get("agent_info"))
    rewards = _rewards(result, loc, folder)
    reward = _reward(rewards, loc)
    exception = as_dict(result.get("exception_info"))
    usage = as_dict(result.get("agent_result"))
    task = (optional(result, "task_name", str, loc) or as_dict(result.get("task_id")).get("path")
            or (agent_run.task_key if agent_run else ref))
    steps = agent_run.steps if agent_run else []
    metadata = {**(agent_run.metadata if agent_run else {}), "harbor": _harbor_metadata(result, config, rewards),
                "usage": {"tokens_in": count_or_none(usage.get("n_input_tokens")),
                          "tokens_out": count_or_none(usage.get("n_output_tokens")),
                          "tokens_cached": count_or_none(usage.get("n_cache_tokens")), "api_calls": None}}
    if info.get("version") and info["version"] != "unknown":
        metadata["agent_version"] = info["version"]
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=agent_run.source_version if agent_run else "",
        source_ref=ref,
        task_key=str(task),
        instruction=agent_run.instruction if agent_run else "",
        task_set=str(result.get("source") or as_dict(config.get("task")).get("source") or ""),
        harness=str(info.get("name") or agent_config.get("name") or (agent_run.harness if agent_run else "")),
        model=str(agent_config.get("model_name") or (agent_run.model if agent_run else "") or _model(info)),
        status="infra_error" if exception and reward is None else "imported",
        reward=reward,
        cost=number_or_none(usage.get("cost_usd")) if agent_run is None or agent_run.cost is None else agent_run.cost,
        started_at=parse_time(result.get("started_at"), loc, "started_at") or (agent_run.started_at if agent_run else None),
        finished_at=parse_time(result.get("finished_at"), loc, "finished_at") or (agent_run.finished_at if agent_run else None),
        metadata=metadata,
        steps=steps,
    )


def _rewards(result: dict[str, Any], loc: Location, folder: Path) -> dict[str, Any]:
    """The verifier's rewards: result.json's, else what the verifier wrote (reward.json, or a number in
    reward.txt)."""
    verifier = optional(result, "verifier_result", dict, loc)
    if verifier is not None:
        return optional(verifier, "rewards", dict, loc, prefix="verifier_result.") or {}
    written = _json_or_none(folder / "verifier" / "reward.json")
    if isinstance(written, dict):
        return written
    text = folder / "verifier" / "reward.txt"
    if text.is_file():
        value = number_or_none(_json_or_none(text))
        return {} if value is None else {"reward": value}
    return {}


def _reward(rewards: dict[str, Any], loc: Location) -> float | None:
    value = rewards.get("reward")
    if value is None and len(rewards) == 1:
        value = next(iter(rewards.values()))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise loc.invalid("verifier_result.rewards.reward", f"must be a number, got {value!r}")
    return float(value)


def _harbor_metadata(result: dict[str, Any], config: dict[str, Any], rewards: dict[str, Any]) -> dict[str, Any]:
    exception = as_dict(result.get("exception_info"))
    phases = {phase: result[phase] for phase in ("environment_setup", "agent_setup", "agent_execution", "verifier")
              if isinstance(result.get(phase), dict)}
    metadata: dict[str, Any] = {
        "trial_id": result.get("id"),
        "trial_name": result.get("trial_name"),
        "job_id": config.get("job_id"),
        "task_path": as_dict(result.get("task_id")).get("path") or as_dict(config.get("task")).get("path"),
        "task_checksum": result.get("task_checksum"),
        "environment": as_dict(config.get("environment")).get("type"),
        "agent_info": as_dict(result.get("agent_info")),
        "rewards": rewards,
        "phases": phases,
    }
    if exception:  # the traceback stays in the original file; the type and message say what happened
        metadata["exception"] = {k: exception.get(k) for k in ("exception_type", "exception_message", "occurred_at")}
    return {k: v for k, v in metadata.items() if v not in (None, {}, "")}


def _model(info: dict[str, Any]) -> str:
    model = as_dict(info.get("model_info"))
    name, provider = model.get("name"), model.get("provider")
    return f"{provider}/{name}" if name and provider else str(name or "")


def _json_or_none(path: Path) -> Any:
    if not path.is_file() or path.stat().st_size > 1 << 20:  # companion files are small; a large one is not ours
        return None
    try:
        return loads_json(path.read_bytes())
    except ValueError:
        return None
