"""What a scoped API token may do: a fixed catalogue of scopes, and the presets for DESIGN's roles.

A scope is `<area>:<action>`. Safe methods (GET, HEAD, OPTIONS) on an area's endpoints need `<area>:read`;
anything else needs `<area>:write`, unless the view names its own scope (curation needs
`trajectories:curate`). Sessions and the plain DRF tokens are not scoped: they act as their user.
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.permissions import SAFE_METHODS

SCOPES: dict[str, str] = {
    "trajectories:read": "list, search, read and export runs and their steps; similar runs",
    "trajectories:write": "import runs and append steps",
    "trajectories:curate": "approve, reject, tag, note, mark duplicates (the user also needs "
                           "experience.change_trajectory)",
    "jobs:read": "rollout jobs, their rollouts and task sets",
    "jobs:write": "submit, cancel and re-run jobs; cancel rollouts; import task sets",
    "fleets:read": "templates, fleets, sandboxes and fleet events",
    "fleets:write": "create templates and fleets, scale, drain, change a fleet's template",
    "datasets:read": "datasets, versions, comparisons, and downloading version files",
    "datasets:write": "create datasets and build versions",
}

# DESIGN's roles, as token presets (`manage.py api_token create --role trainer`).
ROLES: dict[str, tuple[str, ...]] = {
    "trainer": ("jobs:read", "jobs:write", "trajectories:read", "datasets:read"),
    "researcher": ("jobs:read", "jobs:write", "trajectories:read", "trajectories:write", "datasets:read",
                   "datasets:write", "fleets:read"),
    "curator": ("trajectories:read", "trajectories:curate", "datasets:read"),
    "ops": ("fleets:read", "fleets:write", "jobs:read", "jobs:write", "trajectories:read"),
}


class UnknownScope(ValueError):
    pass


def scopes_clean(scopes: Iterable[str]) -> list[str]:
    """The scopes, checked against the catalogue, without repeats, sorted. Raises UnknownScope naming the
    first unknown one."""
    cleaned = set()
    for scope in scopes:
        if scope not in SCOPES:
            raise UnknownScope(f"unknown scope {scope!r}; known scopes: {', '.join(SCOPES)}")
        cleaned.add(scope)
    if not cleaned:
        raise UnknownScope("a token needs at least one scope")
    return sorted(cleaned)


def role_scopes(role: str) -> list[str]:
    if role not in ROLES:
        raise UnknownScope(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return sorted(ROLES[role])


def required_scope(view: object, method: str) -> str | None:
    """The scope a request needs, or None when the view is not open to scoped tokens (fail closed).

    A view says `scope_area = "jobs"`, and optionally `required_scopes = {"POST": "trajectories:curate"}`
    for methods whose scope is not the area's read / write.
    """
    explicit = getattr(view, "required_scopes", None) or {}
    if method in explicit:
        return explicit[method]
    area = getattr(view, "scope_area", None)
    if area is None:
        return None
    return f"{area}:read" if method in SAFE_METHODS else f"{area}:write"
