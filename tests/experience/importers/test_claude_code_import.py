"""Claude Code session transcripts (samples built to the JSONL lines Claude Code writes): split replies joined
by message.id, tool_use linked to tool_result by id, Bash as commands, thinking as reasoning, metadata,
subagents as linked runs, and what real files contain (control characters, Windows paths, a cut end)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experience.importers import ImportFormatError, detect_format, read_all
from importers.fixture_files import (
    CLAUDE_CODE_LOG,
    CLAUDE_SESSION,
    CLAUDE_SUBAGENT,
    CLAUDE_WINDOWS,
    raw_jsonl,
)

SESSION = "claude-code:7f3c2a10-5b1e-4c2d-9a8f-0e6d4b3c2a11"


def _lines(path: Path) -> list[dict]:
    return raw_jsonl(path)


def test_a_session_is_one_run_and_its_subagent_a_linked_run() -> None:
    main, subagent = read_all(CLAUDE_SESSION)
    assert (main.source_ref, subagent.source_ref) == (SESSION, f"{SESSION}/agent-a9e41c07")
    assert main.metadata["subagent_source_refs"] == [subagent.source_ref]
    assert subagent.metadata["parent_source_ref"] == SESSION
    task = next(s for s in main.steps if s.payload.get("tool") == "Task" and s.kind == "observation")
    assert task.payload["subagent_source_ref"] == subagent.source_ref


def test_a_subagent_file_on_its_own_is_the_same_run() -> None:
    [alone] = read_all(CLAUDE_SUBAGENT)
    from_parent = read_all(CLAUDE_SESSION)[1]
    assert alone.source_ref == from_parent.source_ref and alone.metadata["parent_source_ref"] == SESSION
    assert [(s.kind, s.command, s.output) for s in alone.steps] == [
        (s.kind, s.command, s.output) for s in from_parent.steps]


def test_lines_sharing_a_message_id_are_one_model_call_with_its_blocks_in_order() -> None:
    main = read_all(CLAUDE_SESSION)[0]
    lines = _lines(CLAUDE_SESSION)
    split = [ln["message"] for ln in lines if ln.get("message", {}).get("id") == "msg_01HxQ7d3"]
    first = next(s for s in main.steps if s.kind == "model_call")
    assert len(split) == 4 and first.payload["message_id"] == "msg_01HxQ7d3"
    assert first.text == split[0]["content"][0]["thinking"]
    assert first.response_text == split[1]["content"][0]["text"]
    assert [c["id"] for c in first.tool_calls] == ["toolu_01A", "toolu_01B"]
    assert [json.loads(c["function"]["arguments"]) for c in first.tool_calls] == [
        split[2]["content"][0]["input"], split[3]["content"][0]["input"]]
    usage = split[-1]["usage"]
    assert first.tokens_in == usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage[
        "cache_read_input_tokens"] and first.tokens_out == usage["output_tokens"]
    assert sum(1 for s in main.steps if s.kind == "model_call") == 4
    assert first.model == "claude-sonnet-4-5-20250929"


def test_tool_results_are_linked_by_id_and_kept_byte_for_byte() -> None:
    main = read_all(CLAUDE_SESSION)[0]
    results = {b["tool_use_id"]: b for ln in _lines(CLAUDE_SESSION) if ln.get("type") == "user"
               for b in ln["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"}
    bash = next(s for s in main.steps if s.kind == "command")
    assert (bash.command, bash.output, bash.is_error) == (
        "python -m pytest -q tests/", results["toolu_01B"]["content"], True)
    assert bash.payload == {"tool": "Bash", "tool_call_id": "toolu_01B", "description": "Run the tests"}
    read = next(s for s in main.steps if s.kind == "observation" and s.payload["tool_call_id"] == "toolu_01A")
    assert read.text == results["toolu_01A"]["content"] and read.payload["tool"] == "Read"
    task = next(s for s in main.steps if s.kind == "observation" and s.payload["tool_call_id"] == "toolu_01C")
    assert task.text == results["toolu_01C"]["content"][0]["text"]
    calls = [s for s in main.steps if s.kind == "model_call"]
    assert [m.role for m in calls[1].request_messages] == ["user", "assistant", "tool", "tool"]
    assert calls[1].request_messages[2].content == results["toolu_01A"]["content"]


def test_session_metadata_and_times() -> None:
    main = read_all(CLAUDE_SESSION)[0]
    assert (main.harness, main.source_version, main.model) == ("claude-code", "2.0.76", "claude-sonnet-4-5-20250929")
    assert {k: main.metadata[k] for k in ("cwd", "git_branch", "version", "summary")} == {
        "cwd": "/home/dev/calc", "git_branch": "fix-divide", "version": "2.0.76",
        "summary": "Fix divide-by-zero in calc.divide"}
    assert main.instruction.startswith("calc.divide(1, 0) crashes")
    assert main.started_at.isoformat() == "2025-11-03T09:14:02.101000+00:00"
    assert main.finished_at.isoformat() == "2025-11-03T09:14:46.845000+00:00"
    note = next(s for s in main.steps if s.kind == "note")
    assert note.text == "<command-name>/cost</command-name>" and note.payload == {"subtype": "local_command"}


def test_control_characters_windows_paths_and_an_interrupted_end_are_read() -> None:
    raw = CLAUDE_WINDOWS.read_bytes()
    assert b"\x07" in raw and b"\x1b" in raw  # the sample holds what strict JSON refuses
    [record] = read_all(CLAUDE_WINDOWS)
    first, second = [s for s in record.steps if s.kind == "command"]
    assert first.command == "dir C:\\Users\\dev\\proj\\src"
    assert first.output == "REDACTED\x07\x1b[31mtoken\x1b[0m main.py"
    assert second.output is None and second.payload["unanswered"] is True
    assert record.metadata["cwd"] == "C:\\Users\\dev\\proj"
    assert record.steps[-1].text == "[Request interrupted by user for tool use]"


def test_a_copy_under_another_folder_keeps_its_refs(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / CLAUDE_SESSION.name
    shutil.copytree(CLAUDE_SESSION.parent, copy.parent)
    assert detect_format(copy) == "claude_code"
    assert [r.source_ref for r in read_all(copy)] == [r.source_ref for r in read_all(CLAUDE_SESSION)]


def test_a_line_cut_short_is_refused_naming_it(tmp_path: Path) -> None:
    cut = tmp_path / CLAUDE_WINDOWS.name
    cut.write_bytes(CLAUDE_WINDOWS.read_bytes() + b'{"parentUuid":"w-5","type":"assistant","message":{"id":"m')
    with pytest.raises(ImportFormatError, match=r"line 6: invalid JSON .* truncated"):
        read_all(cut)


def test_another_projects_transcript_fixture_reads_with_its_agent_calls_linked() -> None:
    """daaain/claude-code-log's showcase session: several blocks per line, MCP tools, the Agent tool."""
    main, agent = read_all(CLAUDE_CODE_LOG)
    lines = _lines(CLAUDE_CODE_LOG)
    session = "claude-code:55550000-0000-4000-8000-000000000001"
    assert (main.source_ref, agent.source_ref) == (session, f"{session}/agent-showcol2")
    assert main.metadata["subagent_source_refs"] == [agent.source_ref]  # showcol1's transcript is not there
    results = [b for ln in lines if ln["type"] == "user" for b in ln["message"]["content"]
               if b.get("type") == "tool_result"]
    observations = [s for s in main.steps if s.kind == "observation"]
    assert [o.text for o in observations] == [
        r["content"] if isinstance(r["content"], str) else "\n".join(b["text"] for b in r["content"])
        for r in results]
    assert [o.payload.get("subagent_source_ref") for o in observations][-2:] == [
        f"{session}/agent-showcol1", f"{session}/agent-showcol2"]
    calls = [s for s in main.steps if s.kind == "model_call"]
    assert [c.response_text for c in calls] == [
        next((b["text"] for b in ln["message"]["content"] if b["type"] == "text"), "")
        for ln in lines if ln["type"] == "assistant"]
    assert [c["function"]["name"] for c in calls[3].tool_calls] == ["Agent", "Agent"]
    grep = next(s for s in agent.steps if s.kind == "observation")
    assert grep.text == _lines(CLAUDE_CODE_LOG.with_suffix("") / "subagents" / "agent-showcol2.jsonl")[2][
        "message"]["content"][0]["content"]


def test_an_assistant_reply_given_as_plain_text_is_its_reply(tmp_path: Path) -> None:
    lines = [{"parentUuid": None, "isSidechain": False, "type": "user", "uuid": "w-1", "sessionId": "s-text",
              "timestamp": "2025-07-21T18:02:11.000Z", "message": {"role": "user", "content": "hi"}}, {
        "parentUuid": "w-1", "isSidechain": False, "type": "assistant", "uuid": "w-9", "sessionId": "s-text",
        "timestamp": "2025-07-21T18:02:12.000Z",
        "message": {"id": "msg_err", "model": "<synthetic>", "role": "assistant", "content": "API Error: 529 overloaded"}}]
    path = tmp_path / "s-text.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    [record] = read_all(path)
    call = next(s for s in record.steps if s.kind == "model_call")
    assert call.response_text == "API Error: 529 overloaded"
    assert (record.model, record.metadata["models"]) == ("", [])  # "<synthetic>": Claude Code's own message
