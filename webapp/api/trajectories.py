"""REST API: trajectories. Views are thin: input serializer -> service or selector -> output serializer.

- `GET  /api/v1/trajectories/`: search (filters of experience.search, a django-filter FilterSet), newest first,
  cursor-paged (`next` / `previous` links, `limit` up to 500). `similar=<id>` lists the runs most similar to
  one run, best first, in one page.
- `POST /api/v1/trajectories/`: bulk ingest, `{"trajectories": [run, ...]}` or one run. A run is a Trove
  record (experience.exporters.trove_jsonl's line without `trove_format`; fields left out take their
  defaults). All or nothing: a bad run is a 4xx naming the field (`trajectories[2].steps[5].kind`) and nothing
  is written. `source` may not be `rollout` in any spelling (experience.services.provenance). Idempotent on (source, source_ref). Body size, steps per run and text length are limited.
- `GET  /api/v1/trajectories/<id>/`: one run with its first page of steps; `steps_next` pages on.
- `GET  /api/v1/trajectories/<id>/similar/?k=10&same_task=true`: the runs nearest by signature embedding,
  best first, each with its cosine `score` (experience.services.dedup.similar_runs).
- `GET  /api/v1/trajectories/<id>/steps/?after=<seq>&limit=&context=1`: steps after a seq, with their full
  text; `context=1` adds the messages a model call saw.
- `POST /api/v1/trajectories/<id>/steps/`: append steps, `{"steps": [...], "first_seq": n?}`; idempotent
  on call ids, and on seq when `first_seq` numbers them. A rollout's steps come from Trove only (409).
- `POST /api/v1/trajectories/import/`: multipart `file` (one or more) and optional `format`; each file
  all or nothing; the report says what was imported and skipped, and why.
- `GET  /api/v1/trajectories/export/?format=trove|atif&<filters>`: the selection as JSONL, streamed.
- `POST /api/v1/trajectories/curate/`: `{"ids": [...] | "filter": {...}, "action", "reason", "tags", "note",
  "canonical"}`; needs the experience.change_trajectory permission; every change is a CurationEvent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any

import django_filters
from django.http import StreamingHttpResponse
from django.urls import path, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.errors import ValidationError
from experience.exporters.trove_jsonl import MARKER_KEY, step_to_dict
from experience.models import Step, Trajectory
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.search import TrajectoryFilters, filters_from_params, trajectory_search, trajectory_similar
from experience.selectors import trajectory_get
from experience.services.curation import ACTIONS, trajectories_curate
from experience.services.dedup import similar_runs
from experience.services.exporting import (
    CONTENT_TYPE,
    EXPORT_FORMATS,
    check_export_format,
    export_filename,
    export_filters,
    trajectories_export,
)
from experience.services.importing import (
    INVALID,
    UNRECOGNISED,
    ImportReport,
    trajectories_import_upload,
)
from experience.services.ingest import steps_append, trajectories_ingest_many
from experience.services.provenance import check_client_may_append
from experience.services.stored import stored_step_records
from experience.steps import context_length
from webapp.api.limits import check_body_size
from webapp.api.paging import LimitedCursorPagination
from webapp.api.parsers import BoundedJSONParser
from webapp.api.ranges import ID_MAX, INT_MAX

STEP_PAGE, MAX_STEP_PAGE = 100, 1000
CURATE_PERMISSION = "experience.change_trajectory"

# --- translating JSON into records ---------------------------------------------------------------------------

_RUN_FIELDS = {f.name for f in dataclass_fields(TrajectoryRecord)}
_STEP_FIELDS = {f.name for f in dataclass_fields(StepRecord)}
_MESSAGE_FIELDS = {f.name for f in dataclass_fields(MessageRecord)}
_TIMES = ("started_at", "ended_at", "finished_at")
_RUN_DEFAULTS = {"source": "api", "source_format": "api", "source_ref": "", "task_key": ""}


def _invalid(field: str, problem: str) -> ValidationError:
    return ValidationError(f"{field}: {problem}", field=field)


def _object(value: Any, where: str, known: set[str], ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(where.rstrip(".") or "body", "must be an object")
    unknown = sorted(set(value) - known - ignore)
    if unknown:
        raise _invalid(f"{where}{unknown[0]}", "unknown field")
    return {k: v for k, v in value.items() if k not in ignore}


def _times(values: dict[str, Any], where: str) -> None:
    for name in _TIMES:
        value = values.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise _invalid(f"{where}{name}", "must be an ISO 8601 time")
        try:
            values[name] = datetime.fromisoformat(value)
        except ValueError:
            raise _invalid(f"{where}{name}", f"{value!r} is not an ISO 8601 time") from None


def record_from_json(value: Any, where: str = "") -> TrajectoryRecord:
    """A TrajectoryRecord from its JSON form. Shapes only; the ingest service checks every field's type."""
    values = {**_RUN_DEFAULTS, **_object(value, where, _RUN_FIELDS, frozenset({MARKER_KEY}))}
    _times(values, where)
    steps = values.get("steps", [])
    if not isinstance(steps, list):
        raise _invalid(f"{where}steps", "must be a list")
    values["steps"] = [step_from_json(s, f"{where}steps[{i}].") for i, s in enumerate(steps)]
    return TrajectoryRecord(**values)


