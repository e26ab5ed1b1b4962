"""Anthropic's Claude Code: speaks Anthropic Messages (streamed, `POST /v1/messages?beta=true`, one `HEAD /`
first), so the proxy serves /v1/messages; ANTHROPIC_BASE_URL is the proxy root (the client adds /v1).

CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC removes a title call and lookups of its vendor's host;
DISABLE_AUTOUPDATER and the telemetry switches keep it offline. IS_SANDBOX lets
--dangerously-skip-permissions run as root (harmless as the sandbox's uid 1000). Its config and temp
directories must be writable.

The trap it is judged for: with a read-only HOME or /tmp it exits 0 with a result of "done" while its Bash
tool failed (EROFS), or (HOME not writable, measured with 2.1.197) while keeping no session at all. So the
exit code is not trusted: its JSON result must not be an error, its session log must exist, and no tool
result in it may be an environment failure. (With its temp directory read-only it never calls the model and
hangs to the wall time: the no-model-call rule makes that infra_error.)
Native log: $CLAUDE_CONFIG_DIR/projects/<cwd>/<session>.jsonl.
"""

from __future__ import annotations

import json
import re

from workers.harness.presets.base import PROMPT, HarnessRun, Package, Preset

# A tool that could not run at all because the sandbox refused it something, not because the task's
# command failed: what Claude Code's Bash tool reports when its own files cannot be written.
BUDGET_SUBTYPES = frozenset({"error_max_turns"})
ENVIRONMENT_FAILURE = re.compile(r"EROFS|read-only file system|EACCES: permission denied, (mkdir|open)", re.I)


def judge(run: HarnessRun) -> str | None:
    verdict = _result_error(run.stdout)
    if verdict:
        return verdict
    if not any(_is_session_log(path) for path in run.native_logs):
        # Measured with the 2.1 bundle: given a HOME (so a config directory) it cannot write, it still runs
        # its tools, exits 0 and reports success, but keeps no session, so its tool results cannot be checked.
        return ("it wrote no session log ($CLAUDE_CONFIG_DIR/projects/*/<session>.jsonl): its HOME or config "
                "directory was not writable, so whether its own tools ran cannot be checked")
    for path, content in sorted(run.native_logs.items()):
        failure = _failed_tool(content)
        if failure:
            return f"a tool of the harness could not run ({path}): {failure}"
    return None


def _is_session_log(path: str) -> bool:
    return "/projects/" in path and path.endswith(".jsonl")


def _result_error(stdout: str) -> str | None:
    """`--output-format json` prints one result object; is_error (or no result at all) is a failure."""
    result = _last_json_object(stdout)
    if result is None:
        return "no JSON result on its stdout"
    if result.get("subtype") in BUDGET_SUBTYPES:
        return None  # it used up the job's turns: the agent's failure to finish, a fair outcome
    if result.get("is_error") or result.get("subtype") not in (None, "success"):
        return f"its result is an error: {str(result.get('result') or result.get('subtype'))[:300]}"
    return None


def _last_json_object(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _failed_tool(content: bytes) -> str | None:
    for line in content.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        for block in _tool_results(entry):
            text = json.dumps(block.get("content"))
            if ENVIRONMENT_FAILURE.search(text):
                return text[:300]
    return None


def _tool_results(entry: object) -> list[dict]:
    message = entry.get("message") if isinstance(entry, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_result"]


PRESET = Preset(
    name="claude-code",
    title="Claude Code",
    package=Package("npm", "@anthropic-ai/claude-code", "2.1.197"),
    protocol="messages",
    executable="node_modules/@anthropic-ai/claude-code/bin/claude.exe",  # the native binary, no node needed
    argv=("-p", PROMPT, "--dangerously-skip-permissions", "--output-format", "json", "--max-turns", "$max_steps"),
    env={"ANTHROPIC_BASE_URL": "$proxy", "ANTHROPIC_API_KEY": "$api_key", "ANTHROPIC_MODEL": "$model",
         "ANTHROPIC_SMALL_FAST_MODEL": "$model", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
         "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
         "IS_SANDBOX": "1", "CLAUDE_CONFIG_DIR": "$home/.claude", "CLAUDE_CODE_TMPDIR": "$tmp", "TMPDIR": "$tmp"},
    writable_dirs=("$home/.claude",),
    native_logs=(".claude/projects/**/*.jsonl",),
    judge=judge,
    ok_exit_codes=frozenset({0, 1}),  # 1 when it ran out of turns: the JSON result tells (judge)
    notes="Anthropic Messages only. Exits 0 even when its own tools failed (read-only HOME): judged by its "
          "JSON result and its session log's tool results.",
)
