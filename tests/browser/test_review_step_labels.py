"""Step labels in a real browser: a curator selects a step on the run page, labels it reward-hack with a
note; the explorer's step-label filter finds the run; a dataset built afterwards leaves it out. Approve and
reject (with its required reason) from the same panel."""

from __future__ import annotations

import pytest

from experience.models import Label, Trajectory
from experience.services import datasets
from tests.browser.test_review_jobs import shot
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def label_step(page, seq: int, label: str, note: str) -> None:
    """Select step `seq` on the open run page and give it `label` with `note` through the label form."""
    page.locator(f"#step-{seq}").wait_for()
    page.locator(f"#step-{seq}").click()
    page.wait_for_function(f"document.getElementById('step-label-seq').value === '{seq}'")
    page.select_option("#step-label-name", label)
    page.fill("#step-label-form input[name=note]", note)
    page.click("#step-label-form button[type=submit]")
    page.wait_for_selector(f"#step-labels li[data-seq='{seq}'][data-label='{label}']")


def test_a_curator_labels_the_selected_step_and_the_build_leaves_the_run_out(logged_in_page, live_server):
    hacked, clean = stored(run_record(task_key="t-1"), run_record(task_key="t-1"))
    page = logged_in_page

    page.goto(f"{live_server.url}/trajectories/{hacked}/")
    label_step(page, 3, "reward-hack", "rewrote the test to pass")
    shot(page, "run-page-step-label.png")

    label = Label.objects.get(source="human")
    assert (label.trajectory_id, label.step.seq, label.value["note"]) == (hacked, 3, "rewrote the test to pass")

    page.goto(f"{live_server.url}/trajectories/")
    page.select_option("#filters select[name=step_label]", "reward-hack")
    page.click("#filters button[type=submit]")
    listed = page.locator("#trajectories tr[data-id]").evaluate_all("rows => rows.map(r => Number(r.dataset.id))")
    assert listed == [hacked]

    dataset = datasets.dataset_create(name="outcomes", kind="outcome")
    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    assert version.manifest["source_trajectory_ids"] == [str(clean)]


def test_reject_asks_for_a_reason_then_approve(logged_in_page, live_server):
    (run,) = stored(run_record())
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{run}/")

    page.click("#reject-form button[type=submit]")  # the browser refuses an empty required reason
    assert Trajectory.objects.get(pk=run).curation_status == "pending"
    page.fill("#reject-form input[name=reason]", "never ran the tests")
    page.click("#reject-form button[type=submit]")
    page.wait_for_selector("#curation-status >> text=rejected")
    page.click("#approve-form button[type=submit]")
    page.wait_for_selector("#curation-status >> text=approved")
    assert "never ran the tests" in page.locator("#curation-history").inner_text()


def test_a_step_label_given_on_the_run_page_appears_in_a_built_dataset_row(logged_in_page, live_server):
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=1)
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{runs[0].pk}/")
    label_step(page, 1, "wrong-tool", "grep would have found it")

    dataset = datasets.dataset_create(name="outcome-labelled", kind="outcome")
    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    (row,) = [r for r in rows_of(version) if r["trajectory_id"] == str(runs[0].pk)]
    assert row["step_labels"] == [{"step": 1, "label": "wrong-tool", "note": "grep would have found it"}]
