"""Admin: read mostly. Templates are immutable and events append-only, so neither can be changed here;
fleets are sized through the dashboard or the API (services.fleet_scale), which also lift holds."""

from django.contrib import admin

from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(EnvironmentTemplate)
class EnvironmentTemplateAdmin(ReadOnlyAdmin):
    list_display = ("name", "version", "network", "cpu", "memory_mb", "pids", "spec_hash", "created_at")
    search_fields = ("name",)


@admin.register(Fleet)
class FleetAdmin(ReadOnlyAdmin):
    list_display = ("name", "template", "backend", "min_warm", "max_warm", "max_total", "status", "hold_reason")
    exclude = ("orphans_seen",)


@admin.register(Sandbox)
class SandboxAdmin(ReadOnlyAdmin):
    list_display = ("name", "fleet", "state", "lease_holder", "fencing_token", "requested_at", "ready_at")
    list_filter = ("state", "fleet")
    search_fields = ("name", "lease_holder")
    exclude = ("agent_secret",)  # never shown, not even to admins


@admin.register(SandboxEvent)
class SandboxEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "sandbox_name", "kind", "from_state", "to_state", "reason", "created_at")
    list_filter = ("kind",)
    raw_id_fields = ("sandbox",)

    def has_add_permission(self, request) -> bool:
        return False
