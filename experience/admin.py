from django.contrib import admin

from experience.models import Blob, CurationEvent, Step, Trajectory


@admin.register(Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    list_display = ("id", "task_key", "source", "model", "status", "reward", "n_steps", "curation_status", "created_at")
    list_filter = ("status", "source", "curation_status", "harness")
    search_fields = ("task_key", "source_ref", "model")
    readonly_fields = ("uid", "content_hash", "next_seq", "created_at", "updated_at")
    show_full_result_count = False  # counting a large table on every page is the slow part
    list_per_page = 100


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory_id", "seq", "kind", "exit_code", "duration_ms", "is_error")
    list_filter = ("kind", "is_error")
    raw_id_fields = ("trajectory",)
    show_full_result_count = False


@admin.register(Blob)
class BlobAdmin(admin.ModelAdmin):
    list_display = ("sha256", "size", "encoding", "created_at")
    readonly_fields = ("sha256", "size", "encoding", "data", "created_at")
    show_full_result_count = False


@admin.register(CurationEvent)
class CurationEventAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory_id", "actor", "action", "reason", "created_at")
    raw_id_fields = ("trajectory",)
