"""DRF authentication for scoped tokens: `Authorization: Bearer trv_…` (or `Token trv_…`, which the plain DRF
token header also uses, so clients need not know which kind of key they hold)."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from webapp.access.models import ApiToken
from webapp.access.tokens import TokenRefused, looks_like_scoped_key, token_authenticate

_KEYWORDS = (b"bearer", b"token")


class ScopedTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() not in _KEYWORDS:
            return None
        try:
            key = parts[1].decode()
        except UnicodeError:
            return None
        if not looks_like_scoped_key(key):
            return None  # a plain DRF token: the next authenticator's
        try:
            token: ApiToken = token_authenticate(key)
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'
