"""The OpenAPI description of scoped tokens (drf-spectacular)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ScopedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.access.authentication.ScopedTokenAuthentication"
    name = "scopedToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A scoped API token `trv_…` (`manage.py api_token create`); each endpoint needs "
                           "`<area>:read` for GET and `<area>:write` otherwise.",
        }
