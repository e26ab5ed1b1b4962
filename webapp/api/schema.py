"""The OpenAPI schema as the API serves it: every operation documents the error answers it can give.

drf-spectacular documents the success response of each operation; the errors come from places it cannot see
(the authentication and scope check, the body limit middleware, the parsers, the domain errors mapped in
exception_handlers.py). This postprocessing hook adds them, all in the one error shape Trove answers with:
`{"error", "detail", "field"}` from a domain error, `{"detail"}` from DRF, and for a 400 from a serializer
the fields it names (`{"memory_mb": ["…"]}`) or a list of messages.
"""

from __future__ import annotations

from typing import Any

from webapp.api.ranges import ID_MAX

ERROR = {
    "type": "object",
    "description": "`detail` says what went wrong; a domain error adds `error` (a code) and `field`",
    "properties": {
        "error": {"type": "string"},
        "detail": {"type": "string"},
        "field": {"type": "string", "nullable": True},
    },
    "additionalProperties": True,
}
VALIDATION_ERROR = {
    "description": "the fields that were refused, each with its messages; or a list of messages",
    "oneOf": [{"type": "object", "additionalProperties": True}, {"type": "array", "items": {"type": "string"}}],
}

_EVERY_OPERATION = {
    "400": ("bad input: a parameter or the body, named", "ValidationError"),
    "401": ("not authenticated, or a token that is unknown, revoked or expired", "Error"),
    "403": ("authenticated, but without the scope (or the role) this needs", "Error"),
    "404": ("no such object", "Error"),
    "406": ("no renderer for the Accept header given", "Error"),
}
_WITH_A_BODY = {
    "409": ("conflicts with the object's state, or a name that is taken", "Error"),
    "413": ("the body is over TROVE_MAX_BODY_BYTES, or a run over the store's limits", "Error"),
    "415": ("a content type this operation does not read", "Error"),
    "422": ("valid, but refused (e.g. a dataset spec that matches nothing)", "Error"),
}


def document_error_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: add the error responses (and their schemas) to every operation."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR)
    schemas.setdefault("ValidationError", VALIDATION_ERROR)
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            _bound_path_integers(operation)
            codes = dict(_EVERY_OPERATION)
            if method in ("post", "put", "patch"):
                codes |= _WITH_A_BODY
            for code, (description, component) in codes.items():
                operation["responses"].setdefault(code, _response(description, component))
    return result


def _bound_path_integers(operation: dict[str, Any]) -> None:
    """`<int:…>` in a route matches digits only: a path integer is never negative (nor past a bigint)."""
    for parameter in operation.get("parameters", []):
        schema = parameter.get("schema", {})
        if parameter.get("in") == "path" and schema.get("type") == "integer":
            schema.setdefault("minimum", 0)
            schema.setdefault("maximum", ID_MAX)


def _response(description: str, component: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}}}
