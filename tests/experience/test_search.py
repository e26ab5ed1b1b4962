"""Search: filters, full text over step content (Postgres FTS, SQLite substring), keyset pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from experience.errors import ValidationError
from experience.models import StepSearch, Trajectory
from experience.records import StepRecord
from experience.search import (
    TrajectoryFilters,
    filters_from_params,
    page_after,
    trajectory_search,
    trajectory_similar,
)
from experience.services.dedup import trajectory_dedup
from experience.services.ingest import steps_append
from experience.services.search_index import search_index_all, search_index_backlog
from tests.experience.services.store_factories import RunFactory, StepFactory, run_record, stored

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="Postgres full-text search")


def found(**params) -> list[int]:
    return sorted(trajectory_search(filters=filters_from_params(params)).values_list("pk", flat=True))


def test_each_filter_narrows_to_the_runs_that_match():
    a, b, c = stored(
        RunFactory(task_key="t-1", model="m-1", harness="swe-agent", source="import", source_format="swe-agent-traj",
                   status="completed", success=True),
        RunFactory(task_key="t-2", model="m-2", harness="builtin", source="rollout", status="failed", success=False),
        RunFactory(task_key="t-2", model="m-2", harness="builtin", source="rollout", status="completed"),
    )
    Trajectory.objects.filter(pk=b).update(curation_status="approved", tags=["gold", "short"], is_duplicate=True)
    Trajectory.objects.filter(pk=c).update(tags=["short"], created_at=timezone.now() - timedelta(days=10))

    assert found(task="t-2") == [b, c]
    assert found(model="m-1") == [a]
    assert found(harness="builtin", source="rollout") == [b, c]
    assert found(source_format="swe-agent-traj") == [a]
    assert found(status="failed,completed") == [a, b, c] and found(status="failed") == [b]
    assert (found(outcome="success"), found(outcome="failure"), found(outcome="unknown")) == ([a], [b], [c])
    assert found(curation="approved") == [b] and found(curation="pending,rejected") == [a, c]
    assert (found(duplicate="exclude"), found(duplicate="only")) == ([a, c], [b])
    assert found(tags="short") == [b, c] and found(tags="short,gold") == [b]
    since = (timezone.now() - timedelta(days=1)).isoformat()
    assert found(created_after=since) == [a, b] and found(created_before=since) == [c]
    assert found(ids=f"{a},{c}") == [a, c]


def test_full_text_finds_a_command_string_before_and_after_indexing():
    hit, miss = stored(run_record(commands=["grep -rn 'def parse_time' src/util.py", "ls"]),
                       run_record(commands=["cat README.md"]))

    before = found(q="grep -rn 'def parse_time' src/util.py")
    indexed = search_index_all()
    after = found(q="grep -rn 'def parse_time' src/util.py")

    assert before == after == [hit]
    assert found(q="parse_time") == [hit] and found(q="README.md") == [miss]
    assert found(q="nothing-like-this-anywhere") == []
    if connection.vendor == "postgresql":
        assert indexed == 2 and search_index_backlog() == 0
        assert StepSearch.objects.count() == Trajectory.objects.get(pk=hit).n_steps + Trajectory.objects.get(pk=miss).n_steps


@postgres_only
def test_full_text_reads_outputs_and_thoughts_and_takes_websearch_syntax():
    (pk,) = stored(RunFactory(steps=[
        StepFactory(command="python manage.py test", output="FAILED (errors=2) ImportError: No module named yaml"),
        StepRecord(kind="message", text="I think the YAML loader is missing", payload={"role": "assistant"}),
    ]))
    search_index_all()

    assert found(q="ImportError yaml") == [pk]
    assert found(q='"no module named yaml"') == [pk] and found(q='"named module"') == []
    assert found(q="loader or nonexistentword") == [pk]
    assert found(q="python manage.py test --verbosity") == []


@postgres_only
def test_steps_appended_later_are_searchable_and_queue_the_run_again():
    (pk,) = stored(run_record(calls=1))
    search_index_all()

    steps_append(trajectory_id=pk, steps=[StepFactory(command="make flamegraph")])

    assert Trajectory.objects.get(pk=pk).search_indexed is False
    assert found(q="flamegraph") == [pk]
    search_index_all()
    assert found(q="flamegraph") == [pk] and search_index_backlog() == 0


@postgres_only
def test_the_full_text_query_uses_the_gin_index():
    stored(run_record(calls=1))
    search_index_all()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT trajectory_id FROM experience_stepsearch "
                       "WHERE document @@ websearch_to_tsquery('simple', 'pytest')")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "stepsearch_document_gin" in plan


def test_keyset_pages_walk_every_run_once_newest_first(django_assert_num_queries):
    ids = stored(*[RunFactory(steps=[]) for _ in range(7)])
    queryset = trajectory_search(filters=TrajectoryFilters())

    seen, cursor = [], None
    while True:
        with django_assert_num_queries(1):
            page = page_after(queryset, after=cursor, limit=3)
        seen += [t.pk for t in page.rows]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor

    assert seen == sorted(ids, reverse=True)


@pytest.mark.parametrize(("params", "field"), [
    ({"status": "finished"}, "status"),
    ({"outcome": "maybe"}, "outcome"),
    ({"duplicate": "some"}, "duplicate"),
    ({"created_after": "last tuesday"}, "created_after"),
    ({"ids": "1,x"}, "ids"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_filter_value_names_the_parameter(params, field):
    with pytest.raises(ValidationError) as caught:
        filters_from_params(params)

    assert caught.value.field == field


def test_filters_survive_a_round_trip_through_query_parameters():
    filters = filters_from_params({"task": "t", "status": ["completed", "failed"], "tags": "a,b",
                                   "duplicate": "exclude", "created_after": "2025-01-02", "q": "pytest"})

    assert filters_from_params(filters.as_params()) == filters
    assert filters.status == ("completed", "failed") and filters.tags == ("a", "b")


def test_similar_runs_come_most_similar_first_through_the_dedup_service(settings, tmp_path):
    # The real dedup service: runs hashed, embedded (lexical) and indexed in FAISS; the search hook ranks the
    # runs of the same task by cosine and keeps only those its other filters admit.
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    shared = ["ls", "cat calc.py", "python -m pytest tests", "sed -i s/a/b/ calc.py"]
    a, b, c, d = stored(
        run_record(commands=shared + ["python -m pytest tests -q"], task_key="t", model="m", status="completed"),
        run_record(commands=["git log", "make lint", "pip list", "du -sh ."], task_key="t", model="m",
                   status="completed"),
        run_record(commands=shared + ["python -m pytest tests -x"], task_key="t", model="m", status="completed"),
        run_record(commands=shared + ["python -m pytest tests -q"], task_key="t", model="x", status="completed"),
    )
    trajectory_dedup(trajectory_ids=[a, b, c, d], embedder="lexical")
    settings.TROVE_DEDUP_EMBEDDER = "lexical"

    ranked = trajectory_similar(filters=filters_from_params({"similar": str(a), "model": "m"}))

    assert [t.pk for t in ranked] == [c, b]
