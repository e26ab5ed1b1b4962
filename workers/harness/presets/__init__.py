"""The harness catalogue: real CLI agents as declared presets (base.py says what a preset holds).

A job names a preset as `NAME` (its pinned version) or `NAME@VERSION`; `builtin` and `external` (a custom
command) stay as they were.
"""

from __future__ import annotations

import re

from workers.harness.presets import claude_code, codex, gemini_cli, mini_swe_agent, opencode, qwen_code
from workers.harness.presets.base import PROTOCOLS, Preset

CATALOGUE: dict[str, Preset] = {preset.name: preset for preset in (
    mini_swe_agent.PRESET, opencode.PRESET, codex.PRESET, claude_code.PRESET, qwen_code.PRESET, gemini_cli.PRESET,
)}
BUILTIN_HARNESSES = ("builtin", "external")
# OpenHands (openhands-sdk) needs Python >= 3.12 inside the sandbox; sandboxes run the host's /usr/bin/python3
# (3.11 here), so it is not in the catalogue. See docs/harnesses.md.
# An exact release, never a dist-tag (`latest`, `next`) or a range (`1`, `1.x` on npm): a bundle is installed once
# per version string and the string is recorded on every trajectory, so it must name one release for good.
_EXACT_VERSION = {
    "npm": re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:[-+][0-9A-Za-z.+-]{1,48})?$"),
    "pypi": re.compile(r"^[0-9]+(?:\.[0-9]+){0,5}(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?$"),
}

__all__ = ["BUILTIN_HARNESSES", "CATALOGUE", "PROTOCOLS", "Preset", "UnknownHarness", "resolve"]


class UnknownHarness(ValueError):
    """A harness name that is neither built in nor a preset, or a malformed version."""


def resolve(harness: str) -> tuple[Preset, str] | None:
    """(preset, version) for `NAME` or `NAME@VERSION`; None for `builtin` / `external`. Raises UnknownHarness."""
    if harness in BUILTIN_HARNESSES:
        return None
    name, _, version = harness.partition("@")
    preset = CATALOGUE.get(name)
    if preset is None:
        known = ", ".join([*BUILTIN_HARNESSES, *CATALOGUE])
        raise UnknownHarness(f"unknown harness {harness!r}: one of {known} (a preset may name a version: NAME@VERSION)")
    if version and not _EXACT_VERSION[preset.package.registry].match(version):
        raise UnknownHarness(
            f"harness {harness!r}: {version!r} is not a version: name an exact {preset.package.registry} release "
            f"(as {preset.package.version}), not a tag or a range, so every rollout of it runs the same harness")
    return preset, version or preset.package.version


def canonical(harness: str) -> str:
    """`NAME@VERSION` for a preset (its pinned version filled in), the name itself otherwise."""
    resolved = resolve(harness)
    return harness if resolved is None else f"{resolved[0].name}@{resolved[1]}"
