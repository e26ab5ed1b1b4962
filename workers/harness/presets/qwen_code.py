"""Qwen Code: speaks Chat Completions, streamed; runs on the sandbox's node (>= 20).

`privacy.usageStatisticsEnabled: false` in ~/.qwen/settings.json, or it looks up a telemetry host.
Native log: ~/.qwen/projects/<cwd>/chats/<session>.jsonl.
"""

from workers.harness.presets.base import PROMPT, ConfigFile, Package, Preset, json_config

SETTINGS = json_config({
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    "security": {"auth": {"selectedType": "openai"}},
    "model": {"name": "$model"},
})

PRESET = Preset(
    name="qwen-code",
    title="Qwen Code",
    package=Package("npm", "@qwen-code/qwen-code", "0.24.4"),
    protocol="chat",
    interpreter="/usr/bin/node",
    executable="node_modules/@qwen-code/qwen-code/cli-entry.js",
    argv=("-y", "-o", "json", "-p", PROMPT),
    env={"OPENAI_BASE_URL": "$base_url", "OPENAI_API_KEY": "$api_key", "OPENAI_MODEL": "$model",
         "TMPDIR": "$tmp", "NO_COLOR": "1"},
    config_files=(ConfigFile(".qwen/settings.json", SETTINGS),),
    writable_dirs=("$home/.qwen",),
    native_logs=(".qwen/projects/*/chats/*.jsonl",),
    needs_node=True,
    notes="Chat Completions, streamed; needs node >= 20 in the sandbox. Usage statistics off.",
)
