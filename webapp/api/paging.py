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


class LimitedCursorPagination(CursorPagination):
    """A cursor page whose client picks its size (`?limit=`, up to max_page_size): the schema says the bounds.
    (DRF clamps a larger limit to max_page_size and ignores one that is not a positive integer.)"""

    page_size_query_param = "limit"
    max_page_size = 500

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] |= {"minimum": 1, "maximum": self.max_page_size}
        return parameters
