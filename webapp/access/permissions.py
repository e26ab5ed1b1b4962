"""The scope check: a request authenticated by a scoped token must carry the scope its endpoint needs."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from webapp.access.models import ApiToken
from webapp.access.scopes import required_scope


class TokenScopes(BasePermission):
    message = "this API token may not do that"

    def has_permission(self, request, view) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True  # sessions and plain DRF tokens act as their user
        needed = required_scope(view, request.method)
        if needed is None:
            self.message = "this endpoint is not open to scoped API tokens"
            return False
        if needed not in token.scopes:
            self.message = f"this API token lacks the scope {needed!r} (it has {', '.join(token.scopes)})"
            return False
        return True
