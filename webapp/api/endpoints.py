"""REST API: registered model endpoints, the only places a job's model calls may go.

Anyone who may read jobs may list them (a trainer names one in a job). Registering one needs the scope
`endpoints:write` (the ops role, or an admin; webapp/access/scopes.py checks sessions and tokens alike), since
an endpoint decides where calls go, with which key, and whether private addresses may be reached (that last
one only an admin may allow: webapp/rollouts/endpoints.py).
A key is never accepted or returned: `key_ref` names where it lives, from the allow-list in
webapp/rollouts/endpoints.py.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.api.jobs import SECRET_FIELDS
from webapp.api.paging import cursor_page
from webapp.rollouts import endpoints
from webapp.rollouts.models import ModelEndpoint


class EndpointSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True, allow_null=True)

    class Meta:
        model = ModelEndpoint
        fields = ("name", "base_url", "protocol", "model_names", "key_ref", "allow_private_network", "token_capture",
                  "policy_version_from", "description", "created_by", "created_at")


class EndpointRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    base_url = serializers.CharField(max_length=500, help_text="e.g. https://api.openai.com/v1")
    protocol = serializers.ChoiceField(choices=ModelEndpoint.Protocol.choices, default=ModelEndpoint.Protocol.CHAT)
    model_names = serializers.ListField(child=serializers.CharField(max_length=200), allow_empty=False,
                                        max_length=100, help_text="the models jobs may name; the first is the default")
    key_ref = serializers.CharField(max_length=200, required=False, default="", allow_blank=True,
                                    help_text="env:TROVE_MODEL_KEY_... or file:NAME in TROVE_MODEL_SECRETS_DIR")
    allow_private_network = serializers.BooleanField(default=False, help_text="allow loopback, link-local and "
                                                     "private addresses (a server on this host or network)")
    token_capture = serializers.ChoiceField(choices=ModelEndpoint.TokenCapture.choices,
                                            default=ModelEndpoint.TokenCapture.OFF,
                                            help_text="ask the server for prompt and completion token ids and "
                                            "logprobs (vllm, sglang); the harness never sees them")
    policy_version_from = serializers.CharField(max_length=200, required=False, default="", allow_blank=True,
                                                help_text="where the server says its weights' version: "
                                                "header:NAME or body:metadata.weight_version")
    description = serializers.CharField(required=False, default="", allow_blank=True)

    def validate(self, attrs):
        for field in SECRET_FIELDS:
            if field in self.initial_data:
                raise serializers.ValidationError({field: "never the key: name where it lives in key_ref"})
        return attrs



class EndpointPagination(CursorPagination):
    ordering = "name"
    page_size = 100


class EndpointListApi(APIView):
    scope_area = "jobs"
    required_scopes = {"POST": "endpoints:write"}
    pagination_class = EndpointPagination  # for the schema: the list is a cursor page

    @extend_schema(responses=EndpointSerializer(many=True), operation_id="endpoints_list")
    def get(self, request: Request) -> Response:
        queryset = endpoints.endpoint_list().select_related("created_by")
        return cursor_page(self, request, queryset, pagination=EndpointPagination, serializer=EndpointSerializer)

    @extend_schema(request=EndpointRegisterSerializer, responses={201: EndpointSerializer},
                   operation_id="endpoints_register")
    def post(self, request: Request) -> Response:
        given = EndpointRegisterSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        endpoint = endpoints.endpoint_register(created_by=request.user, **given.validated_data)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetailApi(APIView):
    scope_area = "jobs"

    @extend_schema(responses=EndpointSerializer, operation_id="endpoints_get")
    def get(self, request: Request, name: str) -> Response:
        return Response(EndpointSerializer(endpoints.endpoint_get_by_name(name=name, field="name")).data)


urlpatterns = [
    path("endpoints/", EndpointListApi.as_view(), name="api-endpoints"),
    path("endpoints/<str:name>/", EndpointDetailApi.as_view(), name="api-endpoint"),
]
