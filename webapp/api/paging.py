"""One way to answer a list endpoint with a cursor page, shared by every API area."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response


def cursor_page(view, request: Request, queryset, *, pagination: type[CursorPagination], serializer,
                context: dict | None = None) -> Response:
    """Serialize one cursor page of `queryset` (ordered by the pagination class) as the response."""
    paginator = pagination()
    page: list | None = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True, context=context or {}).data)
