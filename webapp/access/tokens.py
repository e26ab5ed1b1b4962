"""Issuing, checking and revoking scoped API tokens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.access.models import ApiToken
from webapp.access.scopes import scopes_clean

KEY_PREFIX = "trv_"
# last_used_at is a hint for people cleaning up tokens, not an audit log: one write a minute is plenty.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenRefused(Exception):
    """Why a presented key does not authenticate (unknown, revoked, expired, malformed)."""


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # shown once, never stored


def looks_like_scoped_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_issue(
    *, user: Any, name: str, scopes: list[str], expires_at: datetime | None = None
) -> IssuedToken:
    """A new token for `user` with the given scopes. The returned key is the only copy."""
    if not name.strip():
        raise ValueError("a token needs a name")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("expires_at: must be in the future")
    cleaned = scopes_clean(scopes)
    prefix = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        user=user, name=name.strip(), prefix=prefix, key_hash=_hash(key), scopes=cleaned, expires_at=expires_at
    )
    return IssuedToken(token=token, key=key)


def token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke now (idempotent: the first revocation time is kept)."""
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is None:
            locked.revoked_at = timezone.now()
            locked.save(update_fields=["revoked_at"])
    return locked


def token_authenticate(key: str) -> ApiToken:
    """The live token for a presented key, or TokenRefused saying why."""
    prefix, _, secret = key.removeprefix(KEY_PREFIX).partition("_")
    if not prefix or not secret:
        raise TokenRefused("malformed API token")
    token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
    if token is None or not hmac.compare_digest(token.key_hash, _hash(key)):
        raise TokenRefused("invalid API token")
    now = timezone.now()
    if token.revoked_at is not None:
        raise TokenRefused(f"API token {token.name!r} was revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenRefused(f"API token {token.name!r} expired at {token.expires_at.isoformat()}")
    if not token.user.is_active:
        raise TokenRefused("the token's user is inactive")
    _touch(token, now)
    return token


def _touch(token: ApiToken, now: datetime) -> None:
    stale_before = now - LAST_USED_RESOLUTION
    if token.last_used_at is None or token.last_used_at < stale_before:
        # Conditional, so concurrent requests write it once.
        ApiToken.objects.filter(pk=token.pk).exclude(last_used_at__gte=stale_before).update(last_used_at=now)
        token.last_used_at = now
