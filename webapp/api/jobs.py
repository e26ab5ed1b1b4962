"""REST API: rollout jobs, their finished rollouts and RL samples (cursors a trainer polls), cancel, re-run, task sets.

Views are thin: input serializer -> service or selector -> output serializer. Domain errors (experience.errors)
become 4xx bodies naming the field in webapp/api/exception_handlers.py. A job names a registered model
endpoint (webapp/api/endpoints.py): no URL and no key, or reference to one, is accepted from a job.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import path, reverse
from django.utils.module_loading import import_string
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from experience.errors import Conflict
from experience.services.rl_samples import run_samples, sample_data
from webapp.api.paging import cursor_page
from webapp.api.parsers import BoundedJSONParser
from webapp.api.ranges import INT_MAX
from webapp.dashboard.live import JobLiveApi
from webapp.rollouts import selectors, services
from webapp.rollouts.models import Rollout, RolloutJob, TaskSet
from webapp.rollouts.taskset_import import taskset_import_jsonl

SECRET_FIELDS = ("api_key", "openai_api_key", "key", "secret")
# Accepted before endpoints were registered objects: a clear error, not a silent drop.
RETIRED_FIELDS = ("model_base_url", "api_key_ref")
DEFAULT_PAGE, MAX_PAGE = 100, 1000
DEFAULT_SAMPLE_PAGE, MAX_SAMPLE_PAGE = 20, 200  # rollouts per samples page: each is assembled from its steps
TRAINING_STATUSES = (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)  # infra errors and cancels are no data



def harness_checked(harness: str, harness_command: str) -> str:
    """The job's harness as stored: `builtin`, `external` (with a command of its own) or a catalogue preset
    as NAME@VERSION (its pinned version filled in). Raises ValueError naming what is wrong. The catalogue
    lives with the workers; it is reached through a setting, so webapp imports nothing of workers."""
    canonical = import_string(settings.TROVE_HARNESS_CANONICAL)(harness)
    if canonical == "external" and not harness_command.strip():
        raise ValueError("harness 'external' runs harness_command in the sandbox: give one, or name a preset")
    if canonical not in ("builtin", "external") and harness_command.strip():
        raise ValueError(f"preset {canonical} runs its own command: leave harness_command empty")
    return canonical


# --- serializers ---------------------------------------------------------------------------------------

class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, default="")
    task_set = serializers.CharField(max_length=100, help_text="task set name")
    task_keys = serializers.ListField(child=serializers.CharField(), required=False, allow_empty=False,
                                      help_text="only these tasks of the set (default: all)")
    fleet = serializers.CharField(max_length=100, help_text="fleet name")
    harness = serializers.CharField(max_length=100, required=False, default="builtin",
                                    help_text="builtin, external (with harness_command), or a preset of the "
                                              "harness catalogue: NAME or NAME@VERSION (claude-code, codex, ...)")
    harness_command = serializers.CharField(required=False, default="", allow_blank=True)
    endpoint = serializers.CharField(max_length=100, help_text="a registered model endpoint's name "
                                                               "(GET /api/v1/endpoints/)")
    model_name = serializers.CharField(max_length=200, required=False, default="",
                                       help_text="one of the endpoint's model_names (default: its first)")
    samples_per_task = serializers.IntegerField(min_value=1, max_value=10_000, default=1)
    max_steps = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    max_tokens = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False, allow_null=True)
    wall_time_s = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    concurrency = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    sampling = serializers.ChoiceField(choices=RolloutJob.Sampling.choices, default=RolloutJob.Sampling.UNIFORM)
    adaptive_first_round = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)

    def validate(self, attrs):
        for field in SECRET_FIELDS + RETIRED_FIELDS:
            if field in self.initial_data:
                raise serializers.ValidationError(
                    {field: "jobs take no URL or key: name a registered model endpoint in `endpoint` "
                            "(GET /api/v1/endpoints/; an admin or ops registers them with their keys)"})
        try:
            attrs["harness"] = harness_checked(attrs.get("harness", "builtin"), attrs.get("harness_command", ""))
        except ValueError as error:
            raise serializers.ValidationError({"harness": str(error)}) from error
        return attrs


class JobSerializer(serializers.ModelSerializer):
    task_set = serializers.CharField(source="task_set.name")
    fleet = serializers.CharField(source="fleet.name")
    endpoint = serializers.CharField(source="endpoint.name", help_text="the model endpoint's name")
    url = serializers.SerializerMethodField()
    rollouts_url = serializers.SerializerMethodField()
    page_url = serializers.SerializerMethodField()

    class Meta:
        model = RolloutJob
        # The endpoint by name: its key is never in a row, and its URL is the endpoint's business.
        fields: tuple[str, ...] = ("id", "name", "status", "task_set", "fleet", "harness", "harness_command", "endpoint",
                  "model_name", "samples_per_task", "max_steps", "max_tokens", "wall_time_s",
                  "concurrency", "sampling", "adaptive_first_round", "created_at", "started_at", "finished_at",
                  "url", "rollouts_url", "page_url")

    def _absolute(self, name: str, job: RolloutJob) -> str:
        return self.context["request"].build_absolute_uri(reverse(name, args=[job.pk]))

    def get_url(self, job) -> str:
        return self._absolute("api-job", job)

    def get_rollouts_url(self, job) -> str:
        return self._absolute("api-job-rollouts", job)

    def get_page_url(self, job) -> str:
        return self._absolute("dashboard:job", job)


class JobListItemSerializer(JobSerializer):
    n_rollouts = serializers.IntegerField(read_only=True)
    n_finished = serializers.IntegerField(read_only=True)
    n_succeeded = serializers.IntegerField(read_only=True)
    n_running = serializers.IntegerField(read_only=True, help_text="never more than concurrency")

    class Meta(JobSerializer.Meta):
        fields = (*JobSerializer.Meta.fields, "n_rollouts", "n_finished", "n_succeeded", "n_running")


class TaskBudgetSerializer(serializers.Serializer):
    task = serializers.CharField()
    spent = serializers.IntegerField(help_text="samples issued to a worker (running, or finished after running)")
    issued = serializers.IntegerField(help_text="rollouts created, queued ones included")
    queued = serializers.IntegerField(help_text="waiting for a slot of the job's concurrency")
    running = serializers.IntegerField()
    open = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    infra_error = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    pass_rate = serializers.FloatField(allow_null=True)
    stopped = serializers.BooleanField()
    stopped_because = serializers.CharField(allow_null=True)


class BudgetSerializer(serializers.Serializer):
    policy = serializers.CharField()
    first_round = serializers.IntegerField()
    total = serializers.IntegerField(help_text="samples_per_task x number of tasks")
    spent = serializers.IntegerField(help_text="samples issued to a worker (running, or finished after running), "
                                               "re-runs included")
    created = serializers.IntegerField(help_text="rollouts created, queued ones and re-runs included")
    queued = serializers.IntegerField(help_text="created, waiting for a slot of the job's concurrency")
    unspent = serializers.IntegerField(help_text="total - spent")
    may_still_spend = serializers.IntegerField(help_text="0 once every task has stopped or the job has ended")
    per_task = TaskBudgetSerializer(many=True)


class ProgressSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="rollouts created plus those an adaptive job may still create")
    issued = serializers.IntegerField()
    finished = serializers.IntegerField()
    running = serializers.IntegerField(help_text="never more than concurrency")
    queued = serializers.IntegerField()
    concurrency = serializers.IntegerField(help_text="the job's limit on rollouts running at once")
    percent = serializers.IntegerField()
    success_rate = serializers.FloatField(allow_null=True, help_text="succeeded / (succeeded + failed)")
    by_status = serializers.DictField(child=serializers.IntegerField())


class JobDetailSerializer(JobSerializer):
    progress = ProgressSerializer(read_only=True)
    budget = BudgetSerializer(read_only=True)

    class Meta(JobSerializer.Meta):
        fields = (*JobSerializer.Meta.fields, "progress", "budget")


class RolloutSerializer(serializers.ModelSerializer):
    cursor = serializers.CharField(source="finish_seq", help_text="pass as ?after= to get what finished later")
    task = serializers.CharField(source="task.key")
    trajectory_url = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = ("id", "cursor", "job", "task", "sample_index", "status", "reward", "steps", "attempt", "error",
                  "started_at", "finished_at", "trajectory_id", "trajectory_url", "rerun_of")

    def get_trajectory_url(self, rollout) -> str | None:
        if not rollout.trajectory_id:
            return None
        return self.context["request"].build_absolute_uri(reverse("dashboard:trajectory", args=[rollout.trajectory_id]))


class RolloutPageSerializer(serializers.Serializer):
    results = RolloutSerializer(many=True)
    next_cursor = serializers.CharField(help_text="pass as ?after= on the next poll")
    has_more = serializers.BooleanField(help_text="more finished rollouts are waiting: poll again now")
    job_status = serializers.CharField()
    done = serializers.BooleanField(help_text="the job has ended and everything it finished is in your hands")


class RolloutPageQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=0, help_text="a cursor from an earlier page (0: from the start)")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=DEFAULT_PAGE)


class SampleSerializer(serializers.Serializer):
    cursor = serializers.CharField(help_text="the rollout's cursor: pass as ?after= to get what finished later")
    rollout_id = serializers.IntegerField()
    task = serializers.CharField()
    rollout_sample_index = serializers.IntegerField()
    rollout_status = serializers.CharField()
    reward = serializers.FloatField(allow_null=True)
    trajectory_id = serializers.IntegerField()
    sample = serializers.IntegerField(help_text="the sample's index within its rollout")
    exact = serializers.BooleanField(help_text="token ids as the server returned them; false: re-tokenised")
    token_ids = serializers.ListField(child=serializers.IntegerField())
    loss_mask = serializers.ListField(child=serializers.IntegerField(), help_text="1: the policy generated the token")
    logprobs = serializers.ListField(child=serializers.FloatField(allow_null=True))
    calls = serializers.ListField(child=serializers.IntegerField(), help_text="the step seqs of its model calls")
    policy_version = serializers.CharField(allow_null=True)
    policy_versions = serializers.ListField(child=serializers.CharField())
    fork = serializers.DictField(allow_null=True, help_text="why this sample started (cause, message, token)")


class SkippedRolloutSerializer(serializers.Serializer):
    rollout_id = serializers.IntegerField()
    cursor = serializers.CharField()
    reason = serializers.CharField()


class SamplePageSerializer(serializers.Serializer):
    results = SampleSerializer(many=True)
    skipped = SkippedRolloutSerializer(many=True, help_text="finished rollouts of the page that gave no samples")
    next_cursor = serializers.CharField(help_text="pass as ?after= on the next poll")
    has_more = serializers.BooleanField(help_text="more finished rollouts are waiting: poll again now")
    job_status = serializers.CharField()
    done = serializers.BooleanField(help_text="the job has ended and every sample it made is in your hands")


class SamplePageQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=0, max_value=INT_MAX, default=0, help_text="a cursor from an earlier page (0: from the start)")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_SAMPLE_PAGE, default=DEFAULT_SAMPLE_PAGE,
                                     help_text="rollouts per page (each gives its samples)")


class RerunInputSerializer(serializers.Serializer):
    statuses = serializers.ListField(child=serializers.ChoiceField(choices=services.RERUNNABLE),
                                     required=False, allow_empty=False)


class CancelOutputSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()
    job = JobSerializer()


class RerunOutputSerializer(serializers.Serializer):
    created = RolloutSerializer(many=True)
    job = JobSerializer()


class TaskSetSerializer(serializers.ModelSerializer):
    n_tasks = serializers.IntegerField(read_only=True)

    class Meta:
        model = TaskSet
        fields = ("id", "name", "description", "source", "n_tasks", "created_at")


class TaskSetUploadSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, default="", allow_blank=True)
    file = serializers.FileField(required=False, help_text="the JSONL file (multipart)")
    jsonl = serializers.CharField(required=False, trim_whitespace=False, help_text="or the JSONL text itself")

    def validate(self, attrs):
        if ("file" in attrs) == ("jsonl" in attrs):
            raise serializers.ValidationError({"file": "send the JSONL as `file` (multipart) or as `jsonl`, one of them"})
        return attrs


class JobPagination(CursorPagination):
    ordering = "-id"
    page_size = 50


class TaskSetPagination(CursorPagination):
    ordering = "name"
    page_size = 100


# --- views ---------------------------------------------------------------------------------------------

class JobListApi(APIView):
    scope_area = "jobs"
    pagination_class = JobPagination  # for the schema: the list is a cursor page
    @extend_schema(responses=JobListItemSerializer(many=True), operation_id="jobs_list")
    def get(self, request: Request) -> Response:
        return cursor_page(self, request, selectors.job_list(), pagination=JobPagination,
                           serializer=JobListItemSerializer, context={"request": request})

    @extend_schema(request=JobSubmitSerializer, responses={201: JobDetailSerializer}, operation_id="jobs_submit")
    def post(self, request: Request) -> Response:
        given = JobSubmitSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        fields = dict(given.validated_data)
        job = services.job_submit(task_set_name=fields.pop("task_set"), fleet_name=fields.pop("fleet"),
                                  endpoint_name=fields.pop("endpoint"), created_by=request.user, **fields)
        detail = selectors.job_detail(job_id=job.pk)
        return Response(JobDetailSerializer(detail, context={"request": request}).data, status=status.HTTP_201_CREATED)


class JobDetailApi(APIView):
    scope_area = "jobs"
    @extend_schema(responses=JobDetailSerializer, operation_id="jobs_status")
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.job_detail(job_id=job_id)
        return Response(JobDetailSerializer(job, context={"request": request}).data)


class JobRolloutsApi(APIView):
    scope_area = "jobs"
    @extend_schema(parameters=[RolloutPageQuerySerializer], responses=RolloutPageSerializer, operation_id="jobs_rollouts")
    def get(self, request: Request, job_id: int) -> Response:
        """Finished rollouts in the order they finished, after the cursor `after`. Poll with `next_cursor`."""
        query = RolloutPageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        # The job's status is read before its rollouts: if it had ended then, every rollout it finished
        # was committed before this read, so `done` can't be true while a finished rollout is still unseen.
        job = selectors.job_get(job_id=job_id)
        limit = query.validated_data["limit"]
        rows = selectors.job_finished_rollouts(job_id=job.pk, after=query.validated_data["after"], limit=limit + 1)
        has_more, rows = len(rows) > limit, rows[:limit]
        page = {
            "results": rows,
            "next_cursor": str(rows[-1].finish_seq if rows else query.validated_data["after"]),
            "has_more": has_more, "job_status": job.status,
            "done": job.status not in selectors.JOB_OPEN and not has_more,
        }
        return Response(RolloutPageSerializer(page, context={"request": request}).data)


class JobSamplesApi(APIView):
    scope_area = "jobs"
    @extend_schema(parameters=[SamplePageQuerySerializer], responses=SamplePageSerializer, operation_id="jobs_samples")
    def get(self, request: Request, job_id: int) -> Response:
        """The RL samples of finished rollouts in the order they finished, after the cursor `after` (the same
        cursor as /rollouts/). Poll with `next_cursor` until `done`."""
        query = SamplePageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        job = selectors.job_get(job_id=job_id)  # before the rollouts: see JobRolloutsApi
        after, limit = query.validated_data["after"], query.validated_data["limit"]
        rows = selectors.job_finished_rollouts(job_id=job.pk, after=after, limit=limit + 1)
        has_more, rows = len(rows) > limit, rows[:limit]
        results, skipped = _rollout_samples(rows)
        page = {
            "results": results, "skipped": skipped,
            "next_cursor": str(rows[-1].finish_seq if rows else after),
            "has_more": has_more, "job_status": job.status,
            "done": job.status not in selectors.JOB_OPEN and not has_more,
        }
        return Response(SamplePageSerializer(page).data)


def _rollout_samples(rollouts: list[Rollout]) -> tuple[list[dict], list[dict]]:
    """The samples of the rollouts that are training data, and why each other rollout gave none."""
    usable = {r.pk: r.trajectory_id for r in rollouts if r.status in TRAINING_STATUSES and r.trajectory_id}
    assemblies = run_samples(trajectory_ids=list(usable.values()))
    results, skipped = [], []
    for rollout in rollouts:
        trajectory_id = usable.get(rollout.pk)
        assembly = assemblies.get(trajectory_id) if trajectory_id else None
        if assembly is None or not assembly.samples:
            reason = assembly.note if assembly is not None else f"rollout {rollout.status}"
            skipped.append({"rollout_id": rollout.pk, "cursor": str(rollout.finish_seq), "reason": reason})
            continue
        head = {"cursor": str(rollout.finish_seq), "rollout_id": rollout.pk, "task": rollout.task.key,
                "rollout_sample_index": rollout.sample_index, "rollout_status": rollout.status,
                "reward": rollout.reward, "trajectory_id": rollout.trajectory_id}
        results += [{**head, **sample_data(sample)} for sample in assembly.samples]
    return results, skipped


class JobCancelApi(APIView):
    scope_area = "jobs"
    @extend_schema(request=None, responses=CancelOutputSerializer, operation_id="jobs_cancel")
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get(job_id=job_id)
        cancelled = services.job_cancel(job=job)
        return Response(CancelOutputSerializer({"cancelled": cancelled, "job": job}, context={"request": request}).data)


class JobRerunFailedApi(APIView):
    scope_area = "jobs"
    @extend_schema(request=RerunInputSerializer, responses={201: RerunOutputSerializer}, operation_id="jobs_rerun_failed")
    def post(self, request: Request, job_id: int) -> Response:
        """Re-run the job's failed and infra_error samples (or only `statuses`) as new samples of the same job."""
        given = RerunInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        job = selectors.job_get(job_id=job_id)
        created = services.job_rerun_failed(job=job, **given.validated_data)
        job = selectors.job_get(job_id=job_id)
        body = RerunOutputSerializer({"created": created, "job": job}, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class RolloutCancelApi(APIView):
    scope_area = "jobs"
    @extend_schema(request=None, responses=RolloutSerializer, operation_id="rollouts_cancel")
    def post(self, request: Request, rollout_id: int) -> Response:
        rollout = selectors.rollout_get(rollout_id=rollout_id)
        if not services.rollout_cancel(rollout=rollout):
            raise Conflict(f"rollout {rollout_id} has already finished ({rollout.status})", field="status")
        return Response(RolloutSerializer(rollout, context={"request": request}).data)


class TaskSetListApi(APIView):
    scope_area = "jobs"
    pagination_class = TaskSetPagination
    parser_classes = [MultiPartParser, FormParser, BoundedJSONParser]

    @extend_schema(responses=TaskSetSerializer(many=True), operation_id="task_sets_list")
    def get(self, request: Request) -> Response:
        return cursor_page(self, request, selectors.taskset_list(), pagination=TaskSetPagination,
                           serializer=TaskSetSerializer)

    @extend_schema(request=TaskSetUploadSerializer, responses={201: TaskSetSerializer}, operation_id="task_sets_upload")
    def post(self, request: Request) -> Response:
        """Import a JSONL task set (see webapp/rollouts/taskset_import.py for the fields). All or nothing."""
        given = TaskSetUploadSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        lines = data["file"] if "file" in data else data["jsonl"].splitlines()
        task_set = taskset_import_jsonl(name=data["name"], fileobj=lines, description=data["description"])
        task_set = selectors.taskset_list().get(pk=task_set.pk)
        return Response(TaskSetSerializer(task_set).data, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("jobs/", JobListApi.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>/", JobDetailApi.as_view(), name="api-job"),
    path("jobs/<int:job_id>/rollouts/", JobRolloutsApi.as_view(), name="api-job-rollouts"),
    path("jobs/<int:job_id>/samples/", JobSamplesApi.as_view(), name="api-job-samples"),
    path("jobs/<int:job_id>/cancel/", JobCancelApi.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/rerun-failed/", JobRerunFailedApi.as_view(), name="api-job-rerun-failed"),
    path("jobs/<int:job_id>/live/", JobLiveApi.as_view(), name="job-live"),
    path("rollouts/<int:rollout_id>/cancel/", RolloutCancelApi.as_view(), name="api-rollout-cancel"),
    path("task-sets/", TaskSetListApi.as_view(), name="api-task-sets"),
]
