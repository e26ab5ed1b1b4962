"""The harness catalogue as data: names and versions, each preset made concrete for a rollout (its script,
environment and config files pointed at the rollout's proxy in its protocol), and how a finished run is
judged. The end-to-end runs are in tests/integration/test_harness_presets.py."""

from __future__ import annotations

import json
import subprocess
import tomllib

import pytest

from workers.demo.tasks import get_demo_task
from workers.harness.external import INSTRUCTION_FILE, HarnessSetup, harness_script
from workers.harness.presets import CATALOGUE, UnknownHarness, canonical, claude_code, resolve
from workers.harness.presets.base import PROMPT, HarnessRun, Package, Preset
from workers.harness.presets.launch import HOME, collect_script, launch, read_collected, verdict

TOKEN = "tok-secret-123"
SETUP = HarnessSetup(base_url=f"http://127.0.0.1:18080/r/{TOKEN}/v1", model="policy-7", seed=3, max_steps=12)


def test_the_catalogue_holds_the_presets_the_issue_names_each_pinned():
    assert {"mini-swe-agent", "opencode", "codex", "claude-code", "qwen-code", "gemini-cli"} <= set(CATALOGUE)
    protocols = {name: preset.protocol for name, preset in CATALOGUE.items()}
    assert protocols == {"mini-swe-agent": "chat", "opencode": "chat", "codex": "responses",
                         "claude-code": "messages", "qwen-code": "chat", "gemini-cli": "gemini"}
    for preset in CATALOGUE.values():
        assert preset.package.version[0].isdigit(), f"{preset.name} pins a version"


def test_a_harness_name_resolves_to_its_pinned_version_or_the_one_asked_for():
    assert resolve("builtin") is None and resolve("external") is None
    assert resolve("codex") == (CATALOGUE["codex"], "0.171.0")
    assert resolve("claude-code@2.1.332") == (CATALOGUE["claude-code"], "2.1.332")
    assert canonical("opencode") == "opencode@1.18.33" and canonical("builtin") == "builtin"


@pytest.mark.parametrize("bad", ["aider", "codex@../../etc", "codex@1.0 ; rm -rf /", "", "codex@latest",
                                 "claude-code@next", "opencode@1.x", "codex@1", "codex@0.171", "qwen-code@^0.24.4",
                                 "mini-swe-agent@latest", "mini-swe-agent@2.*", "mini-swe-agent@>=2.4"])
def test_a_name_outside_the_catalogue_or_a_malformed_version_is_refused_naming_the_choices(bad):
    with pytest.raises(UnknownHarness) as refused:
        resolve(bad)
    assert "unknown harness" in str(refused.value) or "is not a version" in str(refused.value)
    if bad == "aider":
        assert "claude-code" in str(refused.value) and "external" in str(refused.value)


def test_a_tag_or_range_is_refused_because_it_names_no_one_release():
    # `latest` would install whatever the registry serves that day, and be recorded as "latest" on every run.
    with pytest.raises(UnknownHarness, match=r"'latest' is not a version: name an exact npm release \(as 0.171.0\)"):
        resolve("codex@latest")
    assert resolve("codex@0.172.0-alpha.3") == (CATALOGUE["codex"], "0.172.0-alpha.3")
    assert resolve("mini-swe-agent@2.4") == (CATALOGUE["mini-swe-agent"], "2.4")
    assert resolve("mini-swe-agent@2.5.0rc1") == (CATALOGUE["mini-swe-agent"], "2.5.0rc1")


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_preset_is_filled_in_completely_and_its_command_never_shows_the_token(name):
    run = launch(CATALOGUE[name], CATALOGUE[name].package.version, SETUP)

    assert "$" not in "".join(run.env.values()), "every placeholder filled"
    assert run.env["HOME"].startswith("/tmp/trove/") and not run.env["HOME"].startswith("/workspace")
    assert f'"$(cat {INSTRUCTION_FILE})"' in run.script, "the task reaches the harness as its prompt"
    assert any(" < /dev/null " in f" {line} " for line in run.script.splitlines()), "stdin closed: a harness must never wait on it"
    assert f"/opt/trove/bundles/{name}/{CATALOGUE[name].package.version}/" in run.script
    assert TOKEN not in run.display and "<instruction>" in run.display


