"""The cluster pages (runs side by side, a curator's split and merge) and the "similar runs" API and links."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.models import CurationEvent, DedupCluster, Trajectory
from experience.services.dedup import trajectory_dedup
from tests.experience.services.store_factories import RunFactory, StepFactory, stored
from tests.experience.services.test_dedup import MARSHMALLOW, imported
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def index_dir(settings, tmp_path):
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    settings.TROVE_DEDUP_EMBEDDER = "lexical"


def client_for(name: str, *, curator: bool) -> Client:
    user = get_user_model().objects.create_user(name)
    if curator:
        user.groups.add(role_groups_sync()["curator"])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def curator():
    return client_for("curator", curator=True)


@pytest.fixture
def researcher():
    return client_for("researcher", curator=False)


@pytest.fixture
def runs():
    marshmallow = imported(MARSHMALLOW)
    commands = ["ls", "cat setup.py", "python -m pytest -q tests/test_x.py"]
    twin_a, twin_b, other = stored(
        RunFactory(task_key="t-twins", steps=[StepFactory(command=c) for c in commands], reward=0.0),
        RunFactory(task_key="t-twins", steps=[StepFactory(command=c) for c in commands], reward=1.0),
        RunFactory(task_key="t-other", steps=[StepFactory(command="make test")]),
    )
    trajectory_dedup(trajectory_ids=[*marshmallow, twin_a, twin_b, other])
    return marshmallow, (twin_a, twin_b), other


def member_ids(response) -> list[int]:
    return [int(i) for i in re.findall(r'<section class="card member[^"]*" data-id="(\d+)"', response.content.decode())]


def test_cluster_pages_need_a_login(runs):
    cluster_id = Trajectory.objects.get(pk=runs[0][0]).cluster_id

    for url in ("/clusters/", f"/clusters/{cluster_id}/"):
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_cluster_page_shows_each_runs_actions_outcome_and_similarity_side_by_side(runs, researcher):
    marshmallow, _, _ = runs
    cluster_id = Trajectory.objects.get(pk=marshmallow[0]).cluster_id

    response = researcher.get(f"/clusters/{cluster_id}/")

    body = response.content.decode()
    assert response.status_code == 200 and member_ids(response) == marshmallow  # canonical first, then by id
    assert body.count('<ol class="actions">') == 8 and "reward" in body and "similarity" in body
    assert "Split out" not in body  # no curation permission, no curation forms
    index = researcher.get("/clusters/").content.decode()
    assert f'<tr data-id="{cluster_id}">' in index


def test_a_curator_splits_a_run_out_from_the_page_and_it_is_recorded(runs, curator):
    marshmallow, _, _ = runs
    cluster_id = Trajectory.objects.get(pk=marshmallow[0]).cluster_id

    response = curator.post(f"/clusters/{cluster_id}/split/", {"trajectory": marshmallow[3], "reason": "other fix"})

    moved = Trajectory.objects.get(pk=marshmallow[3])
    assert response.status_code == 302 and response["Location"] == f"/clusters/{moved.cluster_id}/"
    assert moved.cluster_id != cluster_id and not moved.is_duplicate
    event = CurationEvent.objects.get(action="split", trajectory_id=marshmallow[3])
    assert event.actor.username == "curator" and event.reason == "other fix" and event.created_at is not None
    assert member_ids(curator.get(f"/clusters/{cluster_id}/")) == [m for m in marshmallow if m != marshmallow[3]]


def test_a_curator_merges_two_clusters_and_picks_the_canonical(runs, curator):
    marshmallow, (twin_a, twin_b), _ = runs
    big = Trajectory.objects.get(pk=marshmallow[0]).cluster_id
    small = Trajectory.objects.get(pk=twin_a).cluster_id

    response = curator.post(f"/clusters/{big}/merge/", {"other": small, "canonical": twin_b, "reason": "same"})

    merged = DedupCluster.objects.get(pk=small)
    assert response["Location"] == f"/clusters/{small}/" and not DedupCluster.objects.filter(pk=big).exists()
    assert merged.canonical_id == twin_b and merged.size == 10 and merged.method == "manual"
    # Three outcomes (the twins failed and succeeded, the marshmallow runs have none): each keeps a run.
    representatives = {twin_b, twin_a, marshmallow[0]}
    assert set(Trajectory.objects.filter(cluster=merged, is_duplicate=False).values_list("pk", flat=True)) == (
        representatives)
    assert merged.mixed_outcomes
    assert set(Trajectory.objects.filter(cluster=merged, is_duplicate=True).values_list("canonical_id", flat=True)) == {
        marshmallow[0]}
    # every marshmallow run changed cluster; the twins' states (already together) did not change
    assert CurationEvent.objects.filter(action="merge", reason="same").count() == 8


def test_a_researcher_cannot_split_or_merge(runs, researcher):
    marshmallow, _, _ = runs
    cluster_id = Trajectory.objects.get(pk=marshmallow[0]).cluster_id

    researcher.post(f"/clusters/{cluster_id}/split/", {"trajectory": marshmallow[3]})

    assert Trajectory.objects.get(pk=marshmallow[3]).cluster_id == cluster_id
    assert not CurationEvent.objects.exists()


def test_the_similar_endpoint_lists_the_nearest_runs_of_the_task_with_scores(runs, researcher):
    marshmallow, _, _ = runs

    response = researcher.get(f"/api/v1/trajectories/{marshmallow[0]}/similar/", {"k": 5})

    results = response.json()["results"]
    assert response.status_code == 200 and len(results) == 5
    assert {r["id"] for r in results} <= set(marshmallow[1:])
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert all(r["task_key"] == "marshmallow-code__marshmallow-1867" and r["score"] > 0.8 for r in results)
    assert researcher.get("/api/v1/trajectories/999999999/similar/").status_code == 404
    assert researcher.get(f"/api/v1/trajectories/{marshmallow[0]}/similar/", {"k": 0}).status_code == 400


def test_the_trajectory_page_links_the_cluster_and_similar_runs(runs, researcher):
    marshmallow, _, _ = runs
    duplicate = Trajectory.objects.get(pk=marshmallow[1])

    body = researcher.get(f"/trajectories/{duplicate.pk}/").content.decode()

    assert f'href="/clusters/{duplicate.cluster_id}/"' in body and f"?similar={duplicate.pk}" in body
    assert f"Duplicate of <a href=\"/trajectories/{marshmallow[0]}/\">#{marshmallow[0]}</a>" in body


def test_the_explorer_similar_link_ranks_through_the_dedup_service(runs, researcher):
    marshmallow, _, other = runs

    body = researcher.get("/trajectories/", {"similar": marshmallow[0]}).content.decode()

    shown = [int(i) for i in re.findall(r'<tr data-id="(\d+)"', body)]
    assert set(shown) == set(marshmallow[1:]) and other not in shown


def test_the_clusters_page_marks_and_filters_mixed_outcome_clusters(runs, researcher):
    marshmallow, (twin_a, twin_b), _ = runs  # the twins: the same actions, one failed, one succeeded
    twins = Trajectory.objects.get(pk=twin_a).cluster_id
    big = Trajectory.objects.get(pk=marshmallow[0]).cluster_id

    everything = researcher.get("/clusters/").content.decode()
    mixed = researcher.get("/clusters/", {"outcomes": "mixed"}).content.decode()
    same = researcher.get("/clusters/", {"outcomes": "same"}).content.decode()
    bad = researcher.get("/clusters/", {"outcomes": "sometimes"})

    assert f'<tr data-id="{twins}" class="mixed-outcomes">' in everything and f'<tr data-id="{big}">' in everything
    assert f'data-id="{twins}"' in mixed and f'data-id="{big}"' not in mixed
    assert f'data-id="{big}"' in same and f'data-id="{twins}"' not in same
    assert bad.status_code == 400 and "outcomes" in bad.content.decode()
    page = researcher.get(f"/clusters/{twins}/").content.decode()
    assert 'id="mixed-outcomes"' in page and "kept: another outcome" in page
    assert member_ids(researcher.get(f"/clusters/{twins}/"))[0] == twin_b  # the success is the canonical
    assert "its outcome differs from the canonical" in researcher.get(f"/trajectories/{twin_a}/").content.decode()
    assert "Canonical run of" in researcher.get(f"/trajectories/{twin_b}/").content.decode()


def test_a_review_queue_of_the_clusters_that_mix_outcomes_holds_exactly_their_runs(runs, curator):
    from experience.models import ReviewQueue

    _, twins, other = runs
    mixed = set(Trajectory.objects.filter(cluster__mixed_outcomes=True).values_list("pk", flat=True))
    assert set(twins) <= mixed and other not in mixed

    listed = curator.get("/trajectories/?cluster_outcomes=mixed")
    made = curator.post("/queues/", {"name": "mixed clusters", "cluster_outcomes": "mixed"})

    assert listed.status_code == 200
    assert {int(i) for i in re.findall(r'<tr data-id="(\d+)"', listed.content.decode())} == mixed
    queue = ReviewQueue.objects.get(name="mixed clusters")
    assert made.status_code == 302 and queue.filters == {"cluster_outcomes": "mixed"}
    assert set(queue.items.values_list("trajectory_id", flat=True)) == mixed


def test_the_explorer_names_a_bad_cluster_outcomes_value(curator):
    page = curator.get("/trajectories/?cluster_outcomes=some")

    assert page.status_code == 400
    assert "cluster_outcomes: &#x27;some&#x27; is not one of mixed, same" in page.content.decode()


def test_the_clusters_page_links_to_the_explorer_of_their_runs(runs, curator):
    page = curator.get("/clusters/?outcomes=mixed").content.decode()

    assert 'href="/trajectories/?cluster_outcomes=mixed"' in page
