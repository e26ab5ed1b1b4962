"""What a harness preset declares: a real CLI agent (Claude Code, Codex, opencode, mini-swe-agent, ...) as data,
not a shell string. The catalogue (`workers.harness.presets`) holds one per harness; `launch.py` turns one
into the script a sandbox runs, `bundles.py` installs its package once per version.

Templates (env values, config files, argv) are `string.Template`s over these names, filled per rollout:
    $proxy      the rollout's proxy root as the sandbox reaches it, `<proxy>/r/<token>` (Anthropic's and
                Gemini's clients append their own /v1 or /v1beta)
    $base_url   `$proxy/v1` (OpenAI clients: Chat Completions and Responses)
    $api_key    a placeholder: the proxy holds the upstream's key, the sandbox never does
    $model      the job's model name
    $max_steps  the job's step budget (model turns), for harnesses that take one
    $home       the harness's HOME, a private directory on the sandbox's /tmp (never the workspace)
    $tmp        a temp directory of its own beside it
    $logs       where a harness is told to write its trajectory (collected with its native logs)
    $bundle     the read-only bundle of the harness's package, as mounted in the sandbox
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

PROTOCOLS = ("chat", "responses", "messages", "gemini")


@dataclass(frozen=True)
class Package:
    """The registry package a harness comes from, and the version Trove pins."""

    registry: Literal["npm", "pypi"]
    name: str
    version: str

    def spec(self, version: str | None = None) -> str:
        version = version or self.version
        return f"{self.name}@{version}" if self.registry == "npm" else f"{self.name}=={version}"


@dataclass(frozen=True)
class ConfigFile:
    """A file written before the harness starts: `path` under $home (or absolute), `template` its text."""

    path: str
    template: str


@dataclass(frozen=True)
class HarnessRun:
    """What a harness left behind, handed to its preset's `judge`."""

    exit_code: int | None
    stdout: str
    stderr: str
    native_logs: Mapping[str, bytes]  # path under $home (or $logs as `logs/...`) -> content
    model_calls: int


# A preset's own verdict on a finished run: None when the run can be trusted, else why it cannot.
Judge = Callable[[HarnessRun], "str | None"]


def no_judgement(run: HarnessRun) -> str | None:
    return None


@dataclass(frozen=True)
class Preset:
    """One harness, declared. Nothing here is a shell string: `launch.py` quotes every piece."""

    name: str
    title: str
    package: Package
    protocol: str  # the API it speaks: one of PROTOCOLS
    executable: str  # relative to the bundle
    interpreter: str = ""  # a program inside the sandbox that runs `executable` (node for a JS entry point)
    argv: tuple[str, ...] = ()  # after the executable; PROMPT stands for the task's instruction
    env: Mapping[str, str] = field(default_factory=dict)
    config_files: tuple[ConfigFile, ...] = ()
    writable_dirs: tuple[str, ...] = ()  # made before the start (templates; $home and $tmp always are)
    native_logs: tuple[str, ...] = ()  # globs under $home (or `logs/...` under $logs), collected after the run
    ok_exit_codes: frozenset[int] = frozenset({0})  # how it says it ended normally; anything else is a failure
    judge: Judge = no_judgement
    needs_node: bool = False  # runs on the sandbox's node (>= 20); else a self-contained binary or python
    notes: str = ""  # what an operator should know (traps, what is switched off and why)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"preset {self.name}: protocol {self.protocol!r} is not one of {PROTOCOLS}")
        if PROMPT not in self.argv:
            raise ValueError(f"preset {self.name}: argv never passes the task (PROMPT)")

    def describe(self, version: str | None = None) -> dict:
        """The preset as the API and the dashboard show it."""
        return {"name": self.name, "title": self.title, "registry": self.package.registry,
                "package": self.package.name, "version": version or self.package.version,
                "protocol": self.protocol, "needs_node": self.needs_node, "notes": self.notes}


PROMPT = "\x00PROMPT\x00"  # stands for the task's instruction in a preset's argv


def json_config(value: object) -> str:
    """A JSON config file's template: `$name` placeholders survive json.dumps; a literal `$` is doubled."""
    return json.dumps(value, indent=2)
