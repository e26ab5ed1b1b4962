"""`manage.py value_baseline`: train on a built value version, store metrics, score the test runs' steps."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.models import DatasetVersion, Step, Trajectory
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(30)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def built(kind: str = "value", name: str = "vb") -> DatasetVersion:
    dataset = datasets.dataset_create(name=name, kind=kind)
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    return datasets.dataset_version_build(version_id=version.pk)


def split_of(task_key: str) -> str:
    return split_for_task(task_key, DatasetSpec(kind="value"))[1]


def test_it_stores_auc_and_best_of_n_and_writes_value_estimates_on_test_runs():
    store_tasks(TASKS, good=2, bad=2)
    version = built()
    out = io.StringIO()

    call_command("value_baseline", "vb@1", "--trials", "50", stdout=out)

    version.refresh_from_db()
    metrics = version.metrics
    assert metrics["model"] == "logreg-hashing-baseline"
    assert metrics["train_rows"] == version.manifest["splits"]["train"]["rows"]
    assert 0.9 <= metrics["auc_val"] <= 1.0, "good and bad runs differ plainly: the model tells them apart"
    two, four, eight = metrics["best_of_n"]["2"], metrics["best_of_n"]["4"], metrics["best_of_n"]["8"]
    test_tasks = version.manifest["splits"]["test"]["tasks"]
    assert two["tasks"] == four["tasks"] == test_tasks > 0
    assert two["reranked"] > two["random"] and four["reranked"] == four["oracle"] == 1.0
    assert eight == {"n": 8, "tasks": 0, "trials": 50, "random": None, "reranked": None, "oracle": None}
    assert "AUC on val" in out.getvalue() and "N=4" in out.getvalue()

    scored = Step.objects.filter(value_estimate__isnull=False)
    assert metrics["scored_steps"] == scored.count() > 0
    assert {split_of(key) for key in scored.values_list("trajectory__task_key", flat=True)} == {"test"}
    assert set(scored.values_list("kind", flat=True)) == {"model_call"}, "a decision starts at its model call"
    test_runs = [t for t in Trajectory.objects.all() if split_of(t.task_key) == "test"]
    assert metrics["scored_runs"] == len(test_runs)
    good = next(t for t in test_runs if t.success)
    bad = next(t for t in test_runs if not t.success)
    last = lambda t: t.steps.filter(value_estimate__isnull=False).order_by("-seq").first().value_estimate  # noqa: E731
    assert last(good) > last(bad)


def test_scope_all_scores_every_run_of_the_version():
    runs = store_tasks(TASKS[:16], good=1, bad=1)
    built()

    call_command("value_baseline", "vb@1", "--scope", "all", "--best-of", "2", stdout=io.StringIO())

    assert Trajectory.objects.filter(steps__value_estimate__isnull=False).distinct().count() == len(runs)


def test_it_refuses_a_kind_without_outcomes_per_row_and_an_unknown_version():
    store_tasks(TASKS[:8])
    built(kind="pairwise", name="pairs")

    with pytest.raises(CommandError, match="needs a value or outcome set"):
        call_command("value_baseline", "pairs@1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="has no version 9"):
        call_command("value_baseline", "pairs@9", stdout=io.StringIO())


def test_an_outcome_version_works_too_and_a_version_id_is_accepted():
    store_tasks(TASKS, good=2, bad=2)
    version = built(kind="outcome", name="outcomes")

    call_command("value_baseline", str(version.pk), "--trials", "20", stdout=io.StringIO())

    version.refresh_from_db()
    assert version.metrics["auc_val"] is not None and version.metrics["best_of_n"]["2"]["tasks"] > 0
