"""The built-in harness's reply parser and observation format, on hand-written inputs."""

from __future__ import annotations

import pytest

from workers.harness.builtin import FINISH_MARKER, format_observation, parse_reply
from workers.sandboxes.base import ExecResult


@pytest.mark.parametrize(
    ("reply", "command"),
    [
        ("Let me look.\n\n```bash\nls -la\n```", "ls -la"),
        ("```sh\ncat a.py\n```", "cat a.py"),
        ("```\npython3 -m unittest -q\n```", "python3 -m unittest -q"),
        ("```shell\nls\n```\ntrailing words", "ls"),
        ("  ```bash\n  grep -n x a.py\n  ```", "  grep -n x a.py"),
        ("```bash\npython3 - <<'EOF'\nprint(1)\nEOF\n```", "python3 - <<'EOF'\nprint(1)\nEOF"),
        ("I'll submit with TROVE_SUBMIT after this.\n```bash\nls\n```", "ls"),
        ("```bash\necho TROVE_SUBMIT > note.txt\n```", "echo TROVE_SUBMIT > note.txt"),
        ("Cut off mid-reply:\n```bash\nls -R", "ls -R"),
    ],
)
def test_a_reply_with_one_command_block_yields_that_command(reply, command):
    parsed = parse_reply(reply)
    assert (parsed.kind, parsed.command, parsed.command_blocks) == ("command", command, 1)


def test_with_several_command_blocks_the_first_runs_and_the_count_is_kept():
    parsed = parse_reply("First:\n```bash\nls\n```\nthen\n```bash\ncat a.py\n```")
    assert (parsed.kind, parsed.command, parsed.command_blocks) == ("command", "ls", 2)


def test_blocks_in_other_languages_are_not_commands():
    parsed = parse_reply("The fix:\n```python\nx = 1\n```\n```diff\n-a\n+b\n```\n```bash\nls\n```")
    assert (parsed.kind, parsed.command, parsed.command_blocks) == ("command", "ls", 1)


@pytest.mark.parametrize(
    "reply",
    [
        f"All tests pass.\n\n{FINISH_MARKER}",
        f"  {FINISH_MARKER}  ",
        "Done.\n```submit\n```",
        f"```bash\n{FINISH_MARKER}\n```",
        f"```bash\npython3 -m unittest\n```\n{FINISH_MARKER}",
    ],
)
def test_the_finish_marker_submits_even_beside_a_command(reply):
    assert parse_reply(reply).kind == "submit"


@pytest.mark.parametrize(
    "reply",
    [
        "I think the bug is in merge().",
        "Here is the fix:\n```python\nreturn max(a, b)\n```",
        "```bash\n\n```",
        "",
        f"When I'm done I will say {FINISH_MARKER}.",
    ],
)
def test_a_reply_without_a_command_or_marker_is_none(reply):
    assert parse_reply(reply).kind == "none"


def _result(stdout="", stderr="", **kw) -> ExecResult:
    kw.setdefault("exit_code", 0)
    kw.setdefault("duration_ms", 12.0)
    return ExecResult(stdout=stdout, stderr=stderr, **kw)


def test_a_short_observation_holds_exit_code_and_both_streams_whole():
    text = format_observation(_result("out line\n", "err line\n", exit_code=2))
    assert text == "exit code: 2\n--- stdout ---\nout line\n\n--- stderr ---\nerr line\n"


def test_a_long_stream_is_cut_in_the_middle_and_says_how_much():
    stdout = "HEAD" + "x" * 50_000 + "TAIL"
    text = format_observation(_result(stdout, "short error"), max_chars=1000)

    assert text.startswith("exit code: 0\n--- stdout ---\nHEAD")
    assert "TAIL\n--- stderr ---\nshort error" in text
    assert (
        f"[... {len(stdout) - (1000 - len('short error'))} of {len(stdout)} characters cut here ...]" in text
    )
    assert len(text) < 1200


def test_two_long_streams_share_the_budget():
    text = format_observation(_result("Q" * 5000, "Z" * 5000), max_chars=1000)
    assert text.count("Q") == 500 and text.count("Z") == 500
    assert text.count("[... 4500 of 5000 characters cut here ...]") == 2


def test_timeouts_silence_and_sandbox_cuts_are_reported():
    text = format_observation(
        _result(
            exit_code=None, timed_out=True, idle_timed_out=True, truncated_bytes=4096, duration_ms=30_000.0
        )
    )
    assert "exit code: none (killed)" in text
    assert "timed out after 30.0s" in text
    assert "no output for too long" in text
    assert "(no output)" in text
    assert "4096 bytes" in text
