from django.apps import AppConfig


class ExperienceConfig(AppConfig):
    name = "experience"
    verbose_name = "Experience store"
    default_auto_field = "django.db.models.BigAutoField"
