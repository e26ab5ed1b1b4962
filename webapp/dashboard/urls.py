from django.urls import path

from webapp.dashboard import clusters, compare, dataset_preview, datasets, explorer, jobs, review, views
from webapp.dashboard import fleets as fleet_views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new/", jobs.job_start, name="job-start"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/rerun-failed/", jobs.job_rerun_failed, name="job-rerun-failed"),
    path("rollouts/<int:rollout_id>/cancel/", jobs.rollout_cancel, name="rollout-cancel"),
    path("trajectories/", explorer.explorer, name="explorer"),
    path("trajectories/curate/", explorer.explorer_curate, name="explorer-curate"),
    path("trajectories/import/", explorer.trajectory_import, name="trajectory-import"),
    path("trajectories/compare/", compare.trajectory_compare, name="trajectory-compare"),
    path("trajectories/<int:trajectory_id>/", views.trajectory_detail, name="trajectory"),
    path("trajectories/<int:trajectory_id>/review/", review.run_curate, name="run-curate"),
    path("trajectories/<int:trajectory_id>/step-label/", review.step_label, name="step-label"),
    path("clusters/", clusters.cluster_index, name="clusters"),
    path("clusters/<int:cluster_id>/", clusters.cluster_detail, name="cluster"),
    path("clusters/<int:cluster_id>/split/", clusters.cluster_split_view, name="cluster-split"),
    path("clusters/<int:cluster_id>/merge/", clusters.cluster_merge_view, name="cluster-merge"),
    path("fleets/", fleet_views.fleet_list, name="fleets"),
    path("fleets/<int:fleet_id>/", fleet_views.fleet_detail, name="fleet"),
    path("fleets/<int:fleet_id>/scale/", fleet_views.fleet_scale, name="fleet-scale"),
    path("fleets/<int:fleet_id>/drain/", fleet_views.fleet_drain, name="fleet-drain"),
    path("fleets/<int:fleet_id>/template/", fleet_views.fleet_template, name="fleet-template"),
    path("datasets/", datasets.dataset_index, name="datasets"),
    path("datasets/<str:name>/", datasets.dataset_detail, name="dataset"),
    path("datasets/<str:name>/build/", datasets.dataset_build, name="dataset-build"),
    path("datasets/<str:name>/v<int:version>/", datasets.dataset_version, name="dataset-version"),
    path("datasets/<str:name>/v<int:version>/manifest/", dataset_preview.dataset_manifest, name="dataset-manifest"),
    path("dataset-compare/", datasets.dataset_compare, name="dataset-compare"),
]
