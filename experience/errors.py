"""The experience store's error vocabulary. The API's exception handler maps these to HTTP."""

from __future__ import annotations


class TroveError(Exception):
    """Base: a domain error with a message fit to show a user."""

    status_code = 400
    code = "error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ValidationError(TroveError):
    code = "invalid"


class LimitExceeded(TroveError):
    status_code = 413
    code = "limit_exceeded"


class NotFound(TroveError):
    status_code = 404
    code = "not_found"


class Forbidden(TroveError):
    """The caller may not do this, whatever the input (a role's limit, not a bad value)."""

    status_code = 403
    code = "forbidden"


class Conflict(TroveError):
    status_code = 409
    code = "conflict"
