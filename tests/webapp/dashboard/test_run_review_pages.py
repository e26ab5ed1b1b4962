"""The run page's review panel, as a browser posts it: approve, reject (a reason required), tag, note, mark a
duplicate, label a step; a reader sees the labels but no controls and may not post them."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.models import CurationEvent, Label, Trajectory
from tests.experience.services.store_factories import run_record, stored
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator():
    client = Client()
    user = get_user_model().objects.create_user("cur")
    user.groups.add(role_groups_sync()["curator"])
    client.force_login(user)
    return client


def test_a_rejection_needs_a_reason(curator):
    (run,) = stored(run_record())

    curator.post(f"/trajectories/{run}/review/", {"action": "reject"})
    assert Trajectory.objects.get(pk=run).curation_status == "pending"
    curator.post(f"/trajectories/{run}/review/", {"action": "reject", "reason": "edits the tests"})

    assert Trajectory.objects.get(pk=run).curation_status == "rejected"
    assert CurationEvent.objects.get(trajectory_id=run, action="reject").reason == "edits the tests"


def test_approve_tag_note_and_duplicate_from_the_run_page(curator):
    run, other = stored(run_record(), run_record())

    for fields in ({"action": "approve"}, {"action": "tag", "tags": "flaky,nice"}, {"action": "note", "note": "ok"},
                   {"action": "mark_duplicate", "canonical": other}):
        assert curator.post(f"/trajectories/{run}/review/", fields).status_code == 302

    row = Trajectory.objects.get(pk=run)
    assert (row.curation_status, sorted(row.tags), row.is_duplicate, row.canonical_id) == (
        "approved", ["flaky", "nice"], True, other)
    assert "ok" in row.notes


def test_a_step_label_from_the_page_goes_back_to_the_step(curator):
    (run,) = stored(run_record())

    answer = curator.post(f"/trajectories/{run}/step-label/", {"seq": 3, "label": "wrong-tool", "note": "grep, not sed"})
    page = curator.get(f"/trajectories/{run}/").content.decode()

    assert answer["Location"] == f"/trajectories/{run}/#step-3"
    assert Label.objects.get(source="human").value["note"] == "grep, not sed"
    assert 'data-seq="3" data-label="wrong-tool"' in page and 'id="step-label-form"' in page


def test_a_reader_sees_labels_but_no_controls_and_cannot_post():
    (run,) = stored(run_record())
    from experience.services.step_labels import step_label_add

    step_label_add(trajectory_id=run, seq=1, name="good-step")
    reader = Client()
    reader.force_login(get_user_model().objects.create_user("reader"))

    page = reader.get(f"/trajectories/{run}/").content.decode()
    refused = reader.post(f"/trajectories/{run}/step-label/", {"seq": 1, "label": "reward-hack"})

    assert 'data-label="good-step"' in page and 'id="step-label-form"' not in page
    assert refused.status_code == 403 and Label.objects.filter(source="human").count() == 1


def test_a_rubric_override_from_the_run_page(curator):
    from experience.distill.rubric import LABELS

    (run,) = stored(run_record())

    curator.post(f"/trajectories/{run}/rubric-override/", {"label": LABELS[0], "value": "false", "reason": ""})
    assert not Label.objects.filter(source="human").exists()
    curator.post(f"/trajectories/{run}/rubric-override/", {"label": LABELS[0], "value": "false", "reason": "a false alarm"})

    assert Label.objects.get(source="human", step__isnull=True).value["override"] is False
    assert 'id="rubric-override-form"' in curator.get(f"/trajectories/{run}/").content.decode()


def test_the_run_page_shows_each_rubric_label_with_the_step_it_changed_at_and_what_that_step_did(curator, settings,
                                                                                                  tmp_path):
    from experience.services import datasets
    from tests.experience.services.dataset_store import store_tasks

    settings.TROVE_DATASET_DIR = tmp_path / "datasets"
    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=1)
    dataset = datasets.dataset_create(name="rubric-labelled", kind="value")
    datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    changed = (Label.objects.filter(trajectory_id__in=[r.pk for r in runs], source="rubric", step__isnull=False)
               .select_related("step").first())
    assert changed is not None, "the build stores rubric labels with the step they changed at"

    page = curator.get(f"/trajectories/{changed.trajectory_id}/").content.decode()

    review = page[page.index('id="review"'):page.index('id="run-review"')]
    shown = f'{changed.name}: {str(changed.value).lower()} at <a href="#step-{changed.step.seq}">#{changed.step.seq}</a>'
    assert shown in review
    trigger = changed.step.preview.splitlines()[0][:60]
    assert trigger and f'<code class="label-trigger">{trigger}' in review


def test_a_curators_step_label_reads_as_its_note_and_author_not_as_a_dict(curator):
    from experience.services.step_labels import step_label_add

    [run] = stored(run_record())
    step_label_add(trajectory_id=run, seq=1, name="reward-hack", note="rewrote the test to pass",
                   actor=get_user_model().objects.get(username="cur"))

    page = curator.get(f"/trajectories/{run}/").content.decode()

    review = page[page.index('id="review"'):page.index('id="run-review"')]
    assert "reward-hack: “rewrote the test to pass” by cur at" in review
    assert "{&#x27;by&#x27;" not in review and "{'by'" not in review
