from django.contrib import admin

from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent


@admin.register(EnvironmentTemplate)
class EnvironmentTemplateAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "network", "cpu", "memory_mb", "pids", "spec_hash", "created_at")
    readonly_fields = ("spec_hash",)


@admin.register(Fleet)
class FleetAdmin(admin.ModelAdmin):
    list_display = ("name", "template", "backend", "min_warm", "max_warm", "max_total", "status", "hold_reason")


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = ("name", "fleet", "state", "lease_holder", "fencing_token", "requested_at", "ready_at")
    list_filter = ("state", "fleet")
    exclude = ("agent_secret",)  # never shown, not even to admins
    readonly_fields = ("fencing_token",)


@admin.register(SandboxEvent)
class SandboxEventAdmin(admin.ModelAdmin):
    list_display = ("id", "sandbox", "kind", "from_state", "to_state", "reason", "created_at")
    list_filter = ("kind",)
    raw_id_fields = ("sandbox",)
