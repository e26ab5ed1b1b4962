"""A rollout's outcome in the admin: read-only. Trainers read a rollout's status and reward from
`GET /api/v1/jobs/<id>/rollouts/`, so an edit there would change training data with no curation record, and
a rollout added by hand would be a result no runner produced. Outcomes change through the run's own
"Change the outcome" action, which asks why and records it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.experience.services.test_outcome_curation import change_form_data
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout

pytestmark = pytest.mark.django_db
ROLLOUTS = "/admin/rollouts/rollout/"


@pytest.fixture
def admin_client_() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def failed_rollout() -> Rollout:
    rollout = make_job(["solve"]).rollouts.get()
    finish(rollout.pk, Rollout.Status.FAILED)
    rollout.refresh_from_db()
    assert (rollout.status, rollout.reward) == (Rollout.Status.FAILED, 0.0)
    return rollout


def test_the_change_form_cannot_forge_a_rollouts_status_or_reward(admin_client_, failed_rollout):
    url = f"{ROLLOUTS}{failed_rollout.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200 and f"rollout {failed_rollout.pk}" in page.content.decode()  # it can be read
    forged = {**change_form_data(page.content.decode()), "status": ["succeeded"], "reward": ["1.0"],
              "eval_output": ["OK"], "_save": ["Save"]}

    admin_client_.post(url, forged)

    failed_rollout.refresh_from_db()
    assert (failed_rollout.status, failed_rollout.reward, failed_rollout.eval_output) == (
        Rollout.Status.FAILED, 0.0, "")
    for name in ("status", "reward", "eval_output", "trajectory"):
        assert f'name="{name}"' not in page.content.decode()


def test_no_rollout_can_be_added_by_hand(admin_client_, failed_rollout):
    before = Rollout.objects.count()

    response = admin_client_.post(f"{ROLLOUTS}add/", {
        "job": failed_rollout.job_id, "task": failed_rollout.task_id, "sample_index": 7, "status": "succeeded",
        "reward": "1.0", "attempt": 1, "steps": 0, "timings": "{}", "_save": "Save"})

    assert response.status_code == 403
    assert Rollout.objects.count() == before
    assert "Add rollout" not in admin_client_.get(ROLLOUTS).content.decode()
