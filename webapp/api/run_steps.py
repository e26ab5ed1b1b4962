"""The run page's API: step views in pages or by seq, the run's step index, a model call's context lens and
search within a run. Responses are gzip-compressed (a 30,000-step index is ~1 MB of JSON, ~150 KB on the
wire); none of them carries a CSRF token or a secret beside reflected input, so BREACH has nothing to read.

- `GET /api/v1/trajectories/<id>/steps/view/?after=<seq>&limit=` or `?seqs=3,4,9`: step views (the step
  view model, `experience.steps_view`), tool calls linked to their results; `next_after` pages on.
- `GET /api/v1/trajectories/<id>/steps/<seq>/view/`: one step's view with its whole output.
- `GET /api/v1/trajectories/<id>/steps/index/`: every step in columns (timeline, filters, jumps).
- `GET /api/v1/trajectories/<id>/steps/<seq>/context/?unchanged=1`: the context lens of a model call.
- `GET /api/v1/trajectories/<id>/steps/search/?q=`: seqs of the steps that hold `q`.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.errors import NotFound
from experience.run_steps import (
    MAX_PAGE,
    MAX_QUERY,
    PAGE,
    run_context_lens,
    run_search,
    run_step_index,
    step_view_one,
    step_views,
)
from experience.selectors import trajectory_get
from webapp.api.ranges import INT_MAX


class StepViewsQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=-1, max_value=INT_MAX, default=-1)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=PAGE)
    seqs = serializers.RegexField(r"^\d{1,10}(,\d{1,10}){0,199}$", required=False,
                                  help_text="comma-separated seqs (at most 200) instead of after/limit")

    def validate_seqs(self, value: str) -> list[int]:
        seqs = [int(s) for s in value.split(",")]
        if max(seqs) > INT_MAX:
            raise serializers.ValidationError(f"a seq is at most {INT_MAX}")
        return seqs


class ContextQuerySerializer(serializers.Serializer):
    unchanged = serializers.BooleanField(default=False, help_text="also the messages unchanged since the last call")


class SearchQuerySerializer(serializers.Serializer):
    q = serializers.CharField(max_length=MAX_QUERY)


def _query(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


def _check_seq(trajectory_id: int, seq: int) -> None:
    """A seq past the column's range names no step (rather than reaching the database as an error)."""
    if seq > INT_MAX:
        raise NotFound(f"trajectory {trajectory_id} has no step {seq}")


@method_decorator(gzip_page, name="dispatch")
class StepViewsApi(APIView):
    scope_area = "trajectories"

    @extend_schema(parameters=[StepViewsQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="steps_view")
    def get(self, request: Request, trajectory_id: int) -> Response:
        """Step views after `after`, or the steps named by `seqs`, in order."""
        args = _query(StepViewsQuerySerializer, request)
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        views, last = step_views(trajectory=trajectory, seqs=args.get("seqs"), after=args["after"], limit=args["limit"])
        return Response({"results": views, "next_after": last})


@method_decorator(gzip_page, name="dispatch")
class StepViewApi(APIView):
    scope_area = "trajectories"

    @extend_schema(responses=OpenApiTypes.OBJECT, operation_id="step_view")
    def get(self, request: Request, trajectory_id: int, seq: int) -> Response:
        """One step's view, its output whole."""
        _check_seq(trajectory_id, seq)
        return Response(step_view_one(trajectory=trajectory_get(trajectory_id=trajectory_id), seq=seq))


@method_decorator(gzip_page, name="dispatch")
class StepIndexApi(APIView):
    scope_area = "trajectories"

    @extend_schema(responses=OpenApiTypes.OBJECT, operation_id="steps_index")
    def get(self, request: Request, trajectory_id: int) -> Response:
        """Every step of the run in columns: seq, kind, start, duration, flags, value; and the jump marks."""
        return Response(run_step_index(trajectory=trajectory_get(trajectory_id=trajectory_id)))


@method_decorator(gzip_page, name="dispatch")
class StepContextApi(APIView):
    scope_area = "trajectories"

    @extend_schema(parameters=[ContextQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="step_context")
    def get(self, request: Request, trajectory_id: int, seq: int) -> Response:
        """A model call's context against the previous call's: unchanged, new, rewritten."""
        args = _query(ContextQuerySerializer, request)
        _check_seq(trajectory_id, seq)
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        return Response(run_context_lens(trajectory=trajectory, seq=seq, unchanged=args["unchanged"]))


@method_decorator(gzip_page, name="dispatch")
class StepSearchApi(APIView):
    scope_area = "trajectories"

    @extend_schema(parameters=[SearchQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="steps_search")
    def get(self, request: Request, trajectory_id: int) -> Response:
        """Seqs of the steps holding `q`, in order (at most 1,000)."""
        args = _query(SearchQuerySerializer, request)
        seqs = run_search(trajectory=trajectory_get(trajectory_id=trajectory_id), q=args["q"])
        return Response({"seqs": seqs})


urlpatterns = [
    path("trajectories/<int:trajectory_id>/steps/view/", StepViewsApi.as_view(), name="api-steps-view"),
    path("trajectories/<int:trajectory_id>/steps/index/", StepIndexApi.as_view(), name="api-steps-index"),
    path("trajectories/<int:trajectory_id>/steps/search/", StepSearchApi.as_view(), name="api-steps-search"),
    path("trajectories/<int:trajectory_id>/steps/<int:seq>/view/", StepViewApi.as_view(), name="api-step-view"),
    path("trajectories/<int:trajectory_id>/steps/<int:seq>/context/", StepContextApi.as_view(),
         name="api-step-context"),
]
