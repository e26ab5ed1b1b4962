"""Jobs across runs in the browser: the jobs list (filters, status, progress, success rate), starting a job,
cancelling a job or one rollout, and re-running a job's failed samples.

Thin: a form, a service from webapp.rollouts.services, a template. Every action that starts or ends work first
answers with a confirmation page naming what it will do (webapp.dashboard.confirm).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import NotFound, TroveError
from webapp.access.permissions import scope_required
from webapp.api.ranges import INT_MAX
from webapp.dashboard import selectors
from webapp.dashboard.confirm import confirmation_page, is_confirmed
from webapp.fleets.models import Fleet
from webapp.rollouts import selectors as rollout_selectors
from webapp.rollouts import services
from webapp.rollouts.endpoints import endpoint_list
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, TaskSet

JOBS_PAGE = 50
JOB_FILTERS = ("status", "task_set", "fleet", "q")


# --- the list ---------------------------------------------------------------------------------------------

@scope_required("jobs")
def job_list(request: HttpRequest) -> HttpResponse:
    params = {name: request.GET[name] for name in JOB_FILTERS if request.GET.get(name)}
    before = request.GET.get("before", "")
    jobs, next_before = selectors.jobs_page(
        status=params.get("status", ""), task_set=params.get("task_set", ""), fleet=params.get("fleet", ""),
        q=params.get("q", ""), before=int(before) if before.isdigit() else None, limit=JOBS_PAGE)
    query = urlencode({**params, "before": next_before}) if next_before else ""
    return render(request, "dashboard/jobs.html", {
        "jobs": jobs, "params": params, "statuses": RolloutJob.Status.values,
        "task_sets": TaskSet.objects.order_by("name").values_list("name", flat=True),
        "fleets": Fleet.objects.order_by("name").values_list("name", flat=True),
        "next_url": f"{reverse('dashboard:jobs')}?{query}" if query else None,
    })


# --- start ------------------------------------------------------------------------------------------------

class JobStartForm(forms.Form):
    """What the API's job submit takes, as a form over the rows that exist (registered model endpoints)."""

    name = forms.CharField(max_length=200, required=False)
    task_set = forms.ModelChoiceField(queryset=TaskSet.objects.order_by("name"), to_field_name="name")
    task_keys = forms.CharField(required=False, help_text="comma-separated task keys; empty: every task")
    fleet = forms.ModelChoiceField(queryset=Fleet.objects.select_related("template").order_by("name"),
                                   to_field_name="name")
    endpoint = forms.ModelChoiceField(queryset=ModelEndpoint.objects.none(), to_field_name="name",
                                      help_text="a registered model endpoint")
    model_name = forms.CharField(max_length=200, required=False, help_text="empty: the endpoint's first model")
    harness = forms.CharField(max_length=100, initial="builtin",
                              help_text="builtin, external (give a command), or a preset: mini-swe-agent, opencode, "
                                        "codex, claude-code, qwen-code, gemini-cli (NAME@VERSION for another version)")
    harness_command = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                      help_text="external harness: the command run in the sandbox")
    samples_per_task = forms.IntegerField(min_value=1, max_value=10_000, initial=1)
    sampling = forms.ChoiceField(choices=RolloutJob.Sampling.choices, initial=RolloutJob.Sampling.UNIFORM)
    adaptive_first_round = forms.IntegerField(min_value=1, max_value=INT_MAX, initial=2)
    max_steps = forms.IntegerField(min_value=1, max_value=INT_MAX, initial=30)
    max_tokens = forms.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    wall_time_s = forms.IntegerField(min_value=1, max_value=INT_MAX, initial=600)
    concurrency = forms.IntegerField(min_value=1, max_value=INT_MAX, initial=4)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        endpoint = self.fields["endpoint"]
        assert isinstance(endpoint, forms.ModelChoiceField)
        endpoint.queryset = endpoint_list()

    def clean(self):
        data = super().clean()
        from webapp.api.jobs import harness_checked  # the API's own check, so both say the same

        try:
            data["harness"] = harness_checked(data.get("harness") or "builtin", data.get("harness_command") or "")
        except ValueError as error:
            self.add_error("harness", str(error))
        return data

    def clean_task_keys(self) -> list[str] | None:
        keys = [key.strip() for key in self.cleaned_data["task_keys"].split(",") if key.strip()]
        return keys or None


