"""REST API: a run's outcome and its curation history. Views are thin: input serializer -> service -> output.

- `POST /api/v1/trajectories/<id>/outcome/`: `{"reward"?, "success"?, "status"?, "reason"}`. Sets the fields
  given (null clears reward or success; a field left out stays as it is). The reason is required. Needs the
  experience.change_trajectory permission (scope `trajectories:curate` for a scoped token). The change is a
  `set_outcome` curation event with who, when, the fields' old and new values, and why; setting what the
  run already holds changes nothing and records nothing (`changed: false`).
- `GET  /api/v1/trajectories/<id>/events/`: the run's curation events (outcome changes, approvals, tags,
  duplicate marks, cluster corrections), newest first, cursor-paged.
- `POST /api/v1/outcomes/`: `{"report", "name"?, "filter"?, "dry_run"?}` labels stored runs from an evaluation
  report, as `manage.py outcomes REPORT [--filter ...]` does (experience.services.outcome_labels): `report` is
  the report's text (a SWE-bench summary, a per-instance report.json, or a JSONL of {trajectory_id |
  source_ref | task_key [, sample], reward, success}), or the same already parsed (an object, or a list of
  outcome objects); `name` the report's file name (`report.json` makes an object a per-instance report; the
  harness summary's `<model>.<run_id>.json` names the model); `filter` narrows the runs that may be labelled
  (the list endpoint's filter names). Each change is a `set_outcome` curation event whose reason names the
  report. `dry_run: true` says what would change and writes nothing. 400 when `report` is not a report, or
  when it matched no run (the body still says which ids matched nothing). Needs `trajectories:curate`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.importers.reports import read_labels_from_bytes
from experience.models import CurationEvent
from experience.search import filters_from_params, trajectory_search
from experience.selectors import trajectory_get
from experience.services.curation import (
    MAX_REASON_CHARS,
    OUTCOME_FIELDS,
    OUTCOME_STATUSES,
    curation_history,
    trajectories_outcome_set,
)
from experience.services.outcome_labels import describe_labels, trajectories_label_from_report
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


class ReportField(serializers.JSONField):
    """A report as text, or as JSON already parsed: an object (one document) or a list (JSONL's lines)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if isinstance(value, str) and value.strip():
            return value.encode()
        if isinstance(value, dict) and value:
            return json.dumps(value).encode()
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            return "".join(json.dumps(item) + "\n" for item in value).encode()
        raise serializers.ValidationError(
            "give the report's text, an object (a SWE-bench report) or a non-empty list of outcome objects")


class OutcomesInputSerializer(serializers.Serializer):
    report = ReportField(help_text="the report's text, or the report as JSON (an object, or a list of outcomes)")
    name = serializers.CharField(required=False, max_length=255,
                                 help_text="the report's file name (default report.json for an object, "
                                           "outcomes.jsonl otherwise)")
    filter = serializers.DictField(required=False, default=dict, help_text="search filters, as for the list endpoint")
    dry_run = serializers.BooleanField(required=False, default=False, help_text="say what would change; write nothing")


class OutcomesResultSerializer(serializers.Serializer):
    source = serializers.CharField(help_text="the report, as the curation events name it")  # type: ignore[assignment]
    labelled = serializers.IntegerField(help_text="runs whose outcome changed (or would, in a dry run)")
    unchanged = serializers.IntegerField(help_text="runs named that already held the label")
    not_mentioned = serializers.IntegerField(help_text="runs in the filter's scope the report does not name")
    resolved = serializers.IntegerField()
    unresolved = serializers.IntegerField()
    unmatched = serializers.ListField(child=serializers.CharField(), help_text="report ids that matched no run")
    not_judged = serializers.ListField(child=serializers.CharField(), help_text="ids the evaluation could not judge")
    trajectory_ids = serializers.ListField(child=serializers.IntegerField())
    dry_run = serializers.BooleanField()
    summary = serializers.CharField(help_text="the same, in one line (as manage.py outcomes prints it)")


class OutcomesApi(APIView):
    scope_area = "trajectories"
    required_scopes = {"POST": "trajectories:curate"}
    parser_classes = [BoundedJSONParser]

    @extend_schema(request=OutcomesInputSerializer, responses=OutcomesResultSerializer,
                   operation_id="outcomes_label")
    def post(self, request: Request) -> Response:
        """Label stored runs from an evaluation report (a SWE-bench report or a JSONL of outcomes)."""
        if not request.user.has_perm(CURATE_PERMISSION):
            raise PermissionDenied(f"labelling outcomes needs the {CURATE_PERMISSION} permission")
        given = OutcomesInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        # is_valid refused anything but a JSON object, so the raw body is a mapping here
        name = data.get("name") or _default_name(cast(Mapping[str, Any], request.data).get("report"))
        labels = read_labels_from_bytes(data["report"], name=name)
        scope = trajectory_search(filters=filters_from_params(data["filter"]))
        result = trajectories_label_from_report(labels=labels, scope=scope, source=f"API upload {name}",
                                                actor=request.user, dry_run=data["dry_run"]).as_dict()
        body = OutcomesResultSerializer({**result, "summary": describe_labels(result)}).data
        if not result["trajectory_ids"]:
            detail = "the report matched no run in the store" + (" (with the filters given)" if data["filter"] else "")
            return Response({"error": "outcomes_unmatched", "detail": detail, "field": "report", **body},
                            status=status.HTTP_400_BAD_REQUEST)
        return Response(body)


def _default_name(report: Any) -> str:
    return "report.json" if isinstance(report, dict) else "outcomes.jsonl"


urlpatterns = [
    path("outcomes/", OutcomesApi.as_view(), name="api-outcomes"),
    path("trajectories/<int:trajectory_id>/outcome/", TrajectoryOutcomeApi.as_view(), name="api-trajectory-outcome"),
    path("trajectories/<int:trajectory_id>/events/", TrajectoryEventsApi.as_view(), name="api-trajectory-events"),
]
