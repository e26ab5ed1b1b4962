from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("trajectories/<int:trajectory_id>/", views.trajectory_detail, name="trajectory"),
]
