"""The one permission check, for the API and the dashboard alike: the request's method and view name a scope
(scopes.required_scope); the account behind the request must hold it (scopes.user_has_scope), and a scoped
token must carry it too. Sessions and plain DRF tokens are checked exactly as scoped tokens are, against the
scopes their user's roles give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import BasePermission

from webapp.access.models import ApiToken
from webapp.access.scopes import required_scope, roles_granting, user_has_scope


def refusal(user, token: ApiToken | None, needed: str | None) -> str | None:
    """Why the request may not go on, or None when it may."""
    if needed is None:
        return "this endpoint is open to nobody (its view names no scope area)"
    if token is not None and needed not in token.scopes:
        return f"this API token lacks the scope {needed!r} (it has {', '.join(token.scopes)})"
    if not user_has_scope(user, needed):
        roles = roles_granting(needed)
        who = f"the role {' or '.join(roles)}" if roles else "an administrator"
        return f"{needed!r} needs {who}, and your account has not got it"
    return None


class TokenScopes(BasePermission):
    """DRF: every API request, whichever way it authenticated."""

    message = "you may not do that"

    def has_permission(self, request, view) -> bool:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        problem = refusal(request.user, token, required_scope(view, request.method))
        if problem:
            self.message = problem
        return problem is None


@dataclass(frozen=True)
class ScopeRule:
    """What a dashboard view needs, in the shape required_scope reads from API views."""

    scope_area: str
    required_scopes: dict[str, str] = field(default_factory=dict)


def scope_required(area: str, **by_method: str) -> Callable:
    """Dashboard views: a login (else the login page), then the scope of the method — `<area>:read` for GET,
    `<area>:write` for POST unless `POST="trajectories:curate"` names another. Refused: 403 saying why."""
    rule = ScopeRule(area, dict(by_method))

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def checked(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            problem = refusal(request.user, None, required_scope(rule, request.method or "GET"))
            if problem:
                raise PermissionDenied(problem)
            return view(request, *args, **kwargs)

        checked.scope_rule = rule  # type: ignore[attr-defined]
        return login_required(checked)

    return decorate
