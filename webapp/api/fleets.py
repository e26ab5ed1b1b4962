"""REST API: environment templates (list, new version), fleets (list, create, scale, drain, move to a template
version, event log) and sandboxes (list with filters, detail with events).

Views are thin: input serializer -> service or selector -> output serializer. Domain errors become 4xx bodies
naming the field (webapp/api/exception_handlers.py). The per-sandbox agent secret is never serialized: the
selectors defer it and no serializer names it.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.api.paging import cursor_page
from webapp.api.ranges import CPU_MAX, ID_MAX, INT_MAX
from webapp.fleets import selectors, services
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

# --- serializers ---------------------------------------------------------------------------------------

TEMPLATE_SPEC = EnvironmentTemplate.SPEC_FIELDS


class TemplateSerializer(serializers.ModelSerializer):
    class Meta:
        model = EnvironmentTemplate
        fields = ("id", "name", "version", *TEMPLATE_SPEC, "spec_hash", "created_at")


class TemplateBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = EnvironmentTemplate
        fields = ("id", "name", "version", "spec_hash")


class TemplateInputSerializer(serializers.Serializer):
    """A new template, or the next version of an existing one: fields not given are carried over from the
    newest version of that name (or take the defaults for a new name)."""

    name = serializers.CharField(max_length=100)
    image = serializers.CharField(max_length=300, required=False, allow_blank=True)
    rootfs = serializers.CharField(max_length=300, required=False, allow_blank=True)
    cpu = serializers.FloatField(min_value=0.001, max_value=CPU_MAX, required=False)
    memory_mb = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    pids = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    disk_mb = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    network = serializers.ChoiceField(choices=EnvironmentTemplate.Network.choices, required=False)
    allow_list = serializers.ListField(child=serializers.CharField(), required=False)
    setup_commands = serializers.ListField(child=serializers.CharField(), required=False)
    max_lifetime_s = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    idle_timeout_s = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    reusable = serializers.BooleanField(required=False)
    eval_mode = serializers.ChoiceField(choices=EnvironmentTemplate.EvalMode.choices, required=False,
                                        help_text="in-place (default) or fresh-sandbox: where rollouts are evaluated")


class FleetSerializer(serializers.ModelSerializer):
    template = TemplateBriefSerializer()
    counts = serializers.SerializerMethodField()
    hit_rate = serializers.FloatField(allow_null=True)

    class Meta:
        model = Fleet
        fields = ("id", "name", "template", "backend", "min_warm", "max_warm", "max_total", "refill_per_minute",
                  "sizing", "miss_policy", "miss_wait_ms", "provision_timeout_s", "status", "hold_kind",
                  "hold_reason", "held_at", "hold_until", "claims_hit", "claims_miss", "hit_rate", "counts",
                  "reconciled_at", "last_report", "created_at")

    def get_counts(self, fleet) -> dict[str, int]:
        return selectors.state_counts(fleet)


class FleetInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    template = serializers.IntegerField(min_value=1, max_value=ID_MAX, required=False, help_text="a template id")
    template_name = serializers.CharField(required=False, help_text="or a template name: its newest version")
    backend = serializers.ChoiceField(choices=Fleet.Backend.choices, default=Fleet.Backend.LOCAL)
    min_warm = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=0)
    max_warm = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=4)
    max_total = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=16)
    refill_per_minute = serializers.IntegerField(min_value=1, max_value=INT_MAX, default=120)
    sizing = serializers.ChoiceField(choices=Fleet.Sizing.choices, default=Fleet.Sizing.BACKLOG)
    miss_policy = serializers.ChoiceField(choices=Fleet.MissPolicy.choices, default=Fleet.MissPolicy.COLD)
    miss_wait_ms = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=2000)
    provision_timeout_s = serializers.IntegerField(min_value=1, max_value=INT_MAX, default=120)

    def validate(self, attrs):
        if ("template" in attrs) == ("template_name" in attrs):
            raise serializers.ValidationError({"template": "give a template id or a template_name, one of them"})
        return attrs


class FleetScaleSerializer(serializers.Serializer):
    min_warm = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    max_warm = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    max_total = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    refill_per_minute = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)


class FleetTemplateSerializer(serializers.Serializer):
    template = serializers.IntegerField(min_value=1, max_value=ID_MAX, help_text="the template id (any version) to move the fleet to")


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = SandboxEvent
        fields = ("id", "sandbox", "sandbox_name", "kind", "from_state", "to_state", "reason", "data", "created_at")


class EventPageSerializer(serializers.Serializer):
    results = EventSerializer(many=True)
    next_before = serializers.IntegerField(allow_null=True, help_text="pass as ?before= for the next (older) page")


# Never "agent_secret".
SANDBOX_FIELDS: tuple[str, ...] = (
    "id", "name", "fleet", "fleet_name", "template", "spec_hash", "state", "endpoint", "failure_reason",
    "backend_reason", "lease_holder", "lease_expires_at", "fencing_token", "cold_claim", "requested_at",
    "scheduled_at", "ready_at", "leased_at", "first_exec_at", "released_at", "terminated_at", "last_used_at",
    "cold_start_ms", "time_to_first_exec_ms",
)


class SandboxSerializer(serializers.ModelSerializer):
    fleet_name = serializers.CharField(source="fleet.name")
    template = TemplateBriefSerializer(allow_null=True)
    cold_start_ms = serializers.SerializerMethodField()
    time_to_first_exec_ms = serializers.SerializerMethodField()

    class Meta:
        model = Sandbox
        fields: tuple[str, ...] = SANDBOX_FIELDS

    def get_cold_start_ms(self, sandbox) -> float | None:
        return _between(sandbox.requested_at, sandbox.ready_at)

    def get_time_to_first_exec_ms(self, sandbox) -> float | None:
        return _between(sandbox.leased_at, sandbox.first_exec_at)


class SandboxDetailSerializer(SandboxSerializer):
    events = serializers.SerializerMethodField(help_text="the latest 200, newest first")

    class Meta(SandboxSerializer.Meta):
        fields = (*SANDBOX_FIELDS, "events")

    @extend_schema_field(EventSerializer(many=True))
    def get_events(self, sandbox) -> list:
        return list(EventSerializer(self.context["events"], many=True).data)


class SandboxQuerySerializer(serializers.Serializer):
    fleet = serializers.IntegerField(min_value=1, max_value=ID_MAX, required=False, help_text="a fleet id")
    state = serializers.CharField(required=False, help_text="one state, or several separated by commas")
    holder = serializers.CharField(required=False, help_text="lease holder contains this")
    live = serializers.BooleanField(required=False, default=False, help_text="leave out terminated sandboxes")

    def validate_state(self, value: str) -> list[str]:
        states = [s for s in value.split(",") if s]
        unknown = sorted(set(states) - set(Sandbox.State.values))
        if unknown:
            raise serializers.ValidationError(f"unknown state {unknown[0]!r}")
        return states


class EventQuerySerializer(serializers.Serializer):
    before = serializers.IntegerField(min_value=1, max_value=ID_MAX, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=500, default=selectors.EVENTS_PAGE)


def _between(start, end) -> float | None:
    return round((end - start).total_seconds() * 1000, 3) if start and end else None


class ByName(CursorPagination):
    ordering = ("name", "-id")
    page_size = 100


class Newest(CursorPagination):
    ordering = "-id"
    page_size = 100


# --- views ---------------------------------------------------------------------------------------------

class TemplateListApi(APIView):
    scope_area = "fleets"
    pagination_class = ByName  # for the schema: the list is a cursor page
    @extend_schema(responses=TemplateSerializer(many=True), operation_id="templates_list")
    def get(self, request: Request) -> Response:
        return cursor_page(self, request, selectors.template_list(), pagination=ByName, serializer=TemplateSerializer)

    @extend_schema(request=TemplateInputSerializer, responses={201: TemplateSerializer}, operation_id="templates_create")
    def post(self, request: Request) -> Response:
        """Templates are immutable: posting a name that exists makes its next version."""
        given = TemplateInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fields = dict(given.validated_data)
        name = fields.pop("name")
        existing = selectors.template_list().filter(name=name).first()
        template = (services.template_revise(template=existing, **fields) if existing
                    else services.template_create(name=name, **fields))
        return Response(TemplateSerializer(template).data, status=status.HTTP_201_CREATED)


class TemplateDetailApi(APIView):
    scope_area = "fleets"
    @extend_schema(responses=TemplateSerializer, operation_id="templates_get")
    def get(self, request: Request, template_id: int) -> Response:
        return Response(TemplateSerializer(selectors.template_get(template_id=template_id)).data)


class FleetListApi(APIView):
    scope_area = "fleets"
    pagination_class = ByName
    @extend_schema(responses=FleetSerializer(many=True), operation_id="fleets_list")
    def get(self, request: Request) -> Response:
        return cursor_page(self, request, selectors.fleet_list(), pagination=ByName, serializer=FleetSerializer)

    @extend_schema(request=FleetInputSerializer, responses={201: FleetSerializer}, operation_id="fleets_create")
    def post(self, request: Request) -> Response:
        given = FleetInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fields = dict(given.validated_data)
        template = (selectors.template_get(template_id=fields.pop("template")) if "template" in fields
                    else selectors.template_latest(name=fields.pop("template_name")))
        fleet = services.fleet_create(name=fields.pop("name"), template=template, **fields)
        return Response(FleetSerializer(selectors.fleet_get(fleet_id=fleet.pk)).data, status=status.HTTP_201_CREATED)


class FleetDetailApi(APIView):
    scope_area = "fleets"
    @extend_schema(responses=FleetSerializer, operation_id="fleets_get")
    def get(self, request: Request, fleet_id: int) -> Response:
        return Response(FleetSerializer(selectors.fleet_get(fleet_id=fleet_id)).data)


class FleetScaleApi(APIView):
    scope_area = "fleets"
    @extend_schema(request=FleetScaleSerializer, responses=FleetSerializer, operation_id="fleets_scale")
    def post(self, request: Request, fleet_id: int) -> Response:
        """Set sizes; also resumes a drained or held fleet."""
        given = FleetScaleSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fleet = selectors.fleet_get(fleet_id=fleet_id)
        services.fleet_scale(fleet=fleet, reason=f"scaled by {request.user}", **given.validated_data)
        return Response(FleetSerializer(selectors.fleet_get(fleet_id=fleet_id)).data)


class FleetDrainApi(APIView):
    scope_area = "fleets"
    @extend_schema(request=None, responses=FleetSerializer, operation_id="fleets_drain")
    def post(self, request: Request, fleet_id: int) -> Response:
        """Stop the warm pool and new creates; leased sandboxes finish. Undo with scale."""
        services.fleet_drain(fleet=selectors.fleet_get(fleet_id=fleet_id), reason=f"drained by {request.user}")
        return Response(FleetSerializer(selectors.fleet_get(fleet_id=fleet_id)).data)


class FleetTemplateApi(APIView):
    scope_area = "fleets"
    @extend_schema(request=FleetTemplateSerializer, responses=FleetSerializer, operation_id="fleets_set_template")
    def post(self, request: Request, fleet_id: int) -> Response:
        """Move the fleet to another template version; warm sandboxes are replaced in a rolling way."""
        given = FleetTemplateSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        template = selectors.template_get(template_id=given.validated_data["template"])
        services.fleet_set_template(fleet=selectors.fleet_get(fleet_id=fleet_id), template=template)
        return Response(FleetSerializer(selectors.fleet_get(fleet_id=fleet_id)).data)


class FleetEventsApi(APIView):
    scope_area = "fleets"
    @extend_schema(parameters=[EventQuerySerializer], responses=EventPageSerializer, operation_id="fleets_events")
    def get(self, request: Request, fleet_id: int) -> Response:
        """The fleet's event log, newest first; page back with ?before=<next_before>."""
        query = EventQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        fleet = selectors.fleet_get(fleet_id=fleet_id)
        events, next_before = selectors.fleet_events(fleet=fleet, **query.validated_data)
        return Response(EventPageSerializer({"results": events, "next_before": next_before}).data)


