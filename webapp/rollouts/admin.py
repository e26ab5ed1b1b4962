from django.contrib import admin

from webapp.rollouts.models import Rollout, RolloutJob, Task, TaskSet


class TaskInline(admin.TabularInline):
    model = Task
    fields = ("key", "title", "difficulty", "eval_command")
    extra = 0
    show_change_link = True


@admin.register(TaskSet)
class TaskSetAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "created_at")
    inlines = [TaskInline]


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("key", "task_set", "difficulty", "eval_command", "success_exit_code")
    list_filter = ("task_set", "difficulty")


@admin.register(RolloutJob)
class RolloutJobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "task_set", "model_name", "samples_per_task", "status", "created_at")
    list_filter = ("status",)


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "task", "sample_index", "status", "reward", "attempt", "started_at", "finish_seq")
    list_filter = ("status",)
    raw_id_fields = ("job", "task", "sandbox", "trajectory", "rerun_of")
    exclude = ("token",)  # the proxy credential of a running rollout
