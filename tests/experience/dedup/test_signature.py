from __future__ import annotations

import json

from experience.dedup.signature import (
    action_sequence,
    diff_essence,
    exact_hash,
    normalise_action,
    signature_text,
)
from experience.records import StepRecord, TrajectoryRecord

from .conftest import MARSHMALLOW_TASK

DIFF = """diff --git a/src/app.py b/src/app.py
index 1a2b3c4..5d6e7f8 100644
--- a/src/app.py
+++ b/src/app.py
@@ -10,7 +10,7 @@ def main():
     unchanged context line
-    return value
+    return round(value)
"""


def run(*commands: str, task: str = "repo__issue-1", **fields) -> TrajectoryRecord:
    steps = [
        StepRecord(kind="command", command=command, output=f"output of {command}") for command in commands
    ]
    return TrajectoryRecord(
        source="import", source_format="test", source_ref="t", task_key=task, steps=steps, **fields
    )


def test_the_same_actions_under_different_temp_dirs_hash_the_same():
    first = run("cd /tmp/tmpa81kq2/repo && pytest -x", "cat /tmp/tmpa81kq2/out.log")
    second = run("cd /tmp/tmpzz09xy/repo && pytest -x", "cat /tmp/tmpzz09xy/out.log")

    assert action_sequence(first) == ["cd <TMP>/repo && pytest -x", "cat <TMP>/out.log"]
    assert exact_hash(first) == exact_hash(second)


def test_whitespace_quotes_ids_and_line_ranges_do_not_change_the_hash():
    first = run(
        'open "src/marshmallow/fields.py" 1474',
        "edit 1475:1475\n        return int(round(x))\nend_of_edit\n",
        "git show 3f9c2a1d8e",
        "sed -n 10,20p setup.py",
        "docker logs 123e4567-e89b-12d3-a456-426614174000",
    )
    second = run(
        "open src/marshmallow/fields.py 1480",
        "edit 1476:1477\r\nreturn   int(round(x))\r\nend_of_edit",
        "git show 77aa01bc99",
        "sed -n 30,45p setup.py",
        "docker logs 00000000-1111-2222-3333-444455556666",
    )

    assert exact_hash(first) == exact_hash(second)
    assert action_sequence(first)[1] == "edit <N>:<N> return int(round(x)) end_of_edit"


def test_home_directories_and_grep_line_references_are_normalised():
    assert normalise_action("vim /home/alice/proj/a.py:120") == "vim ~/proj/a.py:<N>"
    assert normalise_action("ls /root/.cache") == "ls ~/.cache"
    assert normalise_action("head -n 40 log.txt") == "head -n <N> log.txt"


def test_numbers_that_are_answers_or_code_are_kept():
    assert exact_hash(run("submit 125379498")) != exact_hash(run("submit 125379499"))
    assert normalise_action("python -c 'print(2 + 40)'") == "python -c 'print(2 + 40)'"
    assert normalise_action("echo deadbeef") == "echo deadbeef"  # a word, not an id: no digit in it
    assert normalise_action('f(precision="ms")') == 'f(precision="ms")'  # quotes inside code stay


def test_observations_thoughts_and_model_calls_do_not_change_the_hash():
    plain = run("ls -F", "python reproduce.py")
    chatty = run("ls -F", "python reproduce.py")
    chatty.steps[0].output = "something else entirely"
    chatty.steps.insert(0, StepRecord(kind="model_call", text="Let me look around", response_text="ls"))
    chatty.steps.append(StepRecord(kind="observation", text="Traceback ..."))

    assert exact_hash(plain) == exact_hash(chatty)


def test_a_different_action_or_another_task_changes_the_hash():
    base = run("ls -F", "python reproduce.py")

    assert exact_hash(base) != exact_hash(run("ls -F", "python reproduce.py", "rm reproduce.py"))
    assert exact_hash(base) != exact_hash(run("python reproduce.py", "ls -F"))  # order matters
    assert exact_hash(base) != exact_hash(run("ls -F", "python reproduce.py", task="repo__issue-2"))


