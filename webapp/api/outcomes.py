"""REST API: a run's outcome and its curation history. Views are thin: input serializer -> service -> output.

- `POST /api/v1/trajectories/<id>/outcome/`: `{"reward"?, "success"?, "status"?, "reason"}`. Sets the fields
  given (null clears reward or success; a field left out stays as it is). The reason is required. Needs the
  experience.change_trajectory permission (scope `trajectories:curate` for a scoped token). The change is a
  `set_outcome` curation event with who, when, the fields' old and new values, and why; setting what the
  run already holds changes nothing and records nothing (`changed: false`).
- `GET  /api/v1/trajectories/<id>/events/`: the run's curation events (outcome changes, approvals, tags,
  duplicate marks, cluster corrections), newest first, cursor-paged.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.models import CurationEvent
from experience.selectors import trajectory_get
from experience.services.curation import (
    MAX_REASON_CHARS,
    OUTCOME_FIELDS,
    OUTCOME_STATUSES,
    curation_history,
    trajectories_outcome_set,
)
from webapp.api.paging import LimitedCursorPagination
from webapp.api.parsers import BoundedJSONParser

CURATE_PERMISSION = "experience.change_trajectory"


class OutcomeInputSerializer(serializers.Serializer):
    reward = serializers.FloatField(required=False, allow_null=True, help_text="null clears it")
    success = serializers.BooleanField(required=False, allow_null=True, help_text="null clears it")
    # Checked by the service (a 400 naming it); a CharField, so the schema has no second `status` enum.
    status = serializers.CharField(required=False, help_text="one of: " + ", ".join(OUTCOME_STATUSES))
    reason = serializers.CharField(max_length=MAX_REASON_CHARS, help_text="why: recorded with the change")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not any(name in attrs for name in OUTCOME_FIELDS):
            raise serializers.ValidationError({"reward": "give at least one of reward, success or status"})
        return attrs


class CurationEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None, help_text="null: the system")
    trajectory = serializers.IntegerField(source="trajectory_id")

    class Meta:
        model = CurationEvent
        fields = ("id", "trajectory", "action", "actor", "before", "after", "reason", "created_at")


class OutcomeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)
    success = serializers.BooleanField(allow_null=True)
    status = serializers.CharField()


class OutcomeResultSerializer(serializers.Serializer):
    trajectory = OutcomeSerializer()
    changed = serializers.BooleanField(help_text="false: the run already held these values; nothing recorded")
    event = CurationEventSerializer(allow_null=True)


class EventPagination(LimitedCursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class TrajectoryOutcomeApi(APIView):
    scope_area = "trajectories"
    required_scopes = {"POST": "trajectories:curate"}
    parser_classes = [BoundedJSONParser]

    @extend_schema(request=OutcomeInputSerializer, responses=OutcomeResultSerializer,
                   operation_id="trajectories_outcome_set")
    def post(self, request: Request, trajectory_id: int) -> Response:
        """Change a run's reward, success or status, with a reason; recorded as a curation event."""
        if not request.user.has_perm(CURATE_PERMISSION):
            raise PermissionDenied(f"changing an outcome needs the {CURATE_PERMISSION} permission")
        given = OutcomeInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fields = dict(given.validated_data)
        reason = fields.pop("reason")
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        result = trajectories_outcome_set(trajectories=[trajectory.pk], actor=request.user, reason=reason, **fields)
        trajectory.refresh_from_db(fields=OUTCOME_FIELDS)
        event = trajectory.curation_events.select_related("actor").first() if result.changed else None
        body = {"trajectory": trajectory, "changed": bool(result.changed), "event": event}
        return Response(OutcomeResultSerializer(body).data)


class TrajectoryEventsApi(generics.ListAPIView):
    """The run's curation events, newest first: who, when, before, after and why."""

    scope_area = "trajectories"
    serializer_class = CurationEventSerializer
    pagination_class = EventPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator, with no run to look up
            return CurationEvent.objects.none()
        return curation_history(trajectory_id=self.kwargs["trajectory_id"])

    @extend_schema(operation_id="trajectories_events")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


urlpatterns = [
    path("trajectories/<int:trajectory_id>/outcome/", TrajectoryOutcomeApi.as_view(), name="api-trajectory-outcome"),
    path("trajectories/<int:trajectory_id>/events/", TrajectoryEventsApi.as_view(), name="api-trajectory-events"),
]
