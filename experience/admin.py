"""The admin for the experience store: fast lists on large tables, curation as bulk actions.

Curation in the admin goes only through actions (the change form shows curation fields read-only), so every
change is made by experience.services.curation and recorded as a CurationEvent with who, when and why.
The same holds for a run's outcome (reward, success, status) and provenance: read-only on the change form;
"Change the outcome…" asks for the new values and a required reason, and records each change.
Each action asks for the reason (and tags, a note or the canonical run where it needs them) on a
confirmation page, then updates the whole selection set-based: "select all N" across pages hands the
action a queryset, never a list of rows to save one by one.

Lists stay fast on millions of rows: no full count (show_full_result_count off, and an estimated count when
the list is unfiltered on Postgres), an index behind every list filter, exact-match search on indexed
columns, and no per-row queries.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.template.response import TemplateResponse
from django.utils.functional import cached_property

from experience.errors import TroveError
from experience.models import Blob, CurationEvent, Step, Trajectory
from experience.services.curation import (
    KEEP,
    OUTCOME_STATUSES,
    SET_OUTCOME,
    trajectories_curate,
    trajectories_outcome_set,
)

EXACT_COUNT_BELOW = 10_000


class EstimatedCountPaginator(Paginator):
    """An unfiltered list of a large table takes Postgres' row estimate instead of counting every row;
    a filtered list (indexed) and small tables are counted exactly."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if connection.vendor == "postgresql" and isinstance(queryset, QuerySet) and not queryset.query.where:
            estimate = _estimated_rows(queryset.model._meta.db_table)
            if estimate >= EXACT_COUNT_BELOW:
                return estimate
        return super().count


def _estimated_rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table])
        row = cursor.fetchone()
    return max(int(row[0]), 0) if row else 0


class CurateActionForm(forms.Form):
    reason = forms.CharField(required=False, widget=forms.TextInput(attrs={"size": 60}),
                             help_text="recorded with every change")
    tags = forms.CharField(required=False, help_text="comma-separated")
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))
    canonical = forms.IntegerField(required=False, min_value=1, help_text="id of the run these duplicate")


class OutcomeActionForm(forms.Form):
    """The outcome action's inputs: each field left at "leave as it is" is not changed."""

    reason = forms.CharField(widget=forms.TextInput(attrs={"size": 60}), max_length=2000,
                             help_text="required: recorded with every change")
    reward = forms.CharField(required=False, help_text="blank: leave as it is; a number sets it; 'none' clears it")
    success = forms.ChoiceField(required=False, choices=[
        ("", "leave as it is"), ("true", "true"), ("false", "false"), ("none", "unknown (clear)")])
    status = forms.ChoiceField(required=False, choices=[("", "leave as it is"), *[(s, s) for s in OUTCOME_STATUSES]])

    def clean_reward(self) -> Any:
        text = self.cleaned_data["reward"].strip()
        if not text:
            return KEEP
        if text.lower() == "none":
            return None
        try:
            return float(text)
        except ValueError:
            raise forms.ValidationError(f"{text!r} is not a number (or 'none')") from None

    def outcome(self) -> dict[str, Any]:
        """The fields to set, as trajectories_outcome_set takes them."""
        data = self.cleaned_data
        success = {"": KEEP, "true": True, "false": False, "none": None}[data["success"]]
        return {"reward": data["reward"], "success": success, "status": data["status"] or KEEP}


OUTCOME_LABEL = "Change the outcome (reward, success, status)"


# Which extra inputs each action needs on its confirmation page.
ACTION_FIELDS = {
    "approve": (), "reject": (), "reset": (), "unmark_duplicate": (),
    "tag": ("tags",), "untag": ("tags",), "note": ("note",), "mark_duplicate": ("canonical",),
}
ACTION_LABELS = {
    "approve": "Approve", "reject": "Reject", "reset": "Reset curation to pending", "tag": "Add tags",
    "untag": "Remove tags", "note": "Add a note", "mark_duplicate": "Mark as duplicates",
    "unmark_duplicate": "Unmark duplicates",
}


def _curate(action: str):
    def run(modeladmin: TrajectoryAdmin, request, queryset: QuerySet[Trajectory]):
        return modeladmin.curate(request, queryset, action)

    run.__name__ = f"curate_{action}"
    return admin.action(description=f"{ACTION_LABELS[action]}…", permissions=["change"])(run)


class CurationEventInline(admin.TabularInline):
    model = CurationEvent
    fields = ("created_at", "actor", "action", "before", "after", "reason")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-id",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor")


