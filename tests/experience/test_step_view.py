"""The step view model: every step kind, every importer's output, diffs, call links, the context lens, the index."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from experience.importers import REGISTRY, detect_format, iter_records
from experience.records import MessageRecord, StepRecord
from experience.steps_view import (
    EDIT,
    FAILED,
    OUTPUT_CHARS,
    CallTokens,
    LinkRow,
    attach_links,
    attach_message_tokens,
    call_tokens,
    context_lens,
    diff_view,
    link_tool_calls,
    step_index,
    step_view,
)
from tests.shared_paths import FIXTURES_DIR

SAMPLES = Path(__file__).parent / "importers" / "samples"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py", "n": 3}'}}


# ---------------------------------------------------------------- each kind


def test_a_model_call_shows_its_response_tool_calls_reasoning_tokens_and_latency():
    view = step_view(StepRecord(kind="model_call", response_text="", tool_calls=[CALL], text="think first",
                                tokens_in=120, tokens_out=9, latency_ms=812.5, started_at=T0,
                                ended_at=T0 + timedelta(milliseconds=900), payload={"finish_reason": "tool_calls"},
                                request_messages=[MessageRecord(role="user", content="hi")]), seq=3, step_id=30)
    assert view["tool_calls"] == [{"id": "call_1", "name": "read_file", "arguments": '{\n  "path": "a.py",\n  "n": 3\n}'}]
    assert view["reasoning"] == "think first" and view["response"] == ""
    assert (view["tokens_in"], view["tokens_out"], view["latency_ms"]) == (120, 9, 812.5)
    assert view["duration_ms"] == 900.0  # from the two timestamps, as imports store them
    assert view["stop_reason"] == "tool_calls" and view["n_context"] == 1
    assert view["title"] == "read_file()" and view["failed"] is False


def test_a_tool_call_shows_name_and_pretty_arguments():
    view = step_view(StepRecord(kind="tool_call", tool_calls=[CALL], payload={"tool": "read_file", "tool_call_id": "call_1"}), seq=0)
    assert view["tool_calls"][0]["name"] == "read_file"
    assert json.loads(view["tool_calls"][0]["arguments"]) == {"path": "a.py", "n": 3}


def test_a_tool_call_known_by_name_only_still_shows_the_name():
    view = step_view(StepRecord(kind="tool_call", text="ls", payload={"tool": "bash", "tool_call_id": "c9"}), seq=0)
    assert view["tool_calls"] == [{"id": "c9", "name": "bash", "arguments": "ls"}]


@pytest.mark.parametrize(("code", "failed"), [(0, False), (1, True), (100, True), (-9, True), (None, False)])
def test_a_command_fails_on_any_nonzero_exit(code, failed):
    view = step_view(StepRecord(kind="command", command="make", output="x", exit_code=code, duration_ms=12.0), seq=1)
    assert view["failed"] is failed and view["command"] == "make" and view["duration_ms"] == 12.0
    assert view.get("exit_code") == code


def test_a_long_output_is_cut_in_pages_and_whole_on_request():
    long = "line\n" * 10_000
    view = step_view(StepRecord(kind="command", command="yes", output=long), seq=1)
    assert len(view["output"]) == OUTPUT_CHARS and view["output_chars"] == len(long)
    assert step_view(StepRecord(kind="command", command="yes", output=long), seq=1, full_output=True)["output"] == long


def test_a_result_names_the_call_it_answers():
    view = step_view(StepRecord(kind="observation", text="ok", payload={"tool_call_id": "call_1", "tool": "t"}), seq=2)
    assert view["result_of"] == "call_1" and view["text"] == "ok"


def test_an_inspect_score_shows_value_target_verdict_and_explanation():
    record = StepRecord(kind="eval", text="The answer names the capital.",
                        payload={"value": "I", "reward": 0.0, "target": ["Paris"], "answer": "Lyon"})
    view = step_view(record, seq=9)
    assert view["score"] == {"value": "I", "reward": 0.0, "target": "Paris", "answer": "Lyon", "passed": False,
                             "explanation": "The answer names the capital."}
    assert view["failed"] is True and view["title"] == "failed: I"
    assert "command" not in view  # never "$ None"


def test_an_inspect_score_without_explanation_does_not_repeat_the_answer():
    view = step_view(StepRecord(kind="eval", text="42", payload={"value": "C", "reward": 1.0, "answer": "42"}), seq=1)
    assert view["score"]["passed"] is True and "explanation" not in view["score"]


def test_a_trove_evaluation_shows_its_command_exit_and_verdict():
    record = StepRecord(kind="eval", command="pytest -q", output="1 failed", exit_code=1, text="evaluation failed (exit 1); reward 0.0",
                        payload={"reward": 0.0})
    view = step_view(record, seq=4)
    assert view["command"] == "pytest -q" and view["exit_code"] == 1 and view["score"]["passed"] is False


def test_an_openhands_verdict_reads_success():
    view = step_view(StepRecord(kind="eval", text="resolved", payload={"success": True}), seq=1)
    assert view["score"] == {"passed": True, "explanation": "resolved"}


def test_a_file_change_is_a_diff_by_file():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1,2 @@\n-a\n+b\n+c"
    view = step_view(StepRecord(kind="file_change", text=diff, output="edited", payload={"path": "x.py"}), seq=5)
    assert view["diff"]["files"] == [{"path": "x.py", "text": diff, "added": 2, "removed": 1}]
    assert view["title"] == "edit x.py"


@pytest.mark.parametrize("kind", ["message", "note", "sandbox_event"])
def test_other_kinds_keep_their_text(kind):
    view = step_view(StepRecord(kind=kind, text="hello", payload={"role": "user"}), seq=0)
    assert "hello" in (view.get("text") or view.get("action"))


def test_every_view_is_json():
    for kind in ("model_call", "tool_call", "command", "observation", "file_change", "eval", "message", "note",
                 "sandbox_event"):
        json.dumps(step_view(StepRecord(kind=kind, started_at=T0), seq=0))


# ---------------------------------------------------------------- diffs


def test_build_artefacts_are_left_out_of_a_diff():
    diff = ("diff --git a/src/m.py b/src/m.py\n--- a/src/m.py\n+++ b/src/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
            "diff --git a/src/__pycache__/m.cpython-311.pyc b/src/__pycache__/m.cpython-311.pyc\n"
            "Binary files a/src/__pycache__/m.cpython-311.pyc and b/src/__pycache__/m.cpython-311.pyc differ\n"
            "diff --git a/old.pyc b/old.pyc\nBinary files a/old.pyc and b/old.pyc differ\n")
    view = diff_view(diff)
    assert [f["path"] for f in view["files"]] == ["src/m.py"]
    assert view["omitted"] == ["src/__pycache__/m.cpython-311.pyc", "old.pyc"]
    assert (view["files"][0]["added"], view["files"][0]["removed"]) == (1, 1)


def test_a_removed_line_starting_with_dashes_stays_in_its_hunk():
    diff = "--- a/n.md\n+++ b/n.md\n@@ -1,2 +1,1 @@\n--- a rule\n keep\n--- a/o.md\n+++ b/o.md\n@@ -1 +1 @@\n-p\n+q"
    assert [f["path"] for f in diff_view(diff)["files"]] == ["n.md", "o.md"]


# ---------------------------------------------------------------- links


def test_calls_and_results_are_linked_both_ways():
    links = link_tool_calls([LinkRow(1, "model_call", tool_calls=[CALL]), LinkRow(2, "tool_call", "call_1", [CALL]),
                             LinkRow(3, "observation", "call_1")])
    assert links == {"call_1": {"call": 2, "result": 3}}
    views = [{"tool_calls": [{"id": "call_1", "name": "read_file"}]}, {"result_of": "call_1"}]
    attach_links(views, links)
    assert views[0]["tool_calls"][0]["result_seq"] == 3 and views[1]["call_seq"] == 2


def test_a_call_on_a_model_call_alone_links_there():
    links = link_tool_calls([LinkRow(4, "model_call", tool_calls=[CALL]), LinkRow(5, "command", "call_1")])
    assert links == {"call_1": {"call": 4, "result": 5}}


# ---------------------------------------------------------------- the context lens


def _m(role: str, content: str) -> MessageRecord:
    return MessageRecord(role=role, content=content)


def test_the_lens_shows_exactly_the_messages_added_since_the_previous_call():
    before = [_m("system", "s"), _m("user", "u")]
    after = [*before, _m("assistant", "a"), _m("tool", "t")]
    lens = context_lens(before, after)
    assert lens["unchanged"] == 2 and lens["rewrites"] == []
    assert [(m["index"], m["content"]) for m in lens["new"]] == [(2, "a"), (3, "t")]


def test_the_first_call_sees_everything_new():
    lens = context_lens(None, [_m("user", "u")])
    assert lens["first"] and lens["new"][0]["content"] == "u"


@pytest.mark.parametrize(("after", "kind"), [
    ([_m("system", "s"), _m("user", "u2"), _m("assistant", "a"), _m("tool", "x")], "dropped"),
    ([_m("system", "s"), _m("user", "u"), _m("user", "u2 edited"), _m("assistant", "a"), _m("tool", "x")], "edited"),
    ([_m("system", "s"), _m("user", "u"), _m("user", "u2"), _m("system", "reminder"), _m("assistant", "a"), _m("tool", "x")],
     "system_reminder"),
    ([_m("system", "s"), _m("user", "summary of earlier work"), _m("assistant", "a"), _m("tool", "x")], "compacted"),
])
def test_the_lens_says_how_history_was_rewritten(after, kind):
    before = [_m("system", "s"), _m("user", "u"), _m("user", "u2"), _m("assistant", "a")]
    lens = context_lens(before, after)
    assert [r["kind"] for r in lens["rewrites"]] == [kind]
    assert lens["rewrites"][0]["diff"].startswith("--- previous call\n+++ this call")
    assert [m["content"] for m in lens["new"]] == ["x"]


def _lens_with_tokens(before, after, previous: CallTokens | None, current: CallTokens) -> dict:
    lens = context_lens(before, after)
    attach_message_tokens(lens, after, previous, current)
    return lens


def test_a_lone_new_message_gets_the_exact_prompt_token_delta():
    before = [_m("system", "s"), _m("user", "u")]
    lens = _lens_with_tokens(before, [*before, _m("tool", "output")], CallTokens(40, 7, "usage"), CallTokens(95, 3, "usage"))
    assert lens["new"][0]["tokens"] == 55 and lens["new"][0]["tokens_estimated"] is False
    assert lens["new_tokens"] == 55 and lens["unchanged_tokens"] == 40 and lens["tokens_source"] == "usage"


def test_the_previous_reply_gets_its_completion_tokens_and_the_rest_is_shared_by_characters():
    before = [_m("system", "s"), _m("user", "u")]
    after = [*before, _m("assistant", "a reply"), _m("tool", "x" * 30), _m("user", "y" * 10)]
    lens = _lens_with_tokens(before, after, CallTokens(40, 12, "usage"), CallTokens(100, 3, "usage"))
    assert [m["tokens"] for m in lens["new"]] == [12, 36, 12]  # 48 left, shared 30:10
    assert all(m["tokens_estimated"] for m in lens["new"]) and lens["new_tokens_estimated"] is False
    assert sum(m["tokens"] for m in lens["new"]) == lens["new_tokens"] == 60


def test_token_ids_count_before_usage():
    record = StepRecord(kind="model_call", tokens_in=999, tokens_out=999,
                        payload={"prompt_token_ids": list(range(30)), "token_ids": [1, 2, 3, 4]})
    assert call_tokens(record) == CallTokens(30, 4, "token ids")
    assert call_tokens(StepRecord(kind="model_call", tokens_in=8, tokens_out=2)) == CallTokens(8, 2, "usage")
    assert call_tokens(StepRecord(kind="model_call")) == CallTokens(None, None, None)


def test_after_a_rewrite_the_new_block_is_estimated_by_characters():
    before = [_m("system", "s" * 10), _m("user", "u" * 10)]
    after = [_m("system", "s" * 10), _m("system", "r" * 10), _m("user", "u" * 10), _m("tool", "t" * 20)]
    lens = _lens_with_tokens(before, after, CallTokens(20, 1, "usage"), CallTokens(100, 1, "usage"))
    assert lens["rewrites"] and [m["content"] for m in lens["new"]] == ["t" * 20]
    assert lens["new"][0] == {**lens["new"][0], "tokens": 40, "tokens_estimated": True}  # 20 of 50 characters
    assert "unchanged_tokens" not in lens


def test_without_a_prompt_count_no_message_gets_a_number():
    before = [_m("user", "u")]
    lens = _lens_with_tokens(before, [*before, _m("tool", "t")], CallTokens(10, 1, "usage"), CallTokens(None, None, None))
    assert "tokens" not in lens["new"][0] and "new_tokens" not in lens


def test_the_first_calls_prompt_is_shared_over_its_messages():
    lens = _lens_with_tokens(None, [_m("system", "s" * 30), _m("user", "u" * 10)], None, CallTokens(41, 2, "token ids"))
    assert [m["tokens"] for m in lens["new"]] == [31, 10] and lens["new_tokens"] == 41
    assert lens["tokens_source"] == "token ids"


# ---------------------------------------------------------------- the index


def test_the_index_marks_failures_edits_and_evaluations():
    t0 = T0.timestamp() * 1000
    rows = [
        (0, "model_call", t0, 1000.0, False, None, 0.4, None, None, None),
        (1, "tool_call", None, None, False, None, None, "str_replace_editor", None, None),
        (2, "command", t0 + 2000, 50.0, False, 2, 0.2, None, None, None),
        (3, "eval", t0 + 3000, None, False, None, None, None, None, "I"),
        (4, "eval", t0 + 4000, None, False, None, None, None, True, None),
    ]
    index = step_index(rows)
    assert index["seq"] == [0, 1, 2, 3, 4] and index["timed"] is True
    assert index["start"] == [0.0, None, 2000.0, 3000.0, 4000.0] and index["dur"] == [1000.0, None, 50.0, None, None]
    assert index["flags"] == [0, EDIT, FAILED, FAILED, 0]
    assert index["marks"] == {"first_error": 2, "first_edit": 1, "evals": [3, 4]}
    assert index["value"] == [0.4, None, 0.2, None, None]


def test_an_untimed_run_says_so():
    index = step_index([(0, "message", None, None, False, None, None, None, None, None)])
    assert index["timed"] is False and index["value"] is None


# ---------------------------------------------------------------- every importer's output


def _fixture_files() -> list[Path]:
    roots = [FIXTURES_DIR, SAMPLES]
    files = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix not in (".md", ".py", ".txt") and not path.name.startswith("."):
                files.append(path)
    return files


def _importable() -> dict[str, list[Path]]:
    by_format: dict[str, list[Path]] = {}
    for path in _fixture_files():
        try:
            by_format.setdefault(detect_format(path), []).append(path)
        except Exception:  # noqa: BLE001  # a file that is not a trajectory (a README, predictions)
            continue
    return by_format


BY_FORMAT = _importable()


def test_the_fixtures_cover_every_importer_but_trove_exports():
    assert set(REGISTRY) - set(BY_FORMAT) <= {"trove"}


@pytest.mark.parametrize("fmt", sorted(BY_FORMAT))
def test_every_step_of_every_importer_has_a_view(fmt):
    kinds_seen = set()
    for path in BY_FORMAT[fmt][:6]:
        for record in iter_records(path):
            for seq, step in enumerate(record.steps):
                view = step_view(step, seq=seq)
                json.dumps(view)
                kinds_seen.add(step.kind)
                _assert_shows_what_was_stored(step, view)
    assert kinds_seen


def _assert_shows_what_was_stored(step: StepRecord, view: dict) -> None:
    if step.tool_calls and step.kind in ("model_call", "tool_call"):
        names = [c["name"] for c in view["tool_calls"]]
        assert all(names) and len(names) == len(step.tool_calls)
    if step.kind == "model_call" and step.response_text:
        assert view["response"] == step.response_text
    if step.kind == "command":
        assert view["command"] == (step.command if step.command is not None else step.text)
        assert view["failed"] == bool(step.is_error or (step.exit_code not in (None, 0)))
    if step.kind == "eval":
        assert "score" in view and not view["title"].startswith("$ None")
        if step.text and step.text != str(step.payload.get("answer")):
            assert view["score"]["explanation"] == step.text
    if step.payload.get("tool_call_id") and step.kind in ("command", "observation", "file_change"):
        assert view["result_of"] == str(step.payload["tool_call_id"])


def test_a_diff_of_two_patches_colours_the_patches_lines_as_changes():
    from experience.steps_view import diff_lines

    nested = "--- run A's patch\n+++ run B's patch\n@@ -1,2 +1,2 @@\n---- a/x.py\n+--- b/x.py\n ctx"
    assert [cls for cls, _ in diff_lines(nested, nested=True)] == ["file", "file", "hunk", "del", "add", "ctx"]
    assert [cls for cls, _ in diff_lines("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b")] == ["file", "file", "hunk", "del", "add"]
