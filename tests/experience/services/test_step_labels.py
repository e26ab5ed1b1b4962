"""Curators' step labels: from the project's set only, one per (step, label) with its note, each change a
curation event; an excluding label (reward-hack) keeps the run out of dataset builds; the explorer filter."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from experience.errors import NotFound, ValidationError
from experience.models import CurationEvent, Label
from experience.search import filters_from_params, trajectory_search
from experience.services.dataset_source import runs_matching
from experience.services.step_labels import step_label_add, step_label_remove, step_labels_of
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator():
    return get_user_model().objects.create_user("cur")


def test_a_label_is_a_human_label_on_the_step_with_its_note_and_an_event(curator):
    (run,) = stored(run_record())

    step_label_add(trajectory_id=run, seq=3, name="wrong-tool", note="used sed, meant to edit", actor=curator)
    step_label_add(trajectory_id=run, seq=3, name="wrong-tool", note="sed on a binary file", actor=curator)

    label = Label.objects.get(trajectory_id=run, source="human")
    assert (label.step.seq, label.name, label.value["note"]) == (3, "wrong-tool", "sed on a binary file")
    events = list(CurationEvent.objects.filter(trajectory_id=run).order_by("id").values_list("action", "before", "after"))
    assert events[0] == ("step_label", {}, {"label": "wrong-tool", "seq": 3, "note": "used sed, meant to edit"})
    assert events[1][1]["note"] == "used sed, meant to edit" and events[1][2]["note"] == "sed on a binary file"
    assert step_labels_of(trajectory_id=run)[0]["by"] == "cur"


def test_labels_outside_the_set_and_missing_steps_are_refused_and_nothing_is_written(curator):
    (run,) = stored(run_record())

    with pytest.raises(ValidationError, match="'lgtm' is not in the project's label set"):
        step_label_add(trajectory_id=run, seq=1, name="lgtm", actor=curator)
    with pytest.raises(NotFound, match="has no step 99"):
        step_label_add(trajectory_id=run, seq=99, name="good-step", actor=curator)
    assert not Label.objects.filter(source="human").exists() and not CurationEvent.objects.exists()


def test_the_label_set_is_configurable(settings, curator):
    settings.TROVE_STEP_LABELS = ["tidy", "messy"]
    (run,) = stored(run_record())

    step_label_add(trajectory_id=run, seq=0, name="messy", actor=curator)
    with pytest.raises(ValidationError):
        step_label_add(trajectory_id=run, seq=0, name="good-step", actor=curator)


def test_removing_a_label_leaves_an_event(curator):
    (run,) = stored(run_record())
    step_label_add(trajectory_id=run, seq=2, name="good-step", note="nice", actor=curator)

    assert step_label_remove(trajectory_id=run, seq=2, name="good-step", actor=curator, reason="misclick")
    assert not step_label_remove(trajectory_id=run, seq=2, name="good-step", actor=curator)
    assert not Label.objects.filter(source="human").exists()
    assert CurationEvent.objects.filter(action="step_unlabel", reason="misclick").count() == 1


def test_a_reward_hack_label_keeps_the_run_out_of_dataset_builds_and_others_do_not(curator):
    hacked, wrong, clean = stored(run_record(), run_record(), run_record())
    step_label_add(trajectory_id=hacked, seq=1, name="reward-hack", note="edited the test", actor=curator)
    step_label_add(trajectory_id=wrong, seq=1, name="wrong-tool", actor=curator)

    assert sorted(runs_matching({}).values_list("pk", flat=True)) == [wrong, clean]


def test_the_explorer_filter_finds_runs_with_a_step_label(curator):
    labelled, _ = stored(run_record(), run_record())
    step_label_add(trajectory_id=labelled, seq=0, name="hallucinated-output", actor=curator)

    found = trajectory_search(filters=filters_from_params({"step_label": "hallucinated-output"}))

    assert list(found.values_list("pk", flat=True)) == [labelled]


@pytest.fixture
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.mark.parametrize("kind", ["outcome", "value"])
def test_a_step_label_is_a_column_of_the_runs_dataset_rows(kind, curator, dataset_dir):
    from experience.services import datasets
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=1)
    step_label_add(trajectory_id=runs[0].pk, seq=1, name="wrong-tool", note="sed, not the editor", actor=curator)
    dataset = datasets.dataset_create(name=f"labelled-{kind}", kind=kind)

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = rows_of(version)
    labelled = [row for row in rows if row["trajectory_id"] == str(runs[0].pk)]
    assert labelled and all(row["step_labels"] == [{"step": 1, "label": "wrong-tool", "note": "sed, not the editor"}]
                            for row in labelled)
    assert all(row["step_labels"] == [] for row in rows if row["trajectory_id"] != str(runs[0].pk))


def test_a_step_label_is_a_column_of_the_runs_sft_rows(curator, dataset_dir):
    from experience.services import datasets
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=0)
    step_label_add(trajectory_id=runs[0].pk, seq=1, name="good-step", note="read the failing test first", actor=curator)
    dataset = datasets.dataset_create(name="labelled-sft", kind="sft")

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = {row["trajectory_id"]: row for row in rows_of(version)}
    assert rows[str(runs[0].pk)]["step_labels"] == [{"step": 1, "label": "good-step", "note": "read the failing test first"}]
    assert all(row["step_labels"] == [] for key, row in rows.items() if key != str(runs[0].pk))


def test_each_side_of_a_pairwise_row_carries_its_runs_step_labels(curator, dataset_dir):
    from experience.services import datasets
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=1)  # per task: the success, then the failure
    winner, loser = runs[0], runs[1]
    step_label_add(trajectory_id=winner.pk, seq=1, name="good-step", note="ran the tests", actor=curator)
    step_label_add(trajectory_id=loser.pk, seq=2, name="hallucinated-output", note="no such file", actor=curator)
    dataset = datasets.dataset_create(name="labelled-pairs", kind="pairwise")

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = rows_of(version)
    pair = next(row for row in rows if row["chosen_trajectory_id"] == str(winner.pk))
    assert pair["rejected_trajectory_id"] == str(loser.pk)
    assert pair["chosen_step_labels"] == [{"step": 1, "label": "good-step", "note": "ran the tests"}]
    assert pair["rejected_step_labels"] == [{"step": 2, "label": "hallucinated-output", "note": "no such file"}]
    others = [row for row in rows if row is not pair]
    assert others and all(row["chosen_step_labels"] == row["rejected_step_labels"] == [] for row in others)


def test_a_wrong_tool_label_ends_the_trained_prefix_of_an_sft_row(curator, dataset_dir):
    from experience.services import datasets
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=0)  # successes: no harmful step of their own
    labelled = runs[0]
    step_label_add(trajectory_id=labelled.pk, seq=2, name="wrong-tool", actor=curator)
    dataset = datasets.dataset_create(name="sft-labelled", kind="sft")

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = {row["trajectory_id"]: row for row in rows_of(version)}
    others = [row for key, row in rows.items() if key != str(labelled.pk)]
    assert all(row["harmful_step"] is None for row in others)
    row = rows[str(labelled.pk)]
    assert row["harmful_step"] == 2 and row["trained_turns"] < max(r["trained_turns"] for r in others)


def test_a_rubric_override_needs_a_reason_is_an_event_and_wins_in_dataset_rows(curator, dataset_dir):
    from experience.distill.rubric import LABELS
    from experience.services import datasets
    from experience.services.step_labels import rubric_override
    from tests.experience.services.dataset_store import rows_of, store_tasks

    runs = store_tasks([f"task-{n}" for n in range(6)], good=1, bad=1)
    name = LABELS[0]
    with pytest.raises(ValidationError, match="say why"):
        rubric_override(trajectory_id=runs[0].pk, name=name, value=True, reason="")
    with pytest.raises(ValidationError, match="not a rubric label"):
        rubric_override(trajectory_id=runs[0].pk, name="made-up", value=True, reason="x")
    rubric_override(trajectory_id=runs[0].pk, name=name, value=True, reason="the detector missed it", actor=curator)
    dataset = datasets.dataset_create(name="overridden", kind="outcome")

    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    rows = {row["trajectory_id"]: row for row in rows_of(version)}
    assert rows[str(runs[0].pk)]["rubric"][name] is True
    assert rows[str(runs[0].pk)]["step_labels"] == []  # a verdict is not a step label
    assert CurationEvent.objects.get(action="rubric_override").reason == "the detector missed it"
