"""Typed readers for environment variables. Settings call these once; nothing else reads os.environ.

Each helper fails loudly on a bad value so a typo in a deployment is an error at start, not a surprise later.
`NAME_FILE` is read instead of `NAME` when set, for secrets mounted as files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import overload


class ConfigError(RuntimeError):
    pass


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    """`NAME_FILE`'s contents, else `NAME`, else `default` (so a str default always gives a str)."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        return Path(file_path).read_text().strip()
    return os.environ.get(name, default)


def env_required(name: str) -> str:
    value = env_str(name)
    if not value:
        raise ConfigError(f"environment variable {name} is required here and has no default")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name) or default
    if value not in choices:
        raise ConfigError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_mapping(name: str) -> dict[str, str]:
    """`KEY=VALUE,KEY=VALUE` as a dict; an item without a key or a value, or a key given twice, is refused."""
    mapping: dict[str, str] = {}
    for item in env_list(name, []):
        key, _, value = (part.strip() for part in item.partition("="))
        if not key or not value:
            raise ConfigError(f"{name}: {item!r} is not KEY=VALUE (items are separated by commas)")
        if key in mapping:
            raise ConfigError(f"{name}: {key!r} is given twice")
        mapping[key] = value
    return mapping
