"""OpenAI's Codex CLI: speaks only the Responses API (always streamed), so the proxy serves /v1/responses.

It ignores OPENAI_BASE_URL: the endpoint is a custom provider in $CODEX_HOME/config.toml. Top-level keys
come before any [table]. The features switched off would otherwise clone a plugins repository and reach two
other hosts; `-c openai_base_url=` is avoided (it first tries WebSocket upgrades, seconds per run).
It needs a writable CODEX_HOME, and stdin closed (launch.py always gives /dev/null) or it waits on it.
Native log: $CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl.
"""

from workers.harness.presets.base import PROMPT, ConfigFile, Package, Preset

CONFIG_TOML = """\
model = "$model"
model_provider = "trove"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.trove]
name = "Trove recording proxy"
base_url = "$base_url"
env_key = "TROVE_PROXY_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
goals = false
multi_agent = false
image_generation = false
tool_suggest = false
"""

PRESET = Preset(
    name="codex",
    title="Codex CLI",
    package=Package("npm", "@openai/codex", "0.171.0"),
    protocol="responses",
    # The static musl binary of the platform package: no node needed (x86-64 hosts).
    executable="node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    argv=("exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", PROMPT),
    env={"CODEX_HOME": "$home/.codex", "TROVE_PROXY_KEY": "$api_key", "TMPDIR": "$tmp",
         "RUST_LOG": "error", "NO_COLOR": "1"},
    config_files=(ConfigFile(".codex/config.toml", CONFIG_TOML),),
    writable_dirs=("$home/.codex",),
    native_logs=(".codex/sessions/**/rollout-*.jsonl",),
    notes="Responses API only; endpoint set as a custom provider in config.toml; plugins, apps, analytics, "
          "web search and update checks off.",
)
