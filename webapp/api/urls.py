"""The REST API. Each area keeps its own views and routes in its own module."""

from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from webapp.api import datasets, endpoints, fleets, jobs, outcomes, run_steps, trajectories

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The schema needs an authenticated request (SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"]); the docs page is
    # for people: without a session it sends them to the login page.
    path("docs/", login_required(SpectacularSwaggerView.as_view(url_name="schema")), name="api-docs"),
    path("v1/", include(jobs.urlpatterns)),
    path("v1/", include(endpoints.urlpatterns)),
    path("v1/", include(fleets.urlpatterns)),
    path("v1/", include(trajectories.urlpatterns)),
    path("v1/", include(run_steps.urlpatterns)),
    path("v1/", include(outcomes.urlpatterns)),
    path("v1/", include(datasets.urlpatterns)),
]