def test_the_script_is_valid_bash_and_writes_each_config_file_as_declared(tmp_path):
    run = launch(CATALOGUE["codex"], "0.171.0", SETUP)
    script = harness_script(run.script, run.env).replace("/tmp/trove", str(tmp_path))
    checked = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def config_text(name: str, path_end: str) -> str:
    run = launch(CATALOGUE[name], CATALOGUE[name].package.version, SETUP)
    start = run.script.index(path_end)
    body = run.script[start:].split("<<'TROVE_CONFIG_EOF'\n", 1)[1]
    return body.split("\nTROVE_CONFIG_EOF", 1)[0]


def test_codex_is_pointed_at_the_proxy_by_a_custom_responses_provider_with_its_extras_off():
    config = tomllib.loads(config_text("codex", "config.toml"))

    assert config["model_provider"] == "trove" and config["model"] == "policy-7"
    assert config["model_providers"]["trove"] == {"name": "Trove recording proxy", "base_url": SETUP.base_url,
                                                  "env_key": "TROVE_PROXY_KEY", "wire_api": "responses"}
    assert config["check_for_update_on_startup"] is False and config["analytics"]["enabled"] is False
    assert not any(config["features"].values()), "plugins, apps and the rest off (they reach other hosts)"


def test_claude_code_gets_the_proxy_root_because_its_client_adds_v1_itself():
    env = launch(CATALOGUE["claude-code"], "2.1.197", SETUP).env

    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:18080/r/{TOKEN}"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["DISABLE_AUTOUPDATER"] == "1"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "policy-7"
    assert env["CLAUDE_CONFIG_DIR"].startswith(HOME) and env["CLAUDE_CODE_TMPDIR"].startswith("/tmp/trove/")


def test_opencode_uses_its_builtin_openai_compatible_provider_against_the_proxy():
    config = json.loads(config_text("opencode", "opencode.json"))

    provider = config["provider"]["trove"]
    assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == SETUP.base_url
    assert config["model"] == config["small_model"] == "trove/policy-7"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert launch(CATALOGUE["opencode"], "1.18.33", SETUP).env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def test_mini_swe_agent_takes_the_proxy_and_the_jobs_step_budget_on_its_command_line():
    run = launch(CATALOGUE["mini-swe-agent"], "2.4.6", SETUP)

    assert f"model.model_kwargs.api_base={SETUP.base_url}" in run.script
    assert "agent.step_limit=12" in run.script and "-m openai/policy-7" in run.script
    assert run.env["MSWEA_CONFIGURED"] == "true" and run.env["MSWEA_COST_TRACKING"] == "ignore_errors"


def test_a_preset_that_never_passes_the_task_is_refused_when_declared():
    with pytest.raises(ValueError, match="PROMPT"):
        Preset(name="x", title="x", package=Package("npm", "x", "1"), protocol="chat", executable="x", argv=("run",))
    with pytest.raises(ValueError, match="protocol"):
        Preset(name="x", title="x", package=Package("npm", "x", "1"), protocol="grpc", executable="x", argv=(PROMPT,))


# --- how a run is judged ---------------------------------------------------------------------------------

def run_of(**fields) -> HarnessRun:
    return HarnessRun(**{"exit_code": 0, "stdout": "", "stderr": "", "native_logs": {}, "model_calls": 3, **fields})


def test_a_harness_that_never_reached_the_model_is_not_the_agents_run_even_when_it_exits_0():
    assert "without one model call" in verdict(CATALOGUE["opencode"], run_of(model_calls=0))


