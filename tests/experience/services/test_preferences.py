"""Pairwise preferences: two runs of one task, a reason required, judged once; the pairwise dataset kind
takes them (frozen into the version) before its automatic pairs, even between two runs that both succeeded."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from experience.errors import Conflict, ValidationError
from experience.models import CurationEvent, Trajectory
from experience.services import datasets
from experience.services.preferences import next_unjudged_pair, preference_record
from tests.experience.services.dataset_store import rows_of
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def test_a_preference_needs_a_reason_the_same_task_and_is_given_once():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    (other,) = stored(run_record(task_key="u"))
    curator = get_user_model().objects.create_user("cur")

    with pytest.raises(ValidationError, match="say why"):
        preference_record(chosen_id=a, rejected_id=b, reason=" ")
    with pytest.raises(ValidationError, match="different tasks"):
        preference_record(chosen_id=a, rejected_id=other, reason="x")
    preference_record(chosen_id=a, rejected_id=b, reason="fewer wasted steps", actor=curator)
    with pytest.raises(Conflict):
        preference_record(chosen_id=b, rejected_id=a, reason="changed my mind")
    assert CurationEvent.objects.filter(action="preference", reason="fewer wasted steps").count() == 2


def test_the_next_pair_is_two_runs_of_one_task_not_judged_yet():
    a, b, c = stored(run_record(task_key="t"), run_record(task_key="t"), run_record(task_key="t"))
    stored(run_record(task_key="lonely"))
    preference_record(chosen_id=c, rejected_id=b, reason="r")

    first = next_unjudged_pair(trajectories=Trajectory.objects.all())

    assert {run.pk for run in first} in ({a, c}, {a, b})


def test_a_human_choice_becomes_a_pair_before_the_automatic_ones_even_between_two_successes():
    better, worse = stored(run_record(task_key="t"), run_record(task_key="t"))  # both succeeded
    preference_record(chosen_id=worse, rejected_id=better, reason="the other one hardcoded the answer")
    dataset = datasets.dataset_create(name="prefs", kind="pairwise")

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = rows_of(version)
    assert [(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in rows] == [(str(worse), str(better))]
    assert version.spec["preferences"] == [[str(worse), str(better)]]


def test_a_spec_without_preferences_keeps_its_identity():
    from experience.distill.spec import DatasetSpec

    assert "preferences" not in DatasetSpec(kind="pairwise").to_dict()
    assert DatasetSpec.from_dict({"kind": "pairwise", "preferences": [["1", "2"]]}).preferences == [["1", "2"]]