def step_from_json(value: Any, where: str) -> StepRecord:
    values = _object(value, where, _STEP_FIELDS)
    if "kind" not in values:
        raise _invalid(f"{where}kind", "required")
    _times(values, where)
    if values.get("payload") is None:
        values["payload"] = {}
    messages = values.get("request_messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise _invalid(f"{where}request_messages", "must be a list")
        values["request_messages"] = [_message(m, f"{where}request_messages[{i}].") for i, m in enumerate(messages)]
    return StepRecord(**values)


def _message(value: Any, where: str) -> MessageRecord:
    values = _object(value, where, _MESSAGE_FIELDS)
    if "role" not in values:
        raise _invalid(f"{where}role", "required")
    return MessageRecord(**values)


# --- serializers ---------------------------------------------------------------------------------------------


class TrajectorySerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    page_url = serializers.SerializerMethodField()

    class Meta:
        model = Trajectory
        fields: tuple[str, ...] = (
            "id", "uid", "source", "source_format", "source_version", "source_ref", "task_set", "task_key",
            "harness", "model", "status", "reward", "success", "n_steps", "n_model_calls", "tokens_in", "tokens_out",
            "cost", "duration_s", "started_at", "finished_at", "created_at", "curation_status", "tags",
            "is_duplicate", "canonical", "cluster", "similarity", "url", "page_url",
        )

    def get_url(self, trajectory: Trajectory) -> str:
        return self.context["request"].build_absolute_uri(reverse("api-trajectory", args=[trajectory.pk]))

    def get_page_url(self, trajectory: Trajectory) -> str:
        return self.context["request"].build_absolute_uri(reverse("dashboard:trajectory", args=[trajectory.pk]))


class StepSerializer(serializers.Serializer):
    """A step as Trove exports it (every StepRecord field), with its id and seq."""

    def to_representation(self, instance: tuple[Step, StepRecord]) -> dict[str, Any]:
        row, record = instance
        body = {"id": row.pk, "seq": row.seq, **step_to_dict(record)}
        if record.request_messages is None and "request_messages" in row.blob_refs:
            body["n_request_messages"] = context_length(row.blob_refs["request_messages"])
        return body


class TrajectoryDetailSerializer(TrajectorySerializer):
    steps = serializers.SerializerMethodField()
    steps_next = serializers.SerializerMethodField()

    class Meta(TrajectorySerializer.Meta):
        fields = (*TrajectorySerializer.Meta.fields, "instruction", "final_diff", "metadata", "notes",
                  "content_hash", "original_blob", "steps", "steps_next")

    def get_steps(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        return list(StepSerializer(self.context["steps"], many=True).data)

    def get_steps_next(self, trajectory: Trajectory) -> str | None:
        return self.context["steps_next"]


class IngestInputSerializer(serializers.Serializer):
    trajectories = serializers.ListField(child=serializers.DictField(), help_text="Trove records (see above)")


class IngestOutcomeSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="trajectory_id")
    created = serializers.BooleanField(help_text="false: the run (source, source_ref) was already stored")
    source = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.source
    source_ref = serializers.CharField()


class StepsAppendSerializer(serializers.Serializer):
    steps = serializers.ListField(child=serializers.DictField())
    first_seq = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False, allow_null=True, default=None)


class StepsQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=-1, max_value=INT_MAX, default=-1, help_text="the last seq you have (-1: from the start)")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_STEP_PAGE, default=STEP_PAGE)
    context = serializers.BooleanField(  # type: ignore[assignment]  # a field named like Serializer.context
        default=False, help_text="include the messages each model call saw")


