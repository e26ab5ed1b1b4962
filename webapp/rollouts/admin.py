from django import forms
from django.contrib import admin

from experience.errors import ValidationError
from webapp.rollouts.endpoints import endpoint_fields_clean, may_allow_private_network
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, Task, TaskSet


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


class ModelEndpointForm(forms.ModelForm):
    """The admin's form runs the same checks as the API and `manage.py endpoint add` (key reference
    allow-list, URL shape, the host's addresses unless private networks are allowed)."""

    class Meta:
        model = ModelEndpoint
        fields = ("name", "base_url", "protocol", "model_names", "key_ref", "allow_private_network", "token_capture",
                  "policy_version_from", "description")

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        def given(field, default=""):  # a field shown read-only is not in the form: the row's value holds
            return data[field] if field in data else getattr(self.instance, field, default)

        try:
            data.update(endpoint_fields_clean(
                name=data["name"], base_url=given("base_url"), protocol=data["protocol"],
                model_names=data["model_names"] if isinstance(data["model_names"], list) else [],
                key_ref=data.get("key_ref", ""), allow_private_network=given("allow_private_network", False),
                token_capture=data.get("token_capture", "off"),
                policy_version_from=data.get("policy_version_from", "")))
        except ValidationError as error:
            field = error.field if error.field in self.fields else None
            self.add_error(field, error.message)
        return data


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    form = ModelEndpointForm
    list_display = ("name", "protocol", "base_url", "allow_private_network", "token_capture", "key_ref", "created_by",
                    "created_at")
    list_filter = ("protocol", "allow_private_network", "token_capture")
    readonly_fields = ("created_by", "created_at")

    def get_readonly_fields(self, request, obj=None):
        """Only an admin may allow private networks (webapp/rollouts/endpoints.py); for anyone else the flag
        is shown, not editable, and an endpoint that has it keeps its address too (else pointing it at
        169.254.169.254 would need no admin)."""
        fields = list(super().get_readonly_fields(request, obj))
        if not may_allow_private_network(request.user):
            fields.append("allow_private_network")
            if obj is not None and obj.allow_private_network:
                fields.append("base_url")
        return fields

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(RolloutJob)
class RolloutJobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "task_set", "endpoint", "model_name", "samples_per_task", "status", "created_at")
    list_filter = ("status",)
    list_select_related = ("task_set", "endpoint")


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    """View only. Trainers read a rollout's status and reward from the jobs API, so an edit here would change
    training data without a curation record, and a rollout added by hand would be a result no runner
    produced. A run's outcome changes through the run's "Change the outcome" action (experience admin)."""

    list_display = ("id", "job", "task", "sample_index", "status", "reward", "attempt", "started_at", "finish_seq")
    list_filter = ("status",)
    raw_id_fields = ("job", "task", "sandbox", "trajectory", "rerun_of")
    exclude = ("token",)  # the proxy credential of a running rollout

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