@admin.register(Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    list_display = ("id", "task_key", "source", "source_format", "model", "status", "reward", "success", "n_steps",
                    "curation_status", "is_duplicate", "tags", "created_at")
    list_filter = ("status", "curation_status", "is_duplicate", "source", "source_format", "harness")
    search_fields = ("task_key__exact", "source_ref__exact", "model__exact", "content_hash__exact")
    # Provenance and outcome too: the outcome changes only through its action (a reason, an event), and no
    # one makes a run a rollout by editing its source.
    readonly_fields = ("uid", "content_hash", "next_seq", "created_at", "updated_at", "original_blob",
                       "curation_status", "tags", "notes", "is_duplicate", "canonical", "cluster", "similarity",
                       "search_indexed", "source", "source_format", "source_version", "source_ref",
                       "status", "reward", "success")
    raw_id_fields = ("canonical", "cluster")
    inlines = [CurationEventInline]
    show_full_result_count = False  # counting a large table on every page is the slow part
    show_facets = admin.ShowFacets.NEVER  # facet counts are one more count per filter option
    paginator = EstimatedCountPaginator
    list_per_page = 100
    actions = [*(_curate(action) for action in ACTION_FIELDS), "curate_set_outcome"]

    def has_add_permission(self, request) -> bool:
        return False  # runs enter the store through ingest, imports and rollouts, with their provenance

    def get_queryset(self, request):
        # The list never shows the large text columns; the change form loads the row whole.
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            queryset = queryset.defer("instruction", "final_diff", "metadata", "notes")
        return queryset

    def curate(self, request, queryset: QuerySet[Trajectory], action: str):
        """Ask for the reason (and the action's inputs) on a confirmation page, then curate the selection."""
        form = CurateActionForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            try:
                result = trajectories_curate(
                    trajectories=queryset, action=action, actor=request.user, reason=data["reason"],
                    tags=data["tags"].split(","), note=data["note"], canonical_id=data["canonical"])
            except TroveError as error:
                self.message_user(request, error.message, messages.ERROR)
                return None
            self.message_user(request, f"{ACTION_LABELS[action]}: {result.changed} of {result.matched} runs changed "
                                       "(each recorded as a curation event).", messages.SUCCESS)
            return None
        return self._confirmation(request, queryset, action, form, ACTION_LABELS[action],
                                  ("reason", *ACTION_FIELDS[action]))

    @admin.action(description=f"{OUTCOME_LABEL}…", permissions=["change"])
    def curate_set_outcome(self, request, queryset: QuerySet[Trajectory]):
        """Ask for the new values and why, then set them on the selection (one event per run changed)."""
        form = OutcomeActionForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            try:
                result = trajectories_outcome_set(trajectories=queryset, actor=request.user,
                                                  reason=form.cleaned_data["reason"], **form.outcome())
            except TroveError as error:
                form.add_error(None, error.message)
            else:
                self.message_user(request, f"{OUTCOME_LABEL}: {result.changed} of {result.matched} runs changed "
                                           "(each recorded as a curation event).", messages.SUCCESS)
                return None
        return self._confirmation(request, queryset, SET_OUTCOME, form, OUTCOME_LABEL,
                                  ("reason", "reward", "success", "status"))

    def _confirmation(self, request, queryset: QuerySet[Trajectory], action: str, form: forms.Form, label: str,
                      fields: tuple[str, ...]):
        select_across = request.POST.get("select_across") == "1"
        # Django wants some selected ids even when the action covers every row matching the filters.
        selected = list(queryset.values_list("pk", flat=True)[: 1 if select_across else self.list_per_page])
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": f"{label}: confirm",
            "opts": self.model._meta,
            "action": f"curate_{action}",
            "action_label": label,
            "form": form,
            "shown_fields": [form[name] for name in fields],
            "selected": selected,
            "select_across": select_across,
            "count": queryset.count(),
        }
        return TemplateResponse(request, "admin/experience/trajectory/curate_confirm.html", context)


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory_id", "seq", "kind", "exit_code", "duration_ms", "is_error")
    list_filter = ("kind", "is_error")
    search_fields = ("trajectory__id__exact",)
    raw_id_fields = ("trajectory",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    # A run's steps are its record (an evaluation step's exit code is its outcome's evidence): viewed, never
    # edited or added here.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).defer("payload", "blob_refs")


@admin.register(Blob)
class BlobAdmin(admin.ModelAdmin):
    list_display = ("sha256", "size", "encoding", "created_at")
    readonly_fields = ("sha256", "size", "encoding", "created_at")
    exclude = ("data",)
    search_fields = ("sha256__exact",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data")


@admin.register(CurationEvent)
class CurationEventAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory_id", "actor", "action", "reason", "created_at")
    list_filter = ("action",)
    list_select_related = ("actor",)
    raw_id_fields = ("trajectory",)
    readonly_fields = ("trajectory", "actor", "action", "before", "after", "reason", "created_at")
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    def has_add_permission(self, request) -> bool:
        return False  # events are written by the curation service only

    def has_change_permission(self, request, obj=None) -> bool:
        return False
