from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ExperienceConfig(AppConfig):
    name = "experience"
    verbose_name = "Experience store"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from experience.search_fts_guard import fts_triggers_after_migrate

        # A later migration that remakes experience_step on SQLite drops the FTS5 index's triggers.
        post_migrate.connect(fts_triggers_after_migrate, sender=self, dispatch_uid="experience-fts-triggers")