class SandboxListApi(APIView):
    scope_area = "fleets"
    pagination_class = Newest
    @extend_schema(parameters=[SandboxQuerySerializer], responses=SandboxSerializer(many=True),
                   operation_id="sandboxes_list")
    def get(self, request: Request) -> Response:
        query = SandboxQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        given = query.validated_data
        sandboxes = selectors.sandbox_list(fleet_id=given.get("fleet"), states=given.get("state"),
                                           holder=given.get("holder", ""), live=given["live"])
        return cursor_page(self, request, sandboxes, pagination=Newest, serializer=SandboxSerializer)


class SandboxDetailApi(APIView):
    scope_area = "fleets"
    @extend_schema(responses=SandboxDetailSerializer, operation_id="sandboxes_get")
    def get(self, request: Request, sandbox_id: int) -> Response:
        sandbox = selectors.sandbox_get(sandbox_id=sandbox_id)
        events = selectors.sandbox_events(sandbox=sandbox)
        return Response(SandboxDetailSerializer(sandbox, context={"events": events}).data)


urlpatterns = [
    path("templates/", TemplateListApi.as_view(), name="api-templates"),
    path("templates/<int:template_id>/", TemplateDetailApi.as_view(), name="api-template"),
    path("fleets/", FleetListApi.as_view(), name="api-fleets"),
    path("fleets/<int:fleet_id>/", FleetDetailApi.as_view(), name="api-fleet"),
    path("fleets/<int:fleet_id>/scale/", FleetScaleApi.as_view(), name="api-fleet-scale"),
    path("fleets/<int:fleet_id>/drain/", FleetDrainApi.as_view(), name="api-fleet-drain"),
    path("fleets/<int:fleet_id>/template/", FleetTemplateApi.as_view(), name="api-fleet-template"),
    path("fleets/<int:fleet_id>/events/", FleetEventsApi.as_view(), name="api-fleet-events"),
    path("sandboxes/", SandboxListApi.as_view(), name="api-sandboxes"),
    path("sandboxes/<int:sandbox_id>/", SandboxDetailApi.as_view(), name="api-sandbox"),
]
