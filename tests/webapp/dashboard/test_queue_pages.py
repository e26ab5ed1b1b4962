"""The review queue pages as a browser posts them: make a queue from explorer filters (or a sample), take a
run, decide it and get the next; a reader may look but not take runs; one curator cannot decide another's."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.models import ReviewItem, ReviewQueue
from tests.experience.services.store_factories import RunFactory, run_record, stored
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


def curator(name: str) -> Client:
    client = Client()
    user = get_user_model().objects.create_user(name)
    user.groups.add(role_groups_sync()["curator"])
    client.force_login(user)
    return client


def test_a_queue_from_explorer_filters_with_a_sample():
    stored(*[run_record(model="m-s") for _ in range(6)], run_record(model="other"))
    ann = curator("ann")

    made = ann.post("/queues/", {"name": "sampled", "sample": 4, "model": "m-s"})

    queue = ReviewQueue.objects.get()
    assert made["Location"] == f"/queues/{queue.pk}/" and queue.filters == {"model": "m-s"}
    assert queue.items.count() == 4
    listing = ann.get("/queues/").content.decode()
    assert f'data-queue="{queue.pk}"' in listing and "0/4" in listing


def test_taking_deciding_and_moving_on():
    a, b = stored(run_record(), run_record())
    ann = curator("ann")
    ann.post("/queues/", {"name": "q"})
    queue = ReviewQueue.objects.get()

    ann.post(f"/queues/{queue.pk}/next/")
    page = ann.get(f"/queues/{queue.pk}/").content.decode()
    item = ReviewItem.objects.get(claimed_by__username="ann")
    assert f'data-trajectory="{item.trajectory_id}"' in page and 'id="decide-form"' in page
    ann.post(f"/queues/{queue.pk}/items/{item.pk}/decide/", {"decision": "approve"})

    following = ReviewItem.objects.get(claimed_by__username="ann", decision="")
    assert following.trajectory_id != item.trajectory_id
    assert "1/2" in ann.get(f"/queues/{queue.pk}/").content.decode()


def test_a_curator_cannot_decide_a_run_another_holds():
    stored(run_record())
    ann, bob = curator("ann"), curator("bob")
    ann.post("/queues/", {"name": "q"})
    queue = ReviewQueue.objects.get()
    ann.post(f"/queues/{queue.pk}/next/")
    item = ReviewItem.objects.get()

    bob.post(f"/queues/{queue.pk}/items/{item.pk}/decide/", {"decision": "reject", "reason": "mine now"})
    page = bob.get(f"/queues/{queue.pk}/").content.decode()

    item.refresh_from_db()
    assert item.decision == "" and "not yours to decide" in page
    assert re.search(r"1 being reviewed now", page)


def test_a_reader_looks_but_does_not_take_runs():
    stored(run_record())
    curator("ann").post("/queues/", {"name": "q"})
    queue = ReviewQueue.objects.get()
    reader = Client()
    reader.force_login(get_user_model().objects.create_user("reader"))

    assert reader.get(f"/queues/{queue.pk}/").status_code == 200
    assert reader.post(f"/queues/{queue.pk}/next/").status_code == 403
    assert not ReviewItem.objects.filter(claimed_by__isnull=False).exists()


def test_a_queue_of_one_jobs_succeeded_unreviewed_runs():
    def of_job(job_id, **fields):
        return run_record(source="rollout", metadata={"job_id": job_id, "rollout_id": 1}, **fields)

    wanted = stored(of_job(12), of_job(12))
    failed = RunFactory(source="rollout", metadata={"job_id": 12}, success=False, reward=0.0)
    stored(failed, of_job(13), run_record(metadata={"job_id": 12}))  # the last: an import's own job_id
    ann = curator("ann")

    listed = ann.get("/trajectories/", {"job": "12", "outcome": "success", "curation": "pending"})
    ann.post("/queues/", {"name": "job 12", "job": "12", "outcome": "success", "curation": "pending"})

    assert sorted(int(i) for i in re.findall(r'<tr data-id="(\d+)"', listed.content.decode())) == sorted(wanted)
    queue = ReviewQueue.objects.get(name="job 12")
    assert queue.filters == {"job": "12", "outcome": "success", "curation": "pending"}
    assert sorted(queue.items.values_list("trajectory_id", flat=True)) == sorted(wanted)


def test_a_job_filter_that_is_not_a_number_is_refused_naming_it():
    page = curator("ann").get("/trajectories/", {"job": "twelve"})

    assert page.status_code == 400 and "job: &#x27;twelve&#x27; is not an integer" in page.content.decode()