def test_a_harness_that_exits_with_an_error_is_not_the_agents_run_but_a_wall_time_stop_is():
    assert "exited 2" in verdict(CATALOGUE["codex"], run_of(exit_code=2, stderr="stream disconnected"))
    assert verdict(CATALOGUE["codex"], run_of(exit_code=None), timed_out=True) is None
    assert verdict(CATALOGUE["codex"], run_of()) is None


CLAUDE_OK = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done"})


def session_line(content: str, *, is_error: bool) -> bytes:
    """One tool result in Claude Code's session JSONL, in the shape its 2.1 releases write."""
    return json.dumps({"type": "user", "message": {"role": "user", "content": [
        {"tool_use_id": "call_1", "type": "tool_result", "content": content, "is_error": is_error}]},
        "cwd": "/workspace"}).encode() + b"\n"


def test_claude_code_claiming_done_while_its_bash_tool_hit_a_read_only_filesystem_is_caught():
    log = session_line("EROFS: read-only file system, open '/tmp/claude-4f1c-cwd'", is_error=True)
    run = run_of(stdout=CLAUDE_OK, native_logs={"home/.claude/projects/-workspace/s.jsonl": log})

    failure = verdict(CATALOGUE["claude-code"], run)

    assert failure and "could not run" in failure and "EROFS" in failure


def test_claude_code_whose_task_commands_merely_failed_is_the_agents_run():
    log = session_line("Exit code 1\nFAILED (failures=1)", is_error=True)
    run = run_of(stdout=CLAUDE_OK, native_logs={"home/.claude/projects/-workspace/s.jsonl": log})

    assert verdict(CATALOGUE["claude-code"], run) is None


SESSION = {"home/.claude/projects/-workspace/s.jsonl": session_line("slugify.py", is_error=False)}


def test_claude_code_out_of_turns_is_a_fair_failure_but_an_error_result_or_none_is_not():
    max_turns = json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True})
    api_error = json.dumps({"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 500"})

    assert verdict(CATALOGUE["claude-code"], run_of(exit_code=1, stdout=max_turns, native_logs=SESSION)) is None
    assert "API Error" in verdict(CATALOGUE["claude-code"], run_of(stdout=api_error))
    assert "no JSON result" in claude_code.judge(run_of(stdout="Segmentation fault"))


def test_claude_code_claiming_success_without_a_session_log_is_not_the_agents_run():
    """What a HOME it cannot write leaves (the real bundle: tests/integration/test_harness_presets.py)."""
    assert verdict(CATALOGUE["claude-code"], run_of(stdout=CLAUDE_OK, native_logs=SESSION)) is None
    for logs in ({}, {"home/.claude/statsig/cache.json": b"{}"}):
        failure = verdict(CATALOGUE["claude-code"], run_of(stdout=CLAUDE_OK, native_logs=logs))
        assert failure and "no session log" in failure and "not writable" in failure


# --- native logs ---------------------------------------------------------------------------------------

def test_native_logs_are_collected_from_the_sandbox_as_declared_and_nothing_else(task_workspace):
    sandbox = task_workspace(get_demo_task("slugify"))
    sandbox("mkdir -p /tmp/trove/home/.claude/projects/-workspace /tmp/trove/logs /tmp/trove/home/.claude/x && "
            "printf '{\"a\":1}\\n' > /tmp/trove/home/.claude/projects/-workspace/s1.jsonl && "
            "echo traj > /tmp/trove/logs/trajectory.json && echo secret > /tmp/trove/home/.claude/x/creds.json")

    result = sandbox(collect_script(CATALOGUE["claude-code"]))
    files = read_collected(result.stdout)

    assert files == {"home/.claude/projects/-workspace/s1.jsonl": b'{"a":1}\n', "logs/trajectory.json": b"traj\n"}


def test_a_harness_that_left_no_log_collects_to_nothing(task_workspace):
    result = task_workspace(get_demo_task("slugify"))(collect_script(CATALOGUE["codex"]))

    assert result.exit_code == 0 and read_collected(result.stdout) == {}
