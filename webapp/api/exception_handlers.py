"""One place maps domain errors to HTTP: a 4xx body that names the problem and the field."""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import exception_handler

from experience.errors import TroveError


def trove_exception_handler(exc, context):
    if isinstance(exc, TroveError):
        body = {"error": exc.code, "detail": exc.message}
        if exc.field:
            body["field"] = exc.field
        return Response(body, status=exc.status_code)
    return exception_handler(exc, context)
