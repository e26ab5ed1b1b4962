"""REST API: datasets. Views are thin: input serializer -> service -> output serializer.

- `POST /api/v1/datasets/` creates a dataset from a spec (name, kind, filters, options) and, unless
  `build` is false, requests its first version. A spec that matches nothing is a 422 naming the reason,
  and nothing is created. So is a build whose split would be empty (`empty_split`, field `options.splits`:
  which split, how the tasks fall, a seed that fills every split), unless `force` is true; a forced
  version keeps the warning (`forced_warnings`) and its manifest says so (`split_check`).
- `GET /api/v1/datasets/`, `GET /api/v1/datasets/<name or id>/`: datasets and their versions.
- `POST /api/v1/datasets/<name>/versions/`: build a new version (202; a worker builds it, poll its URL);
  `{"force": true}` builds it even when a split would be empty.
- `GET /api/v1/datasets/<name>/versions/<n>/`: status, manifest, metrics and file URLs.
- `GET /api/v1/datasets/<name>/versions/<n>/files/<file>`: the file itself, streamed.
- `GET /api/v1/dataset-versions/compare/?a=<name>@<n>&b=<name>@<n>`: what changed between two versions.
"""

from __future__ import annotations

from django.db import transaction
from django.http import FileResponse
from django.urls import path, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.distill.spec import KINDS
from experience.models import Dataset, DatasetVersion
from experience.services import datasets
from webapp.dashboard.datasets import enqueue_dataset_build

# --- serializers ---------------------------------------------------------------------------------------


class DatasetCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text="letters, digits, '.', '_', '-' (it names a directory)")
    kind = serializers.ChoiceField(choices=KINDS)
    filters = serializers.DictField(required=False, default=dict, help_text=(
        "task_sets, task_keys, models, harnesses, sources, curation, tags (lists), outcome "
        "(success|failure), created_after / created_before (ISO dates)"))
    options = serializers.DictField(required=False, default=dict, help_text=(
        "spec options: gamma, context_budget_tokens, neg_pos_ratio, splits, group_by, include_duplicates, "
        "include_rejected, sft_mode, max_pairs_per_task, seed"))
    build = serializers.BooleanField(default=True, help_text="request the first version now")  # fmt: skip
    force = serializers.BooleanField(default=False, help_text="build even when a split would be empty")


class VersionBuildSerializer(serializers.Serializer):
    force = serializers.BooleanField(default=False, help_text="build even when a split would be empty")


class VersionSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name")
    url = serializers.SerializerMethodField()
    page_url = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField(help_text="runs and steps read so far, while building")

    class Meta:
        model = DatasetVersion
        fields: tuple[str, ...] = ("id", "dataset", "version", "status", "content_hash", "row_count", "error",
                                   "forced_warnings", "progress", "created_at", "finished_at", "url",
                                   "page_url")  # fmt: skip

    def _absolute(self, name: str, version: DatasetVersion) -> str:
        return self.context["request"].build_absolute_uri(reverse(name, args=[version.dataset.name, version.version]))

    def get_url(self, version: DatasetVersion) -> str:
        return self._absolute("api-dataset-version", version)

    def get_page_url(self, version: DatasetVersion) -> str:
        return self._absolute("dashboard:dataset-version", version)

    def get_progress(self, version: DatasetVersion) -> dict | None:
        return (version.manifest or {}).get("progress") if version.status == DatasetVersion.Status.BUILDING else None


class VersionDetailSerializer(VersionSerializer):
    files = serializers.SerializerMethodField()

    class Meta(VersionSerializer.Meta):
        fields = (*VersionSerializer.Meta.fields, "spec", "manifest", "metrics", "files")

    def get_files(self, version: DatasetVersion) -> list[dict]:
        described = {entry["name"]: entry for entry in (version.manifest or {}).get("files", [])}
        request = self.context["request"]
        return [
            described.get(name, {"name": name})
            | {"url": request.build_absolute_uri(
                reverse("api-dataset-file", args=[version.dataset.name, version.version, name]))}
            for name in sorted(version.files)
        ]  # fmt: skip


class DatasetSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None)
    url = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields: tuple[str, ...] = ("id", "name", "kind", "filters", "options", "created_by", "created_at", "url")

    def get_url(self, dataset: Dataset) -> str:
        return self.context["request"].build_absolute_uri(reverse("api-dataset", args=[dataset.name]))


