"""A preset made concrete for one rollout: the script the sandbox runs, and what is collected after it.

The script (handed to workers/harness/external.py, which exports the rollout's environment and records
the harness's pid first) makes the harness's private directories on the sandbox's /tmp, writes its config
files, and execs the harness with the task's instruction as its prompt and stdin closed. Everything the
harness writes lives under SCRATCH (never the workspace, so never in the final diff).
"""

from __future__ import annotations

import base64
import io
import re
import shlex
import string
import tarfile
from dataclasses import dataclass

from workers.harness.external import INSTRUCTION_FILE, SCRATCH_DIR, HarnessSetup
from workers.harness.presets.base import PROMPT, HarnessRun, Preset

BUNDLES_MOUNT = "/opt/trove/bundles"  # where local sandboxes see TROVE_HARNESS_DIR (read-only)
HOME = f"{SCRATCH_DIR}/home"
TMP = f"{SCRATCH_DIR}/tmp"
LOGS = f"{SCRATCH_DIR}/logs"
NATIVE_LOG_BYTES = 32 * 1024 * 1024  # the collected logs' archive, base64, at most
_HEREDOC_END = "TROVE_CONFIG_EOF"
DEFAULT_MAX_STEPS = 50  # $max_steps for a job without one


@dataclass(frozen=True)
class Launch:
    preset: Preset
    version: str
    script: str  # run by external.harness_script (holds the rollout's proxy URL: a credential while it runs)
    env: dict[str, str]
    display: str  # the command as recorded: no token, no config contents


def bundle_dir(preset: Preset, version: str, mount: str = BUNDLES_MOUNT) -> str:
    return f"{mount}/{preset.name}/{version}"


def proxy_root(base_url: str) -> str:
    """`<proxy>/r/<token>` from the `<proxy>/r/<token>/v1` every harness setup carries."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def values(preset: Preset, version: str, setup: HarnessSetup, *, mount: str = BUNDLES_MOUNT) -> dict[str, str]:
    return {"proxy": proxy_root(setup.base_url), "base_url": setup.base_url, "api_key": setup.api_key,
            "model": setup.model, "max_steps": str(setup.max_steps or DEFAULT_MAX_STEPS), "home": HOME, "tmp": TMP, "logs": LOGS,
            "bundle": bundle_dir(preset, version, mount)}


def fill(template: str, names: dict[str, str]) -> str:
    """A template filled; a name it does not know is a bug in the preset, said so."""
    try:
        return string.Template(template).substitute(names)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"bad placeholder in a preset template: {exc}: {template[:80]!r}") from exc


def launch(preset: Preset, version: str, setup: HarnessSetup, *, mount: str = BUNDLES_MOUNT) -> Launch:
    names = values(preset, version, setup, mount=mount)
    env = {"HOME": HOME, "TMPDIR": TMP, **{key: fill(value, names) for key, value in preset.env.items()}}
    dirs = [HOME, TMP, LOGS, *(fill(path, names) for path in preset.writable_dirs)]
    lines = [f"mkdir -p {' '.join(shlex.quote(path) for path in dirs)} || exit 125"]
    for config in preset.config_files:
        path = _under_home(fill(config.path, names))
        text = fill(config.template, names)
        if _HEREDOC_END in text:
            raise ValueError(f"preset {preset.name}: config {config.path} holds the heredoc marker")
        lines += [f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}",
                  f"cat > {shlex.quote(path)} <<'{_HEREDOC_END}'", text.rstrip("\n"), _HEREDOC_END]
    program = [*([preset.interpreter] if preset.interpreter else []), f"{names['bundle']}/{preset.executable}"]
    argv = [*program, *(PROMPT if arg == PROMPT else fill(arg, names) for arg in preset.argv)]
    # Not exec'd: once the harness exits, the same script prints its native logs after it (collected_from
    # splits them off), which saves the rollout an exec of its own for them. The exit status is the
    # harness's (128 + n when a signal killed it, as a shell tells it).
    lines += [*HARNESS_PIPES_OPEN, f"{_command(argv)} {HARNESS_REDIRECTS}", "trove_status=$?",
              *HARNESS_PIPES_DRAINED, *_collect_after(preset), "exit $trove_status"]
    shown = {**names, "proxy": _without_token(names["proxy"]), "base_url": _without_token(names["base_url"])}
    display = " ".join("<instruction>" if arg == PROMPT else shlex.quote(arg)
                       for arg in [*program, *(PROMPT if arg == PROMPT else fill(arg, shown) for arg in preset.argv)])
    return Launch(preset=preset, version=version, script="\n".join(lines), env=env, display=display)


def _without_token(url: str) -> str:
    """The rollout's token is a credential while it runs: a recorded command shows `/r/<token>`."""
    return re.sub(r"/r/[^/]+", "/r/<token>", url, count=1)


