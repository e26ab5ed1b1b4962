"""SWE-agent trajectories as rows of a published dataset (nebius/SWE-agent-trajectories, the Agent Data
Protocol's raw SWE-agent samples): a JSON array of rows, JSONL with one row per line, or Parquet.

A row: {"instance_id", "model_name", "target": true/false or "True"/"False", "trajectory": [{"role":
"system" | "user" | "ai", "text", "mask"?, "cutoff_date"?, "system_prompt"?}], "exit_status",
"generated_patch", "eval_logs"}. The published rows keep the system prompt in `system_prompt` with `text`
null on the system turn: that prompt is the turn's text.

Steps: `system` and `user` turns before the first `ai` turn become `message` steps (the system prompt, the
task); each `ai` turn a `model_call` (its text as the reply, the turns before it as the context) followed,
when its text ends in a fenced block (SWE-agent's DISCUSSION + ``` command ``` answer), by a `command` with
that block as the command line and the next `user` turn as its output. A `user` turn that answers no
command stays a `message`. `target` is the outcome (success, and reward 1/0); `generated_patch` the final
diff; exit status and evaluation logs go to metadata. Parquet is read a batch of rows at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    UniqueRefs,
    first_json_line,
    iter_jsonl,
    load_json_document,
    looks_like_diff,
    message_step,
    read_head,
    ref_name,
    text_or_empty,
)
from experience.importers.outcomes import verdict
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT = "swe_agent_rows"
SOURCE_FORMAT = "swe-agent-dataset-row"
PARQUET_MAGIC = b"PAR1"
PARQUET_BATCH = 64
_ROLES = {"ai": "assistant", "user": "user", "system": "system"}
_ROW_KEYS = re.compile(rb'"trajectory"\s*:\s*\[\s*\{[^\[\]]{0,400}?"role"\s*:\s*"(system|user|ai)"')
# the last fenced block of an ai turn: ```[lang]\n<command>\n```
_FENCED = re.compile(r"```[^\n`]*\n(.*?)\n?```\s*$", re.DOTALL)
_ROW_FIELDS = ("instance_id", "model_name", "target", "trajectory", "exit_status", "generated_patch", "eval_logs")


def detect(path: Path, head: bytes) -> bool:
    if head.startswith(PARQUET_MAGIC):
        return _parquet_has_rows(path)
    line = first_json_line(head)
    if isinstance(line, dict):
        return _is_row(line)
    stripped = head.lstrip()
    return stripped[:1] in (b"[", b"{") and b'"instance_id"' in head and bool(_ROW_KEYS.search(head))


def _is_row(obj: dict[str, Any]) -> bool:
    turns = obj.get("trajectory")
    return (
        "instance_id" in obj
        and isinstance(turns, list)
        and all(isinstance(t, dict) and t.get("role") in _ROLES and "text" in t for t in turns[:3])
    )


def _parquet_has_rows(path: Path) -> bool:
    import pyarrow.parquet as pq  # only for Parquet files: the import costs a second

    try:
        names = set(pq.ParquetFile(path).schema_arrow.names)
    except Exception:  # noqa: BLE001 - any fault of a file that only looks like Parquet: not ours
        return False
    return {"instance_id", "trajectory"} <= names


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    refs = UniqueRefs()
    for index, (loc, row) in enumerate(_rows(path)):
        yield _record(path, name, row, Location(path, line=loc.line, record=index), refs)


def _rows(path: Path) -> Iterator[tuple[Location, Any]]:
    head = read_head(path)
    if head.startswith(PARQUET_MAGIC):
        yield from _parquet_rows(path)
        return
    if isinstance(first_json_line(head), dict):
        for line, row in iter_jsonl(path):
            yield Location(path, line=line), row
        return
    document = load_json_document(path)
    rows = document if isinstance(document, list) else [document]
    for row in rows:
        yield Location(path), row


def _parquet_rows(path: Path) -> Iterator[tuple[Location, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        for batch in table.iter_batches(batch_size=PARQUET_BATCH):
            for row in batch.to_pylist():
                yield Location(path), row
    except (pa.ArrowException, OSError) as exc:
        raise Location(path).malformed(f"cannot be read as Parquet: {exc} (corrupted?)") from None


def _record(path: Path, name: str | None, row: Any, loc: Location, refs: UniqueRefs) -> TrajectoryRecord:
    if not isinstance(row, dict):
        raise loc.invalid(None, "each row must be a JSON object")
    turns = _turns(row, loc)
    instance = text_or_empty(row.get("instance_id"))
    if not instance:
        raise loc.invalid("instance_id", "missing")
    success = verdict(row["target"], loc, "target") if row.get("target") is not None else None
    patch = text_or_empty(row.get("generated_patch"))
    model = text_or_empty(row.get("model_name"))
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_ref=refs.take(f"swe-agent-rows:{ref_name(path, name)}#{instance}@{model}"),
        task_key=instance,
        instruction=_instruction(turns),
        harness="swe-agent",
        model=model,
        reward=None if success is None else float(success),
        success=success,
        final_diff=patch if looks_like_diff(patch) else "",
        metadata=_metadata(row, patch),
        steps=steps_from_turns(turns),
    )


def _turns(row: dict[str, Any], loc: Location) -> list[dict[str, Any]]:
    turns = row.get("trajectory")
    if not isinstance(turns, list):
        raise loc.invalid("trajectory", "missing" if turns is None else "must be a list")
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in _ROLES:
            raise loc.invalid(f"trajectory[{index}].role", f"must be one of {', '.join(_ROLES)}")
        for key in ("text", "system_prompt"):
            if turn.get(key) is not None and not isinstance(turn[key], str):
                raise loc.invalid(f"trajectory[{index}].{key}", "must be text")
    # the dataset keeps the system prompt in `system_prompt`, with `text` null, on its system turn
    return [{**turn, "text": turn.get("text") or turn.get("system_prompt") or ""} for turn in turns]


def steps_from_turns(turns: list[dict[str, Any]]) -> list[StepRecord]:
    context = [MessageRecord(role=_ROLES[t["role"]], content=t["text"]) for t in turns]
    steps: list[StepRecord] = []
    index = 0
    while index < len(turns):
        turn = turns[index]
        if turn["role"] != "ai":
            steps.append(message_step(_ROLES[turn["role"]], turn["text"], payload={"turn": index}))
            index += 1
            continue
        steps.append(StepRecord(kind="model_call", response_text=turn["text"], request_messages=context[:index],
                                payload={"turn": index}))
        command = ai_command(turn["text"])
        answer = turns[index + 1] if index + 1 < len(turns) and turns[index + 1]["role"] == "user" else None
        if command is None:
            index += 1
            continue
        steps.append(StepRecord(kind="command", command=command, output=answer["text"] if answer else None,
                                payload={"turn": index}))
        index += 2 if answer else 1
    return steps


def ai_command(text: str) -> str | None:
    """The command an ai turn issued: its last fenced block, when the turn ends with it."""
    match = _FENCED.search(text)
    return match.group(1) if match else None


def _instruction(turns: list[dict[str, Any]]) -> str:
    return next((t["text"] for t in turns if t["role"] == "user"), "")


def _metadata(row: dict[str, Any], patch: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"run_name": text_or_empty(row.get("model_name"))}
    for key in ("exit_status", "eval_logs"):
        if row.get(key) is not None:
            metadata[key] = row[key]
    if patch and not looks_like_diff(patch):
        metadata["generated_patch"] = patch
    metadata.update({k: v for k, v in row.items() if k not in _ROW_FIELDS and _jsonable(v)})
    return metadata


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)
