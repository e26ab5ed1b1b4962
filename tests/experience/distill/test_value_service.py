"""`manage.py value_baseline` measures on held-out tasks only, and the learned model runs through it.

Runs stored through the real ingest service and a version built by the real build service (Postgres).
"""

import io

import pytest
from django.core.management import CommandError, call_command
from value_runs import demo_like_runs

from experience.distill.spec import DatasetSpec
from experience.distill.values import value_rows
from experience.errors import ValidationError
from experience.models import DatasetVersion, Step
from experience.services import datasets
from experience.services.value_baseline import value_baseline_run, version_runs_by_task
from tests.experience.services.dataset_store import rows_of, store_tasks

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(24)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path, monkeypatch):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def built(name: str = "vs", options: dict | None = None) -> DatasetVersion:
    dataset = datasets.dataset_create(name=name, kind="value", options=options or {})
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    return datasets.dataset_version_build(version_id=version.pk)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_splits_share_no_task(seed):
    spec = DatasetSpec(kind="value", seed=seed, splits={"train": 0.6, "val": 0.2, "test": 0.2})
    tasks: dict[str, set[str]] = {"train": set(), "val": set(), "test": set()}
    run_splits: dict[str, set[str]] = {}
    for row in value_rows(demo_like_runs(seed, 20, 3), spec):
        tasks[row["split"]].add(row["task_key"])
        run_splits.setdefault(row["trajectory_id"], set()).add(row["split"])

    assert tasks["train"] and tasks["test"], tasks
    assert all(len(splits) == 1 for splits in run_splits.values())
    assert not tasks["train"] & tasks["test"] and not tasks["train"] & tasks["val"]
    assert not tasks["val"] & tasks["test"]


def test_held_out_figures_come_from_test_tasks_the_model_never_trained_on():
    store_tasks(TASKS, good=2, bad=2)
    version = built()
    train_tasks = {row["task_key"] for row in rows_of(version) if row["split"] == "train"}
    spec = DatasetSpec.from_dict(version.spec)
    test_tasks = {task for task, _runs in version_runs_by_task(version, spec, split="test")}

    metrics = value_baseline_run(version=version, trials=20)

    assert test_tasks and not test_tasks & train_tasks
    heldout = metrics["heldout"]
    assert heldout["tasks"] == len(test_tasks) == version.manifest["splits"]["test"]["tasks"]
    assert heldout["runs"] == 4 * len(test_tasks)
    assert heldout["decisions"] == version.manifest["splits"]["test"]["rows"]
    assert heldout["auc"] > 0.9 and heldout["run_auc"] == 1.0, "good and bad runs differ plainly"
    assert 0.0 <= heldout["ece"] <= 1.0 and heldout["success_rate"] == 0.5
    assert metrics["best_of_n"]["4"]["tasks"] == len(test_tasks)


def test_the_learned_model_trains_scores_the_steps_and_keeps_the_baselines_figures():
    store_tasks(TASKS, good=2, bad=2)
    version = built()
    call_command("value_baseline", "vs@1", "--trials", "20", stdout=io.StringIO())
    baseline_values = dict(Step.objects.filter(value_estimate__isnull=False).values_list("pk", "value_estimate"))
    out = io.StringIO()

    call_command("value_baseline", "vs@1", "--model", "learned", "--trials", "20", stdout=out)

    version.refresh_from_db()
    metrics = version.metrics
    assert metrics["model"] == "minilm-mlp-head"
    assert set(metrics["by_model"]) == {"logreg-hashing-baseline", "minilm-mlp-head"}
    assert metrics["by_model"]["logreg-hashing-baseline"]["heldout"]["tasks"] == metrics["heldout"]["tasks"] > 0
    assert metrics["heldout"]["run_auc"] > 0.9, "the learned model tells plainly good runs from bad ones"
    four = metrics["best_of_n"]["4"]
    assert four["random"] < four["reranked"] <= four["oracle"]
    learned_values = dict(Step.objects.filter(value_estimate__isnull=False).values_list("pk", "value_estimate"))
    assert learned_values.keys() == baseline_values.keys() and learned_values != baseline_values
    assert all(0.0 < value < 1.0 for value in learned_values.values())
    assert "minilm-mlp-head trained on" in out.getvalue() and "ECE" in out.getvalue()


def test_an_unknown_model_is_refused_before_anything_is_written():
    store_tasks(TASKS[:12], good=1, bad=1)
    version = built()

    with pytest.raises(ValidationError, match="model: must be one of baseline, learned"):
        value_baseline_run(version=version, model="gpt")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("value_baseline", "vs@1", "--model", "gpt", stdout=io.StringIO())

    version.refresh_from_db()
    assert version.metrics in (None, {}) and not Step.objects.filter(value_estimate__isnull=False).exists()