def test_tool_calls_are_normalised_with_sorted_arguments_and_line_positions_dropped():
    openai_call = {
        "id": "call_1",
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "arguments": json.dumps({"path": "/tmp/tmp9k2/a.py", "command": "view", "view_range": [1, 50]}),
        },
    }
    flat_call = {
        "name": "str_replace_editor",
        "input": {"view_range": [30, 80], "command": "view", "path": "/tmp/tmpq77/a.py"},
    }
    first = TrajectoryRecord(
        source="api",
        source_format="t",
        source_ref="1",
        task_key="t",
        steps=[StepRecord(kind="tool_call", tool_calls=[openai_call])],
    )
    second = TrajectoryRecord(
        source="api",
        source_format="t",
        source_ref="2",
        task_key="t",
        steps=[StepRecord(kind="tool_call", tool_calls=[flat_call])],
    )

    assert action_sequence(first) == ["str_replace_editor command=view path=<TMP>/a.py view_range=<N>"]
    assert exact_hash(first) == exact_hash(second)


def test_tool_calls_inside_model_calls_count_only_when_a_run_has_no_action_steps():
    call = {"function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    proxy_only = TrajectoryRecord(
        source="rollout",
        source_format="t",
        source_ref="p",
        task_key="t",
        steps=[StepRecord(kind="model_call", tool_calls=[call])],
    )
    with_commands = TrajectoryRecord(
        source="rollout",
        source_format="t",
        source_ref="c",
        task_key="t",
        steps=[StepRecord(kind="model_call", tool_calls=[call]), StepRecord(kind="command", command="ls")],
    )

    assert action_sequence(proxy_only) == ["bash command=ls"]
    assert action_sequence(with_commands) == ["ls"]


def test_signature_text_holds_task_head_actions_and_changed_lines_but_no_observations():
    record = run(
        "ls -F", "python reproduce.py", instruction="Fix the rounding of TimeDelta. " * 20, final_diff=DIFF
    )

    text = signature_text(record)

    assert text.startswith("task: repo__issue-1\nFix the rounding of TimeDelta.")
    assert "1. ls -F\n2. python reproduce.py" in text
    assert "-return value\n+return round(value)" in text
    assert "output of" not in text
    assert "unchanged context line" not in text and "index 1a2b3c4" not in text
    head = text.split("\n")[1]
    assert len(head) == 200


def test_signature_text_fits_max_chars_and_keeps_the_diff_after_many_actions():
    record = run(*[f"grep -rn symbol_{i} src/" for i in range(500)], final_diff=DIFF)

    text = signature_text(record, max_chars=1200)

    assert len(text) <= 1200
    assert "+return round(value)" in text
    assert "1. grep -rn symbol_0 src/" in text


def test_a_submission_that_is_not_a_diff_is_kept_whole():
    assert list(diff_essence("\nflag{b3l0w_th3_r4dar}\n")) == ["flag{b3l0w_th3_r4dar}"]


def test_marshmallow_runs_that_differ_only_in_format_share_an_exact_hash(swe_agent_records):
    marshmallow = [record for record in swe_agent_records if record.task_key == MARSHMALLOW_TASK]
    by_config = {record.metadata["run_name"]: exact_hash(record) for record in marshmallow}

    plain = by_config[
        "replay__marshmallow-code__marshmallow-1867__default_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1"
    ]
    tool_calling = by_config["replay__marshmallow-code__marshmallow-1867__function_calling__install-1"]
    cursors = by_config[
        "replay__marshmallow-code__marshmallow-1867__default_sys-env_cursors_window100__t-0.20__p-0.95__c-2.00__install-1"
    ]
    assert len(marshmallow) == 8
    assert plain == tool_calling  # trailing newlines and quoting differ in the files, not the actions
    assert plain != cursors  # the cursor config issues an extra set_cursors action
