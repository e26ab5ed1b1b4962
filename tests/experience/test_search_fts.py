"""Full-text search in the websearch grammar (`or`, "phrases", prefix*) on both stores: Postgres's GIN index
over StepSearch documents, and the embedded store's FTS5 index that triggers keep in sync with the steps."""

from __future__ import annotations

import pytest
from django.db import connection

from experience.models import Step, Trajectory
from experience.records import StepRecord
from experience.search import filters_from_params, trajectory_search
from experience.search_hits import fts5_query, search_hits, tsquery_sql
from experience.services.ingest import steps_append
from experience.services.search_index import search_index_all
from tests.experience.services.store_factories import RunFactory, StepFactory, stored

pytestmark = pytest.mark.django_db
sqlite_only = pytest.mark.skipif("connection.vendor != 'sqlite'", reason="the embedded store's FTS5 index")


def found(q: str) -> list[int]:
    search_index_all()  # Postgres: index what arrived (a no-op on SQLite, whose triggers index at write time)
    return sorted(trajectory_search(filters=filters_from_params({"q": q})).values_list("pk", flat=True))


@pytest.fixture
def three_runs() -> tuple[int, int, int]:
    return tuple(stored(
        RunFactory(steps=[StepFactory(command="python manage.py test",
                                      output="FAILED (errors=2) ImportError: No module named yaml"),
                          StepRecord(kind="message", text="I think the YAML loader is missing",
                                     payload={"role": "assistant"})]),
        RunFactory(steps=[StepFactory(command="make flamegraph", output="wrote perf.svg")]),
        RunFactory(steps=[StepFactory(command="cat src/pkg/mod.py", output="named module")]),
    ))


def test_words_must_all_be_in_one_step(three_runs):
    yaml, flame, mod = three_runs

    assert found("ImportError yaml") == [yaml]
    assert found("importerror YAML") == [yaml]  # case folds on both stores
    assert found("yaml flamegraph") == []  # each in a different run
    assert found("loader errors") == []  # same run, different steps


def test_a_quoted_phrase_is_its_words_in_order(three_runs):
    yaml, flame, mod = three_runs

    assert found('"no module named yaml"') == [yaml]
    assert found('"named module"') == [mod]
    assert found('"yaml named"') == []


def test_or_joins_alternatives(three_runs):
    yaml, flame, mod = three_runs

    assert found("loader or nonexistentword") == [yaml]
    assert found('"named module" or flamegraph') == [flame, mod]
    assert found('"no module" OR perf svg') == [yaml, flame]


def test_a_star_is_a_prefix(three_runs):
    yaml, flame, mod = three_runs

    assert found("flame*") == [flame]
    assert found("flame") == []  # without the star, a whole word
    assert found("import* or flam*") == [yaml, flame]


def test_a_path_matches_by_its_pieces(three_runs):
    yaml, flame, mod = three_runs

    assert found("src/pkg/mod.py") == [mod]
    assert found("mod") == [mod]


# Operators of FTS5's own syntax are plain words here (so `near`, `body`, `and` must be in the step), as they
# are in Postgres's websearch grammar.
@pytest.mark.parametrize(("q", "finds_yaml"), [
    ("^yaml", True), ("yaml:", True), ("(yaml)", True), ("yaml loader", True),
    ("NEAR(yaml loader)", False), ("body:yaml", False), ("yaml AND", False), ('"unbalanced', False),
    ("*", False), ("-", False), ("()", False),
])
def test_query_text_is_never_read_as_fts5_syntax(three_runs, q, finds_yaml):
    yaml, flame, mod = three_runs

    assert found(q) == ([yaml] if finds_yaml else [])


def test_a_snippet_marks_the_words_of_a_phrase_in_its_step(three_runs):
    yaml, flame, mod = three_runs
    search_index_all()

    hits = search_hits(trajectory_ids=[yaml, flame], q='"module named" or perf*')

    assert set(hits) == {yaml, flame}
    assert hits[yaml].seq == 0 and "\x02module\x03" in hits[yaml].snippet.lower()
    assert hits[flame].seq == 0 and "\x02perf" in hits[flame].snippet  # Postgres marks all of perf.svg


def test_the_fts5_expression_quotes_every_token():
    assert fts5_query('"no module" or pip* -rn src/a.py') == (
        '("no module") OR ("pip"* AND "rn" AND "src" AND "a" AND "py")')
    assert fts5_query('NEAR(a b)') == '("NEAR" AND "a" AND "b")'
    assert fts5_query('"" or -- or *') == ""


@sqlite_only
def test_the_embedded_index_follows_appends_edits_and_deletes(three_runs):
    yaml, flame, mod = three_runs

    steps_append(trajectory_id=mod, steps=[StepFactory(command="pytest --benchmark-only")])
    assert found("benchmark") == [mod]

    Step.objects.filter(trajectory_id=flame).update(preview="nothing here", payload={"command": "true"})
    assert found("flamegraph") == [] and found("nothing") == [flame]

    Trajectory.objects.filter(pk=yaml).delete()
    assert found("yaml") == []
    assert _index_rows("yaml") == 0 and _index_rows("benchmark") == 1  # gone from the index itself


def _index_rows(q: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM experience_step_fts WHERE experience_step_fts MATCH %s", [fts5_query(q)])
        return cursor.fetchone()[0]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="Postgres's GIN index")
def test_the_grammar_built_tsquery_still_uses_the_gin_index(three_runs):
    search_index_all()
    query, params = tsquery_sql('"no module" or flame* yaml')
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN SELECT trajectory_id FROM experience_stepsearch WHERE document @@ ({query})", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "stepsearch_document_gin" in plan
