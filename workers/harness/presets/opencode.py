"""opencode: speaks Chat Completions, streamed (`stream_options.include_usage`), through its built-in
`@ai-sdk/openai-compatible` provider configured in OPENCODE_CONFIG.

OPENCODE_DISABLE_MODELS_FETCH stops a models-list download (it logs an error without it); the other
switches stop update checks, LSP downloads and sharing. It makes a title call to its small model first
(one more recorded call). It needs writable XDG directories.
Native log: $XDG_DATA_HOME/opencode/log/*.log and its session storage: since 1.x a SQLite database,
opencode.db (with its -wal / -shm files), where older versions kept storage/**/*.json (both are kept).
"""

from workers.harness.presets.base import PROMPT, ConfigFile, Package, Preset, json_config

CONFIG = json_config({
    "provider": {"trove": {"npm": "@ai-sdk/openai-compatible", "name": "Trove recording proxy",
                           "options": {"baseURL": "$base_url", "apiKey": "$api_key"},
                           "models": {"$model": {"name": "$model"}}}},
    "model": "trove/$model",
    "small_model": "trove/$model",
    "permission": {"*": "allow"},
    "autoupdate": False,
    "share": "disabled",
})

PRESET = Preset(
    name="opencode",
    title="opencode",
    package=Package("npm", "opencode-ai", "1.18.33"),
    protocol="chat",
    executable="node_modules/opencode-ai/bin/opencode.exe",  # the binary its postinstall picked, no node needed
    argv=("run", PROMPT),
    env={"OPENCODE_CONFIG": "$home/opencode.json", "XDG_CONFIG_HOME": "$home/.config",
         "XDG_DATA_HOME": "$home/.local/share", "XDG_CACHE_HOME": "$home/.cache",
         "XDG_STATE_HOME": "$home/.local/state", "OPENCODE_DISABLE_MODELS_FETCH": "1",
         "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
         "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_PURE": "1", "TMPDIR": "$tmp", "NO_COLOR": "1"},
    config_files=(ConfigFile("opencode.json", CONFIG),),
    writable_dirs=("$home/.config", "$home/.local/share", "$home/.cache", "$home/.local/state"),
    native_logs=(".local/share/opencode/log/*.log", ".local/share/opencode/opencode.db*",
                 ".local/share/opencode/storage/**/*.json"),
    notes="Chat Completions, streamed. A title call to the small model comes first (one more call).",
)