def job_start_summary(data: dict) -> list[str]:
    """What starting this job does, in the words and numbers the confirmation shows."""
    task_set, endpoint, fleet = data["task_set"], data["endpoint"], data["fleet"]
    keys = data["task_keys"]
    n_tasks = len(keys) if keys else task_set.tasks.count()
    samples = data["samples_per_task"]
    model = data["model_name"] or (endpoint.model_names[0] if endpoint.model_names else "?")
    if data["sampling"] == RolloutJob.Sampling.ADAPTIVE:
        first = min(data["adaptive_first_round"], samples)
        runs = (f"{n_tasks} task(s) × {first} sample(s) now (adaptive first round), up to {samples} per task: "
                f"at most {n_tasks * samples} rollouts")
    else:
        runs = f"{n_tasks} task(s) × {samples} sample(s) = {n_tasks * samples} rollouts"
    budget = f"each at most {data['max_steps']} steps and {data['wall_time_s']} s"
    if data["max_tokens"]:
        budget += f" and {data['max_tokens']} tokens"
    return [
        f"start a job on task set {task_set.name}{' (tasks ' + ', '.join(keys) + ')' if keys else ''}: {runs}",
        f"run them in sandboxes of fleet {fleet.name} ({fleet.template}), at most {data['concurrency']} at once",
        f"send every model call to {model} at endpoint {endpoint.name} ({endpoint.base_url})",
        f"with harness {data['harness']}{': ' + data['harness_command'] if data['harness_command'] else ''}; {budget}",
    ]


@scope_required("jobs")
def job_start(request: HttpRequest) -> HttpResponse:
    form = JobStartForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        if not is_confirmed(request):
            return confirmation_page(request, title="Start this job", will=job_start_summary(data),
                                     button="Start the job", back_url=reverse("dashboard:job-start"), danger=False)
        try:
            job = services.job_create(created_by=request.user, **_job_fields(data))
        except TroveError as error:
            form.add_error(error.field if error.field in form.fields else None, error.message)
        else:
            messages.success(request, f"{job} started: {job.rollouts.count()} rollouts created.")
            return redirect("dashboard:job", job.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/job_start.html", {"form": form}, status=status)


def _job_fields(data: dict) -> dict:
    fields = dict(data)
    fields["max_tokens"] = fields["max_tokens"] or None
    return fields


# --- cancel and re-run ------------------------------------------------------------------------------------

@scope_required("jobs")
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(job_id)
    if not is_confirmed(request):
        progress = rollout_selectors.job_progress(job=job)
        return confirmation_page(request, title=f"Cancel {job}", back_url=reverse("dashboard:job", args=[job.pk]),
                                 button="Cancel the job", will=[
            f"end job {job.pk} ({job.status}) as cancelled: nothing more is planned or started",
            f"cancel its {progress['queued']} queued and {progress['running']} running rollouts (a running one "
            "stops at its next heartbeat)",
            f"keep its {progress['finished']} finished rollouts and their runs as they are"])
    cancelled = services.job_cancel(job=job)
    messages.success(request, f"{job} cancelled: {cancelled} open rollouts ended.")
    return redirect("dashboard:job", job.pk)


@scope_required("jobs")
@require_POST
def job_rerun_failed(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(job_id)
    back = reverse("dashboard:job", args=[job.pk])
    if not is_confirmed(request):
        rerunnable = selectors.job_rerunnable_counts(job=job)
        return confirmation_page(request, title=f"Re-run the failed samples of {job}", back_url=back,
                                 button="Re-run them", danger=False, will=[
            f"create {sum(rerunnable.values())} new rollouts in job {job.pk}, one per sample not re-run yet that "
            f"ended {', '.join(f'{status} ({n})' for status, n in rerunnable.items())}",
            "leave the old rollouts as they are (each new one points back at the one it re-runs)",
            "reopen the job; re-runs are spent on top of its budget"])
    try:
        created = services.job_rerun_failed(job=job)
    except TroveError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"{job}: {len(created)} failed samples re-run.")
    return redirect(back)


@scope_required("jobs")
@require_POST
def rollout_cancel(request: HttpRequest, rollout_id: int) -> HttpResponse:
    rollout = Rollout.objects.select_related("job", "task").filter(pk=rollout_id).first()
    if rollout is None:
        raise Http404(f"rollout {rollout_id} does not exist")
    back = reverse("dashboard:job", args=[rollout.job_id])
    if not is_confirmed(request):
        return confirmation_page(request, title=f"Cancel rollout {rollout.pk}", back_url=back,
                                 button="Cancel the rollout", will=[
            f"end rollout {rollout.pk} (task {rollout.task.key}, sample {rollout.sample_index}, now {rollout.status}) "
            "as cancelled",
            f"let {rollout.job} go on with its other rollouts (the cancelled one counts as spent)"])
    if services.rollout_cancel(rollout=rollout):
        messages.success(request, f"Rollout {rollout.pk} cancelled.")
    else:
        messages.error(request, f"Rollout {rollout.pk} had already finished ({rollout.status}).")
    return redirect(back)


def _job_or_404(job_id: int) -> RolloutJob:
    try:
        return rollout_selectors.job_get(job_id=job_id)
    except NotFound as error:
        raise Http404(str(error)) from None


def open_rollouts(*, job: RolloutJob, limit: int = 100) -> list[Rollout]:
    """The job's queued and running rollouts, the ones its page offers to cancel (one query)."""
    return list(job.rollouts.filter(status__in=rollout_selectors.OPEN).select_related("task").order_by("id")[:limit])

