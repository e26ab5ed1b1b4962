"""Google's gemini-cli: speaks only the Gemini API (`POST {base}/v1beta/models/M:streamGenerateContent?alt=sse`,
`x-goog-api-key`); runs on the sandbox's node (>= 20). Needs writable HOME and /tmp.

GOOGLE_GEMINI_BASE_URL is the proxy root (the client adds /v1beta); a Gemini endpoint's own base URL ends
in /v1beta.
Native log: ~/.gemini/tmp/<project>/chats/session-*.jsonl.
"""

from workers.harness.presets.base import PROMPT, ConfigFile, Package, Preset, json_config

SETTINGS = json_config({
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
})

PRESET = Preset(
    name="gemini-cli",
    title="Gemini CLI",
    package=Package("npm", "@google/gemini-cli", "0.61.0"),
    protocol="gemini",
    interpreter="/usr/bin/node",
    executable="node_modules/@google/gemini-cli/bundle/gemini.js",
    argv=("-p", PROMPT, "-y", "-m", "$model", "-o", "json", "--skip-trust"),
    env={"GEMINI_API_KEY": "$api_key", "GOOGLE_GEMINI_BASE_URL": "$proxy", "TMPDIR": "$tmp", "NO_COLOR": "1"},
    config_files=(ConfigFile(".gemini/settings.json", SETTINGS),),
    writable_dirs=("$home/.gemini",),
    native_logs=(".gemini/tmp/*/chats/*.jsonl", ".gemini/tmp/*/chats/*.json"),
    needs_node=True,
    notes="Gemini API only, streamed. Needs node >= 20 in the sandbox. Usage statistics and telemetry off.",
)