class ImportInputSerializer(serializers.Serializer):
    file = serializers.ListField(child=serializers.FileField(), allow_empty=False, help_text="one or more files")
    format = serializers.ChoiceField(choices=[], required=False, help_text="skip detection")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from experience.importers import REGISTRY

        choices: Any = self.fields["format"]
        choices.choices = sorted(REGISTRY)


class CurateInputSerializer(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=ID_MAX), required=False, allow_empty=False)
    filter = serializers.DictField(required=False, help_text="search filters, as for the list endpoint")
    action = serializers.ChoiceField(choices=ACTIONS)
    reason = serializers.CharField(required=False, default="", allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    note = serializers.CharField(required=False, default="", allow_blank=True)
    canonical = serializers.IntegerField(min_value=1, max_value=ID_MAX, required=False, allow_null=True, default=None)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError({"ids": "give the runs as `ids` or as a `filter`, one of them"})
        if "filter" in attrs and not attrs["filter"]:
            raise serializers.ValidationError({"filter": "empty: name at least one filter (or give ids)"})
        return attrs


class CurationResultSerializer(serializers.Serializer):
    action = serializers.CharField()
    matched = serializers.IntegerField(help_text="runs selected")
    changed = serializers.IntegerField(help_text="runs changed, each recorded as a curation event")


# --- filters and pages ---------------------------------------------------------------------------------------


class TrajectoryFilterSet(django_filters.FilterSet):
    """The query parameters of a trajectory search. Parsing and the queries themselves are
    experience.search's (one vocabulary for the API, the explorer, exports and curation)."""

    ids = django_filters.CharFilter(help_text="comma-separated trajectory ids")
    task = django_filters.CharFilter(help_text="task key, exact")
    task_set = django_filters.CharFilter()
    model = django_filters.CharFilter()
    harness = django_filters.CharFilter()
    source = django_filters.CharFilter(help_text="rollout | import | api")
    source_format = django_filters.CharFilter(help_text="e.g. swe-agent-traj, openhands-output, inspect-eval")
    status = django_filters.CharFilter(help_text="comma-separated: " + ", ".join(Trajectory.Status.values))
    outcome = django_filters.CharFilter(help_text="success | failure | unknown")
    curation = django_filters.CharFilter(help_text="comma-separated: pending, approved, rejected")
    duplicate = django_filters.CharFilter(help_text="any (default) | exclude | only")
    created_after = django_filters.CharFilter(help_text="ISO date or date-time")
    created_before = django_filters.CharFilter(help_text="ISO date or date-time")
    tags = django_filters.CharFilter(help_text="comma-separated; runs having all of them")
    q = django_filters.CharFilter(help_text="full text over step content (commands, outputs, thoughts)")
    similar = django_filters.CharFilter(help_text="a trajectory id: the runs most similar to it")
    step_label = django_filters.CharFilter(help_text="runs with a curator's label of this name on a step")
    job = django_filters.CharFilter(help_text="a rollout job's id: the runs it made")
    cluster_outcomes = django_filters.CharFilter(help_text="mixed | same: runs in a dedup cluster whose outcomes differ / agree")

    class Meta:
        model = Trajectory
        fields: list[str] = []

    def search_filters(self) -> TrajectoryFilters:
        given = {name: self.data[name] for name in self.filters if self.data.get(name) not in (None, "")}
        return filters_from_params(given)

    def filter_queryset(self, queryset):
        return trajectory_search(filters=self.search_filters(), queryset=queryset)


class TrajectoryPagination(LimitedCursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class IgnoreClientContentNegotiation(BaseContentNegotiation):
    """The export's `format` parameter names the export format, not a DRF renderer."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


# --- views ---------------------------------------------------------------------------------------------------


class TrajectoryListApi(generics.ListAPIView):
    scope_area = "trajectories"
    serializer_class = TrajectorySerializer
    filterset_class = TrajectoryFilterSet
    pagination_class = TrajectoryPagination
    queryset = Trajectory.objects.all()
    parser_classes = [BoundedJSONParser]

    @extend_schema(operation_id="trajectories_search")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if request.query_params.get("similar"):
            return self._similar(request)
        return super().get(request, *args, **kwargs)

    def _similar(self, request: Request) -> Response:
        filters = TrajectoryFilterSet(request.query_params, queryset=Trajectory.objects.all()).search_filters()
        rows = trajectory_similar(filters=filters)
        data = TrajectorySerializer(rows, many=True, context={"request": request}).data
        return Response({"next": None, "previous": None, "results": data})

    @extend_schema(request=IngestInputSerializer, responses={201: IngestOutcomeSerializer(many=True), 200: IngestOutcomeSerializer(many=True)},
                   operation_id="trajectories_ingest")
    def post(self, request: Request) -> Response:
        """Store whole runs; all or nothing. 201 when a run was created, 200 when all were already stored."""
        check_body_size(request)
        body = request.data
        if isinstance(body, dict) and "trajectories" in body:
            runs = body["trajectories"]
            if not isinstance(runs, list):
                raise _invalid("trajectories", "must be a list")
            records = [record_from_json(run, f"trajectories[{i}].") for i, run in enumerate(runs)]
            outcomes = trajectories_ingest_many(records=records)
        else:
            outcomes = trajectories_ingest_many(records=[record_from_json(body)], field_prefix="")
        created = any(o.created for o in outcomes)
        data = IngestOutcomeSerializer(outcomes, many=True).data
        return Response({"results": data}, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _step_page(trajectory: Trajectory, *, after: int, limit: int, context: bool) -> tuple[list, int | None]:
    rows = list(Step.objects.filter(trajectory=trajectory, seq__gt=after).order_by("seq")[: limit + 1])
    more, rows = len(rows) > limit, rows[:limit]
    pairs = list(zip(rows, stored_step_records(rows, context=context), strict=True))
    return pairs, (rows[-1].seq if more else None)


def _steps_url(request: Request, trajectory_id: int, after: int, limit: int, context: bool) -> str:
    url = reverse("api-trajectory-steps", args=[trajectory_id]) + f"?after={after}&limit={limit}"
    return request.build_absolute_uri(url + ("&context=1" if context else ""))


class TrajectoryDetailApi(APIView):
    scope_area = "trajectories"
    @extend_schema(parameters=[StepsQuerySerializer], responses=TrajectoryDetailSerializer,
                   operation_id="trajectories_get")
    def get(self, request: Request, trajectory_id: int) -> Response:
        query = StepsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        limit, context = query.validated_data["limit"], query.validated_data["context"]
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        pairs, last = _step_page(trajectory, after=-1, limit=limit, context=context)
        steps_next = None if last is None else _steps_url(request, trajectory.pk, last, limit, context)
        serializer = TrajectoryDetailSerializer(
            trajectory, context={"request": request, "steps": pairs, "steps_next": steps_next})
        return Response(serializer.data)


class TrajectoryStepsApi(APIView):
    scope_area = "trajectories"
    parser_classes = [BoundedJSONParser]

    @extend_schema(parameters=[StepsQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="trajectories_steps")
    def get(self, request: Request, trajectory_id: int) -> Response:
        """Steps after `after` (a seq), in order, with their full content; `next` pages on."""
        query = StepsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        args = query.validated_data
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        pairs, last = _step_page(trajectory, after=args["after"], limit=args["limit"], context=args["context"])
        next_url = None if last is None else _steps_url(request, trajectory.pk, last, args["limit"], args["context"])
        return Response({"results": StepSerializer(pairs, many=True).data, "next": next_url})

    @extend_schema(request=StepsAppendSerializer, responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT},
                   operation_id="trajectories_append")
    def post(self, request: Request, trajectory_id: int) -> Response:
        """Append steps to a stored run (idempotent on call ids, and on seq with `first_seq`)."""
        check_body_size(request)
        given = StepsAppendSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        records = [step_from_json(s, f"steps[{i}].") for i, s in enumerate(given.validated_data["steps"])]
        check_client_may_append(trajectory_id=trajectory_id)
        created = steps_append(trajectory_id=trajectory_id, steps=records,
                               first_seq=given.validated_data["first_seq"])
        body = {"appended": [{"id": s.pk, "seq": s.seq} for s in created]}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class TrajectoryImportApi(APIView):
    scope_area = "trajectories"
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(request=ImportInputSerializer, responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT},
                   operation_id="trajectories_import")
    def post(self, request: Request) -> Response:
        """Import uploaded files (any format `manage.py import` reads), each all or nothing.

        201 when runs were imported, 200 when everything was already stored, 400 when no file could be read.
        """
        check_body_size(request)
        given = ImportInputSerializer(data={"file": request.FILES.getlist("file"), **_single(request.data, "format")})
        given.is_valid(raise_exception=True)
        report = ImportReport(files=[
            trajectories_import_upload(filename=upload.name or "upload", chunks=upload.chunks(),
                                       format=given.validated_data.get("format"))
            for upload in given.validated_data["file"]
        ])
        if all(f.status in (INVALID, UNRECOGNISED) for f in report.files):
            first = report.files[0]
            body = {"error": "import_invalid", "detail": first.error, "field": "file", **report.as_dict()}
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        return Response(report.as_dict(), status=status.HTTP_201_CREATED if report.imported else status.HTTP_200_OK)


def _single(data: Any, name: str) -> dict[str, Any]:
    value = data.get(name) if hasattr(data, "get") else None
    return {name: value} if value else {}


class TrajectoryExportApi(APIView):
    scope_area = "trajectories"
    content_negotiation_class = IgnoreClientContentNegotiation

    @extend_schema(
        parameters=[OpenApiParameter("format", str, enum=list(EXPORT_FORMATS), description="trove (default) | atif")],
        responses={(200, CONTENT_TYPE): OpenApiTypes.BINARY}, operation_id="trajectories_export")
    def get(self, request: Request) -> StreamingHttpResponse:
        """The selection (search filters; duplicates left out unless `duplicate=any`) as JSONL, streamed."""
        fmt = check_export_format(request.query_params.get("format") or "trove")
        params = {k: v for k, v in request.query_params.items() if k != "format" and v != ""}
        stream: Iterator[bytes] = trajectories_export(filters=export_filters(params), format=fmt)
        response = StreamingHttpResponse(stream, content_type=CONTENT_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{export_filename(fmt)}"'
        return response


class TrajectoryCurateApi(APIView):
    scope_area = "trajectories"
    required_scopes = {"POST": "trajectories:curate"}
    parser_classes = [BoundedJSONParser]

    @extend_schema(request=CurateInputSerializer, responses=CurationResultSerializer, operation_id="trajectories_curate")
    def post(self, request: Request) -> Response:
        """Apply a curation action to runs given by ids or by a search filter; one event per changed run."""
        if not request.user.has_perm(CURATE_PERMISSION):
            raise PermissionDenied(f"curation needs the {CURATE_PERMISSION} permission")
        given = CurateInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        selection = data["ids"] if "ids" in data else trajectory_search(filters=filters_from_params(data["filter"]))
        result = trajectories_curate(
            trajectories=selection, action=data["action"], actor=request.user, reason=data["reason"],
            tags=data["tags"], note=data["note"], canonical_id=data["canonical"])
        return Response(CurationResultSerializer(result).data)


class SimilarQuerySerializer(serializers.Serializer):
    k = serializers.IntegerField(min_value=1, max_value=100, default=10)
    same_task = serializers.BooleanField(default=True)


class TrajectorySimilarApi(APIView):
    scope_area = "trajectories"
    @extend_schema(parameters=[SimilarQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="trajectories_similar")
    def get(self, request: Request, trajectory_id: int) -> Response:
        """The runs most similar to this one by signature embedding, best first, each with its cosine `score`."""
        query = SimilarQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        pairs = similar_runs(trajectory_id=trajectory_id, k=query.validated_data["k"],
                             same_task=query.validated_data["same_task"])
        rows = TrajectorySerializer([t for t, _ in pairs], many=True, context={"request": request}).data
        return Response({"results": [{**row, "score": round(score, 6)} for row, (_, score) in zip(rows, pairs, strict=True)]})


urlpatterns = [
    path("trajectories/", TrajectoryListApi.as_view(), name="api-trajectories"),
    path("trajectories/import/", TrajectoryImportApi.as_view(), name="api-trajectories-import"),
    path("trajectories/export/", TrajectoryExportApi.as_view(), name="api-trajectories-export"),
    path("trajectories/curate/", TrajectoryCurateApi.as_view(), name="api-trajectories-curate"),
    path("trajectories/<int:trajectory_id>/", TrajectoryDetailApi.as_view(), name="api-trajectory"),
    path("trajectories/<int:trajectory_id>/steps/", TrajectoryStepsApi.as_view(), name="api-trajectory-steps"),
    path("trajectories/<int:trajectory_id>/similar/", TrajectorySimilarApi.as_view(), name="api-trajectory-similar"),
]
