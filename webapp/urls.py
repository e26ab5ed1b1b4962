from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path
from django.views import defaults

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", include("webapp.api.urls")),
    path("", include("webapp.dashboard.urls")),
]


def not_found(request, exception):
    """An API path that matches no route (`/api/v1/jobs/-1/`) answers in the API's JSON, like every other 404."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


handler404 = not_found
