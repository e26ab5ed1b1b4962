"""Who may do what: one catalogue of scopes, the Django permissions each scope asks of a user, the roles as
sets of scopes, and the rule that names the scope a request needs. The API (permissions.TokenScopes), the
dashboard (permissions.scope_required) and the role groups (roles.py) all read it from here.

A scope is `<area>:<action>`. Safe methods (GET, HEAD, OPTIONS) on an area's endpoints and pages need
`<area>:read`; anything else needs `<area>:write`, unless the view names its own scope (curation needs
`trajectories:curate`).

Who holds a scope:
- a person (a session) or a program with a plain DRF token holds a scope when their account has the scope's
  Django permissions, which the role groups grant (superusers have them all); every active account holds the
  read scopes (BASELINE_SCOPES): a signed-in user with no role may look at everything and change nothing;
- a scoped token (`trv_…`) holds the scopes it was issued with that its user also holds: a token narrows its
  user's rights and never widens them, so taking a person out of a role takes the role from their tokens too.
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.permissions import SAFE_METHODS

SCOPES: dict[str, str] = {
    "trajectories:read": "list, search, read and export runs and their steps; similar runs",
    "trajectories:write": "import runs and append steps",
    "trajectories:curate": "approve, reject, tag, note, mark duplicates, split and merge clusters, edit outcomes",
    "jobs:read": "rollout jobs, their rollouts and task sets; model endpoints",
    "jobs:write": "submit, cancel and re-run jobs; cancel rollouts; import task sets",
    "endpoints:write": "register model endpoints (where a job's model calls go, and with which key)",
    "fleets:read": "templates, fleets, sandboxes and fleet events",
    "fleets:write": "create templates and fleets, scale, drain, change a fleet's template",
    "datasets:read": "datasets, versions, comparisons, and downloading version files",
    "datasets:write": "create datasets and build versions",
}

# The Django permissions a user needs to hold each scope. The role groups are given exactly the union of
# their scopes' permissions, so the admin (which checks these permissions) agrees with the API and the pages.
SCOPE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "trajectories:read": ("experience.view_trajectory", "experience.view_step", "experience.view_curationevent",
                          "experience.view_dedupcluster"),
    "trajectories:write": ("experience.add_trajectory", "experience.add_step"),
    "trajectories:curate": ("experience.change_trajectory", "experience.change_dedupcluster",
                            "experience.add_curationevent"),
    "jobs:read": ("rollouts.view_rolloutjob", "rollouts.view_rollout", "rollouts.view_taskset", "rollouts.view_task",
                  "rollouts.view_modelendpoint"),
    "jobs:write": ("rollouts.add_rolloutjob", "rollouts.change_rolloutjob", "rollouts.change_rollout",
                   "rollouts.add_taskset", "rollouts.add_task"),
    "endpoints:write": ("rollouts.add_modelendpoint", "rollouts.change_modelendpoint"),
    "fleets:read": ("fleets.view_environmenttemplate", "fleets.view_fleet", "fleets.view_sandbox",
                    "fleets.view_sandboxevent"),
    "fleets:write": ("fleets.add_environmenttemplate", "fleets.add_fleet", "fleets.change_fleet"),
    "datasets:read": ("experience.view_dataset", "experience.view_datasetversion"),
    "datasets:write": ("experience.add_dataset", "experience.add_datasetversion"),
}

# Every active account reads; acting needs a role. (To keep someone from reading, deactivate the account.)
BASELINE_SCOPES: frozenset[str] = frozenset(scope for scope in SCOPES if scope.endswith(":read"))

# DESIGN's roles: the groups people are put in (roles.py), and the token presets
# (`manage.py api_token create --role trainer`).
ROLES: dict[str, tuple[str, ...]] = {
    "trainer": ("jobs:read", "jobs:write", "trajectories:read", "datasets:read"),
    "researcher": ("jobs:read", "jobs:write", "trajectories:read", "trajectories:write", "datasets:read",
                   "datasets:write", "fleets:read"),
    "curator": ("trajectories:read", "trajectories:curate", "datasets:read"),
    "ops": ("fleets:read", "fleets:write", "jobs:read", "jobs:write", "trajectories:read", "endpoints:write"),
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


def roles_granting(scope: str) -> list[str]:
    return [role for role, scopes in ROLES.items() if scope in scopes]


def user_has_scope(user, scope: str) -> bool:
    """Whether the account holds `scope` (see the module docstring). Reads cost no query; other scopes use
    Django's permission check, which loads the user's permissions once per request."""
    if not (user.is_authenticated and user.is_active):
        return False
    return scope in BASELINE_SCOPES or user.has_perms(SCOPE_PERMISSIONS[scope])


def required_scope(view: object, method: str) -> str | None:
    """The scope a request needs, or None when the view names no area (fail closed: nobody may).

    A view (or a dashboard rule, permissions.scope_required) says `scope_area = "jobs"`, and optionally
    `required_scopes = {"POST": "trajectories:curate"}` for methods whose scope is not the area's read / write.
    """
    explicit = getattr(view, "required_scopes", None) or {}
    if method in explicit:
        return explicit[method]
    area = getattr(view, "scope_area", None)
    if area is None:
        return None
    return f"{area}:read" if method in SAFE_METHODS else f"{area}:write"
