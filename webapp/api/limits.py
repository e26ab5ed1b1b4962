"""The request-body limit, one for every way in: API bodies and uploads, the dashboard's import upload, the
admin. One setting, TROVE_MAX_BODY_BYTES (also Django's DATA_UPLOAD_MAX_MEMORY_SIZE, which does not count file
uploads, hence this check).

`BodySizeLimitMiddleware` runs before anything reads the body (the CSRF check reads a POST form, and with it
every uploaded file, to disk), so an upload over the limit is refused before a byte of it is spooled. It reads
the declared Content-Length: Django reads no more of a body than that, so a client cannot declare a small
length and send more. API paths get the API's error body; pages a short HTML page saying the limit.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.html import escape

from experience.errors import LimitExceeded


def check_body_size(request: HttpRequest) -> None:
    """Raise LimitExceeded (413, field `body`) when the request's body is over TROVE_MAX_BODY_BYTES."""
    limit = settings.TROVE_MAX_BODY_BYTES
    try:
        size = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        size = 0
    if size > limit:
        raise LimitExceeded(f"body: {size} bytes exceeds the limit of {limit} ({_mib(limit)})", field="body")


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            check_body_size(request)
        except LimitExceeded as error:
            return _refusal(request, error)
        return self.get_response(request)


def _refusal(request: HttpRequest, error: LimitExceeded) -> HttpResponse:
    if request.path.startswith("/api/"):
        body = {"error": error.code, "detail": error.message, "field": error.field}
        return JsonResponse(body, status=error.status_code)
    page = (f"<!doctype html><title>Too large</title><h1>Upload too large</h1><p>{escape(error.message)}.</p>"
            "<p>Split the files into several uploads, or import them with <code>manage.py import</code>.</p>")
    return HttpResponse(page, status=error.status_code)
