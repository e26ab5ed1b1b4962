from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "webapp.fleets"
    label = "fleets"
