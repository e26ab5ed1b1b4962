"""A JSONL of 10,000 runs is read one line at a time, never whole."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from experience.importers import ImportFormatError, iter_records, validate_file

RUNS = 10_000


def write_runs(path: Path, *, corrupt_last: bool = False) -> None:
    with open(path, "w") as handle:
        for index in range(RUNS):
            line = json.dumps(
                {
                    "task_id": f"task-{index % 50}",
                    "id": f"run-{index}",
                    "reward": float(index % 2),
                    "messages": [
                        {"role": "user", "content": f"Count the files in /data/{index}. " + "context " * 40},
                        {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [
                                {
                                    "id": f"c{index}",
                                    "type": "function",
                                    "function": {
                                        "name": "bash",
                                        "arguments": json.dumps({"command": f"ls /data/{index} | wc -l"}),
                                    },
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": f"c{index}", "content": str(index % 97)},
                        {"role": "assistant", "content": f"There are {index % 97} files."},
                    ],
                }
            )
            handle.write((line[: len(line) // 2] if corrupt_last and index == RUNS - 1 else line) + "\n")


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "runs.jsonl"
    write_runs(path)
    return path


def test_all_ten_thousand_runs_are_read_with_stable_refs(big_file: Path) -> None:
    refs = [r.source_ref for r in iter_records(big_file, name="runs.jsonl")]
    assert len(refs) == len(set(refs)) == RUNS
    assert refs[0] == "openai-messages:runs.jsonl#run-0" and refs[-1] == "openai-messages:runs.jsonl#run-9999"


def test_reading_keeps_one_run_in_memory_at_a_time(big_file: Path) -> None:
    tracemalloc.start()
    try:
        commands = sum(1 for r in iter_records(big_file) for s in r.steps if s.kind == "command")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert commands == RUNS
    # holding the file whole takes at least its size (parsed, several times that: 45 MB here); a stream
    # keeps one run plus the set of refs seen, which guards against repeated ids within the file
    print(f"file {big_file.stat().st_size / 1e6:.1f} MB, peak while streaming {peak / 1e6:.2f} MB")
    assert peak < big_file.stat().st_size / 2


def test_a_fault_on_the_last_line_is_found_only_when_reached(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_runs(path, corrupt_last=True)
    assert next(iter_records(path)).source_ref.endswith("#run-0")
    with pytest.raises(ImportFormatError) as caught:
        validate_file(path)
    assert caught.value.line == RUNS
    assert str(caught.value).startswith(f"runs.jsonl line {RUNS}: invalid JSON")
