"""mini-swe-agent: speaks Chat Completions through litellm, not streamed, with one `bash` tool; the run ends
when a command prints COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT (a plain-text answer is a format error it
answers itself).

Installed into a virtualenv on the sandbox's own /usr/bin/python3 (the venv's python is a symlink to it, so
the bundle runs wherever it is mounted: it is started as `venv/bin/python -m ...`, never through a script
whose shebang names the install path). MSWEA_CONFIGURED skips a first-run wizard that exits 1;
MSWEA_COST_TRACKING=ignore_errors stops an unknown model's cost from raising; litellm reads its bundled
model-cost map instead of fetching one. No outside contacts.
Native log: its trajectory, written with -o to $logs/trajectory.json.
"""

from workers.harness.presets.base import PROMPT, Package, Preset

PRESET = Preset(
    name="mini-swe-agent",
    title="mini-swe-agent",
    package=Package("pypi", "mini-swe-agent", "2.4.6"),
    protocol="chat",
    executable="venv/bin/python",
    argv=("-m", "minisweagent.run.mini", "-y", "--exit-immediately", "-m", "openai/$model", "-t", PROMPT,
          "-c", "mini.yaml", "-c", "model.model_kwargs.api_base=$base_url", "-c", "model.model_kwargs.api_key=$api_key",
          "-c", "agent.step_limit=$max_steps", "-c", "agent.cost_limit=0", "-o", "$logs/trajectory.json"),
    env={"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
         "LITELLM_TELEMETRY": "False", "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", "NO_COLOR": "1",
         "MSWEA_GLOBAL_CONFIG_DIR": "$home/.config/mini-swe-agent"},
    writable_dirs=("$home/.config/mini-swe-agent",),
    native_logs=("logs/trajectory.json",),
    notes="Chat Completions via litellm, not streamed; one bash tool. Step limit from the job's max_steps.",
)