class DatasetListItemSerializer(DatasetSerializer):
    n_versions = serializers.IntegerField(read_only=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta(DatasetSerializer.Meta):
        fields = (*DatasetSerializer.Meta.fields, "n_versions", "latest_version")


class DatasetDetailSerializer(DatasetSerializer):
    versions = serializers.SerializerMethodField()

    class Meta(DatasetSerializer.Meta):
        fields = (*DatasetSerializer.Meta.fields, "versions")

    def get_versions(self, dataset: Dataset) -> list[dict]:
        versions = dataset.versions.select_related("dataset").order_by("-version")
        return list(VersionSerializer(versions, many=True, context=self.context).data)


class CreatedSerializer(serializers.Serializer):
    dataset = DatasetSerializer()
    version = VersionSerializer(allow_null=True)


class CompareQuerySerializer(serializers.Serializer):
    a = serializers.CharField(help_text="NAME@N or a version id")
    b = serializers.CharField(help_text="NAME@N or a version id")


class DatasetPagination(CursorPagination):
    ordering = "name"
    page_size = 100


# --- views ---------------------------------------------------------------------------------------------


class DatasetListApi(APIView):
    scope_area = "datasets"
    pagination_class = DatasetPagination  # for the schema: the list is a cursor page
    @extend_schema(responses=DatasetListItemSerializer(many=True), operation_id="datasets_list")
    def get(self, request: Request) -> Response:
        paginator = DatasetPagination()
        page = paginator.paginate_queryset(datasets.dataset_list().select_related("created_by"), request, view=self)
        body = DatasetListItemSerializer(page, many=True, context={"request": request}).data
        return paginator.get_paginated_response(body)

    @extend_schema(request=DatasetCreateSerializer, responses={201: CreatedSerializer}, operation_id="datasets_create")
    def post(self, request: Request) -> Response:
        given = DatasetCreateSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fields = dict(given.validated_data)
        build, force = fields.pop("build"), fields.pop("force")
        # One transaction: a spec refused at the first build leaves no dataset behind either.
        with transaction.atomic():
            dataset = datasets.dataset_create(created_by=request.user, **fields)
            version = (datasets.dataset_version_request(dataset=dataset, enqueue=enqueue_dataset_build, force=force)
                       if build else None)
        body = CreatedSerializer({"dataset": dataset, "version": version}, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class DatasetDetailApi(APIView):
    scope_area = "datasets"
    @extend_schema(responses=DatasetDetailSerializer, operation_id="datasets_detail")
    def get(self, request: Request, ref: str) -> Response:
        dataset = datasets.dataset_get(ref=ref)
        return Response(DatasetDetailSerializer(dataset, context={"request": request}).data)


class VersionListApi(APIView):
    scope_area = "datasets"
    @extend_schema(request=VersionBuildSerializer, responses={202: VersionSerializer},
                   operation_id="dataset_versions_build")
    def post(self, request: Request, ref: str) -> Response:
        """Build a new version from the dataset's spec as it is now. Poll the version's `url`."""
        given = VersionBuildSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        dataset = datasets.dataset_get(ref=ref)
        version = datasets.dataset_version_request(dataset=dataset, enqueue=enqueue_dataset_build,
                                                   force=given.validated_data["force"])
        return Response(VersionSerializer(version, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)


class VersionDetailApi(APIView):
    scope_area = "datasets"
    @extend_schema(responses=VersionDetailSerializer, operation_id="dataset_versions_detail")
    def get(self, request: Request, ref: str, version: int) -> Response:
        found = datasets.dataset_version_get(dataset=datasets.dataset_get(ref=ref), version=version)
        return Response(VersionDetailSerializer(found, context={"request": request}).data)


class VersionFileApi(APIView):
    scope_area = "datasets"
    @extend_schema(responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY)},
                   operation_id="dataset_versions_file")  # fmt: skip
    def get(self, request: Request, ref: str, version: int, name: str) -> FileResponse:
        """One file of a ready version, streamed from disk (`Authorization: Token ...`)."""
        found = datasets.dataset_version_get(dataset=datasets.dataset_get(ref=ref), version=version)
        path = datasets.version_file(version=found, name=name)
        return FileResponse(path.open("rb"), as_attachment=True, filename=f"{found.dataset.name}-v{version}-{name}")

    def perform_content_negotiation(self, request, force=False):
        # A download client may accept only application/octet-stream; errors still go out as JSON.
        return super().perform_content_negotiation(request, force=True)


class VersionCompareApi(APIView):
    scope_area = "datasets"
    @extend_schema(parameters=[CompareQuerySerializer], responses=OpenApiTypes.OBJECT, operation_id="dataset_versions_compare")
    def get(self, request: Request) -> Response:
        query = CompareQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        a = datasets.dataset_version_resolve(ref=query.validated_data["a"])
        b = datasets.dataset_version_resolve(ref=query.validated_data["b"])
        return Response(datasets.version_compare(a=a, b=b))


urlpatterns = [
    path("datasets/", DatasetListApi.as_view(), name="api-datasets"),
    path("datasets/<str:ref>/", DatasetDetailApi.as_view(), name="api-dataset"),
    path("datasets/<str:ref>/versions/", VersionListApi.as_view(), name="api-dataset-versions"),
    path("datasets/<str:ref>/versions/<int:version>/", VersionDetailApi.as_view(), name="api-dataset-version"),
    path("datasets/<str:ref>/versions/<int:version>/files/<str:name>", VersionFileApi.as_view(), name="api-dataset-file"),
    path("dataset-versions/compare/", VersionCompareApi.as_view(), name="api-dataset-compare"),
]