def _under_home(path: str) -> str:
    return path if path.startswith("/") else f"{HOME}/{path}"


def _command(argv: list[str]) -> str:
    prompt = f'"$(cat {shlex.quote(INSTRUCTION_FILE)})"'
    return " ".join(prompt if arg == PROMPT else shlex.quote(arg) for arg in argv)


# --- collecting the native logs --------------------------------------------------------------------------

def collect_script(preset: Preset) -> str:
    """Print a base64 tar.gz of the preset's native logs and everything under $logs (nothing when none)."""
    globs = [*preset.native_logs, "logs/**"]
    patterns = " ".join(_glob_for_bash(pattern) for pattern in globs)
    return "\n".join([
        "shopt -s globstar nullglob",
        f"cd {shlex.quote(SCRATCH_DIR)} 2>/dev/null || exit 0",
        f"files=(); for f in {patterns}; do [ -f \"$f\" ] && files+=(\"$f\"); done",
        '[ ${#files[@]} -eq 0 ] && exit 0',
        'tar -czf - -- "${files[@]}" 2>/dev/null | base64 -w0',
    ])


# The harness writes into pipes of its own, which a cat each copies on: Node and Bun harnesses (opencode,
# Claude Code, gemini-cli, qwen-code) set O_NONBLOCK on their stdout, and on the exec's own pipe (a shared
# description) the script's writes after them then failed with EAGAIN once 64 KiB waited in it: opencode's
# session database never came through. The cats are waited for at most 2 s, so a daemon the harness left
# holding its pipe cannot keep the script from ending (the agent's drain grace covers the rest).
HARNESS_PIPES_OPEN = ("exec 3> >(exec cat) && trove_out=$!", "exec 4> >(exec cat >&2) && trove_err=$!")
HARNESS_REDIRECTS = "< /dev/null >&3 2>&4 3>&- 4>&-"
HARNESS_PIPES_DRAINED = (
    "exec 3>&- 4>&-",
    "for _ in {1..400}; do { kill -0 $trove_out || kill -0 $trove_err; } 2>/dev/null || break; sleep 0.005; done",
)
# Lines of their own on stdout around the native logs the harness script prints after the harness.
LOGS_START, LOGS_END = "TROVE-NATIVE-LOGS-START", "TROVE-NATIVE-LOGS-END"


def _collect_after(preset: Preset) -> list[str]:
    # In a subshell: the collect script's `cd` and `exit` are its own.
    return [f"printf '\\n%s\\n' {LOGS_START}", f"({collect_script(preset)}\n)", f"printf '\\n%s\\n' {LOGS_END}"]


def collected_from(stdout: str) -> tuple[str, dict[str, bytes] | None]:
    """The harness's own stdout, and the native logs its script printed after it: None when they are not
    there whole (the harness was stopped, or the output cap cut them), to be collected with an exec."""
    head, start, rest = stdout.rpartition(f"\n{LOGS_START}\n")
    body, end, _ = rest.rpartition(f"\n{LOGS_END}\n")
    if not start:
        return stdout, None
    if not end:
        return head, None
    try:
        return head, read_collected(body)
    except (ValueError, OSError, EOFError, tarfile.TarError):  # cut or garbled: the exec reads them again
        return head, None


def _glob_for_bash(pattern: str) -> str:
    """A log glob relative to SCRATCH: `logs/...` as it is, anything else under home/."""
    if not re.fullmatch(r"[A-Za-z0-9_.*/-]+", pattern):
        raise ValueError(f"a native-log glob may hold letters, digits, _ . - / and * only: {pattern!r}")
    return pattern if pattern.startswith("logs/") else f"home/{pattern}"


def read_collected(output: str) -> dict[str, bytes]:
    """The collect script's output back into {path under SCRATCH: content}; {} for no output."""
    text = output.strip()
    if not text:
        return {}
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(text)), mode="r:gz") as archive:
        for member in archive.getmembers():
            if member.isfile():
                handle = archive.extractfile(member)
                if handle is not None:
                    files[member.name] = handle.read()
    return files


# --- telling how it ended --------------------------------------------------------------------------------

def verdict(preset: Preset, run: HarnessRun, *, timed_out: bool = False) -> str | None:
    """None when the run says something about the agent (evaluate it), else why it does not: the harness
    never reached the model, exited with an error, or its own verdict (its log) says its tools could not
    run. A harness stopped at the job's wall time used the agent's budget: evaluated."""
    if run.model_calls == 0:
        return f"{preset.name} ended without one model call reaching the proxy: {_tail(run)}"
    if timed_out:
        return None
    if run.exit_code not in preset.ok_exit_codes:
        return f"{preset.name} exited {run.exit_code}: {_tail(run)}"
    return preset.judge(run)


def _tail(run: HarnessRun) -> str:
    return (run.stdout + run.stderr).strip()[-300:] or "(no output)"
