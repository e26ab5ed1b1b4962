"""Dashboard pages for datasets: build one from a spec form, watch the build, each version's stats (rows,
positive rate per split, tasks and their balance as a server-rendered SVG chart), compare two versions,
download the files (links to the API, which streams them; the session logs the browser in).

Views are thin: a form or a selector, one service call, a template.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import transaction
from django.db.models.fields.json import KT
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from experience.distill.spec import DEFAULT_SPLITS, GROUP_BYS, KINDS, SFT_MODES, SPLITS, DatasetSpec
from experience.distill.splits import EmptySplitError, split_for_task
from experience.errors import NotFound, TroveError
from experience.models import DatasetVersion, Trajectory
from experience.services import datasets
from webapp.access.permissions import scope_required
from webapp.api.ranges import INT_MAX
from webapp.dashboard import dataset_preview

BUILD_TASK = "trove.datasets.build"
CHART_TASKS = 40  # the balance chart shows the largest tasks; the rest are summed up in one line
BAR_HEIGHT, BAR_GAP, LABEL_WIDTH, CHART_WIDTH = 14, 4, 220, 640


def enqueue_dataset_build(version_id: int) -> None:
    """Send `trove.datasets.build` by name: webapp code may not import the worker's task module."""
    from webapp.celery import app

    app.send_task(BUILD_TASK, args=(version_id,))


# --- the spec form -------------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]


class DatasetForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="letters, digits, '.', '_', '-'")
    kind = forms.ChoiceField(choices=[(k, k) for k in KINDS])
    task_sets = forms.CharField(required=False, help_text="comma-separated")
    task_keys = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    models = forms.CharField(required=False)
    harnesses = forms.CharField(required=False)
    sources = forms.CharField(required=False)
    tags = forms.CharField(required=False, help_text="runs carrying all of them")
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), ("success", "success"), ("failure", "failure")])
    curation = forms.MultipleChoiceField(required=False, choices=Trajectory.Curation.choices,
                                         widget=forms.CheckboxSelectMultiple)
    created_after = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    created_before = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    gamma = forms.FloatField(initial=0.95, min_value=0, max_value=1)
    context_budget_tokens = forms.IntegerField(initial=8192, min_value=1, max_value=INT_MAX)
    neg_pos_ratio = forms.FloatField(required=False, min_value=0, help_text="blank: keep every failed run")
    train = forms.FloatField(initial=DEFAULT_SPLITS["train"], min_value=0, max_value=1)
    val = forms.FloatField(initial=DEFAULT_SPLITS["val"], min_value=0, max_value=1)
    test = forms.FloatField(initial=DEFAULT_SPLITS["test"], min_value=0, max_value=1)
    group_by = forms.ChoiceField(choices=[(g, g) for g in GROUP_BYS])
    include_duplicates = forms.BooleanField(required=False)
    include_rejected = forms.BooleanField(required=False)
    sft_mode = forms.ChoiceField(choices=[(m, m) for m in SFT_MODES])
    max_pairs_per_task = forms.IntegerField(initial=8, min_value=1, max_value=INT_MAX)
    seed = forms.IntegerField(initial=0, min_value=0, max_value=INT_MAX)  # fmt: skip

    FILTERS = ("task_sets", "task_keys", "models", "harnesses", "sources", "tags", "outcome", "curation",
               "created_after", "created_before")  # fmt: skip

    force = forms.BooleanField(required=False, label="Build even if a split is empty",
                               help_text="a split with a share of the tasks may get none of them: refused unless ticked")

    def groups(self) -> list[tuple[str, list]]:
        """The fields in the four fieldsets the page shows."""
        filters = [self[name] for name in self.FILTERS]
        options = [field for field in self if field.name not in (*self.FILTERS, "name", "kind", "force")]
        return [("Dataset", [self["name"], self["kind"]]), ("Filters", filters), ("Options", options),
                ("Build", [self["force"]])]

    def spec_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(filters, options) for `dataset_create`, from the cleaned fields."""
        data = self.cleaned_data
        filters: dict[str, Any] = {key: _names(data[key]) for key in
                                   ("task_sets", "task_keys", "models", "harnesses", "sources", "tags")}  # fmt: skip
        filters |= {"outcome": data["outcome"] or None, "curation": list(data["curation"])}
        for key in ("created_after", "created_before"):
            filters[key] = data[key].isoformat() if data[key] else None
        options = {key: data[key] for key in ("gamma", "context_budget_tokens", "neg_pos_ratio", "group_by",
                   "include_duplicates", "include_rejected", "sft_mode", "max_pairs_per_task", "seed")}  # fmt: skip
        options["splits"] = {split: data[split] for split in ("train", "val", "test")}
        return filters, options


# --- views ---------------------------------------------------------------------------------------------


@scope_required("datasets")
def dataset_index(request):
    form = DatasetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        filters, options = form.spec_parts()
        try:
            # One transaction: a spec refused at its first build leaves no dataset behind.
            with transaction.atomic():
                dataset = datasets.dataset_create(name=form.cleaned_data["name"], kind=form.cleaned_data["kind"],
                                                  filters=filters, options=options, created_by=request.user)
                version = datasets.dataset_version_request(dataset=dataset, enqueue=enqueue_dataset_build,
                                                           force=form.cleaned_data["force"])
        except EmptySplitError as warning:
            form.add_error("force", f"Warning: {warning.message}. Tick this box to build it anyway.")
        except TroveError as error:
            form.add_error(None, error.message)
        else:
            return redirect("dashboard:dataset-version", dataset.name, version.version)
    return render(request, "dashboard/datasets.html", {
        "datasets": _with_latest(list(datasets.dataset_list())), "form": form,
    })  # fmt: skip


def _with_latest(items: list) -> list:
    # Only the columns the list shows: a ready version's manifest lists every source run id.
    versions = DatasetVersion.objects.filter(dataset__in=items).only("dataset_id", "version", "status", "row_count")
    latest = {(v.dataset_id, v.version): v for v in versions.order_by()}
    for dataset in items:
        dataset.latest = latest.get((dataset.pk, dataset.latest_version))
        dataset.filters_text = filters_text(dataset.filters)
    return items


def filters_text(filters: dict) -> str:
    """`task_sets: a, b; outcome: success`, or `all runs`."""
    parts = [f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}" for key, value in filters.items()]
    return "; ".join(parts) or "all runs"


@scope_required("datasets")
def dataset_detail(request, name: str):
    return _render_dataset(request, _dataset_or_404(name))


@scope_required("datasets")
@require_POST
def dataset_build(request, name: str):
    dataset = _dataset_or_404(name)
    try:
        version = datasets.dataset_version_request(dataset=dataset, enqueue=enqueue_dataset_build,
                                                   force=request.POST.get("force") == "1")
    except TroveError as error:
        return _render_dataset(request, dataset, error=error.message, status=error.status_code)
    return redirect("dashboard:dataset-version", dataset.name, version.version)


def _render_dataset(request, dataset, *, error: str = "", status: int = 200):
    # Split counts and the AUC straight from the JSON: the manifest itself lists every source run id.
    versions = dataset.versions.defer("manifest", "spec", "files").annotate(
        train_rows=KT("manifest__splits__train__rows"), val_rows=KT("manifest__splits__val__rows"),
        test_rows=KT("manifest__splits__test__rows"), auc_val=KT("metrics__auc_val"),
    ).order_by("-version")  # fmt: skip
    return render(request, "dashboard/dataset.html", {
        "dataset": dataset, "versions": list(versions), "spec": datasets.dataset_spec(dataset).to_dict(),
        "error": error,
    }, status=status)  # fmt: skip


@scope_required("datasets")
def dataset_version(request, name: str, version: int):
    found = _version_or_404(name, version)
    manifest = found.manifest or {}
    spec = DatasetSpec.from_dict(found.spec)
    return render(request, "dashboard/dataset_version.html", {
        "version": found, "dataset": found.dataset, "manifest": manifest,
        "splits": _split_rows(manifest), "chart": balance_chart(manifest.get("task_rows") or {}, spec),
        "files": _files(found), "best_of": _best_of_rows(found.metrics or {}),
        "others": found.dataset.versions.exclude(pk=found.pk).order_by("-version").values_list("version", flat=True),
        "previews": dataset_preview.split_previews(found), "preview_rows": dataset_preview.PREVIEW_ROWS,
    })  # fmt: skip


@scope_required("datasets")
def dataset_compare(request):
    try:
        a = datasets.dataset_version_resolve(ref=request.GET.get("a", ""))
        b = datasets.dataset_version_resolve(ref=request.GET.get("b", ""))
    except TroveError as error:
        raise Http404(error.message) from None
    diff = datasets.version_compare(a=a, b=b)
    changes = dataset_preview.run_changes(a, b)
    return render(request, "dashboard/dataset_compare.html", {
        "a": a, "b": b, "diff": diff, "changes": changes,
        "run_lists": [(f"Added in {b}", changes["added"], changes["n_added"], "runs-added"),
                      (f"Removed since {a}", changes["removed"], changes["n_removed"], "runs-removed")],
        "split_rows": [{"name": name, **counts} for name, counts in diff["splits"].items()],
    })  # fmt: skip


def _dataset_or_404(name: str):
    try:
        return datasets.dataset_get(ref=name)
    except NotFound as error:
        raise Http404(error.message) from None


def _version_or_404(name: str, version: int) -> DatasetVersion:
    try:
        return datasets.dataset_version_get(dataset=datasets.dataset_get(ref=name), version=version)
    except NotFound as error:
        raise Http404(error.message) from None


# --- what the pages draw -------------------------------------------------------------------------------


def _split_rows(manifest: dict) -> list[dict]:
    # In split order: the JSON column keeps keys in its own order (jsonb sorts them by length).
    splits = manifest.get("splits") or {}
    return [{"name": name, **splits[name]} for name in SPLITS if name in splits]


def _files(version: DatasetVersion) -> list[dict]:
    described = {entry["name"]: entry for entry in (version.manifest or {}).get("files", [])}
    return [described.get(name, {"name": name}) for name in sorted(version.files)]


def _best_of_rows(metrics: dict) -> list[dict]:
    return [row for _n, row in sorted((metrics.get("best_of_n") or {}).items(), key=lambda item: int(item[0]))]


def balance_chart(task_rows: dict[str, int], spec: DatasetSpec, *, limit: int = CHART_TASKS) -> dict:
    """Bars of rows per task, largest first, coloured by split: geometry for an inline SVG."""
    ranked = sorted(task_rows.items(), key=lambda item: (-item[1], item[0]))
    shown, rest = ranked[:limit], ranked[limit:]
    largest = ranked[0][1] if ranked else 1
    bars = []
    for index, (task, rows) in enumerate(shown):
        bars.append({
            "task": task, "rows": rows, "split": split_for_task(task, spec)[1],
            "y": index * (BAR_HEIGHT + BAR_GAP),
            "width": max(1.0, (CHART_WIDTH - LABEL_WIDTH - 60) * rows / largest),
        })  # fmt: skip
    total = sum(task_rows.values()) or 1
    return {
        "bars": bars, "label_width": LABEL_WIDTH, "width": CHART_WIDTH, "bar_height": BAR_HEIGHT,
        "height": max(1, len(bars)) * (BAR_HEIGHT + BAR_GAP),
        "rest_tasks": len(rest), "rest_rows": sum(rows for _task, rows in rest),
        "tasks": len(task_rows), "largest_share": largest / total if task_rows else None,
    }  # fmt: skip
