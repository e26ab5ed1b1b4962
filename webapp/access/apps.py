from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AccessConfig(AppConfig):
    name = "webapp.access"
    label = "access"
    verbose_name = "API access"

    def ready(self) -> None:
        # Registers the OpenAPI description of scoped tokens with drf-spectacular.
        from webapp.access import schema  # noqa: F401
        from webapp.access.roles import sync_on_migrate

        # After this app's migrations, when the permissions of the apps listed before it exist.
        post_migrate.connect(sync_on_migrate, sender=self, dispatch_uid="trove-role-groups")
