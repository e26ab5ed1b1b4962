"""What a search result shows beyond its row: the first step of each run that matches `q`, with a snippet of
the matching text, so the explorer can link straight to that step; the query grammar the embedded (SQLite)
store answers; and the explorer's total (exact, or estimated on a large table).

Snippets are plain text with the matches marked by MARK_START / MARK_END (control characters no step text is
allowed to smuggle through: they are stripped from the text first); a template escapes the text and only
then turns the marks into <mark> elements, so step content can never inject markup.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.db import connection
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from experience.models import Step, Trajectory
from experience.services.search_index import SEPARATORS, STEP_SEARCH_DOCUMENT

MARK_START, MARK_END = "\x02", "\x03"
SNIPPET_CHARS = 90  # either side of the first match (SQLite); Postgres's ts_headline picks its own window
STEP_FTS = "experience_step_fts"  # the embedded store's step index (SQLite FTS5, migration 0014)
ESTIMATE_ABOVE = 200_000  # rows in the trajectory table past which the explorer's total is an estimate

# A step's text as the search document sees it (experience.services.search_index), untranslated, for snippets.
_STEP_TEXT = ("concat_ws(' · ', left(s.preview, 1000), left(s.payload ->> 'command', 20000), "
              "left(s.payload ->> 'text', 20000), left(s.payload ->> 'output', 20000), "
              "left(s.payload ->> 'response_text', 20000), left(s.payload ->> 'tool_calls', 20000))")

_FIRST_HITS = """
WITH q AS (SELECT {query} AS query),
hits AS (
    SELECT x.step_id FROM experience_stepsearch x, q WHERE x.trajectory_id = ANY(%s::bigint[]) AND x.document @@ q.query
    UNION ALL
    SELECT s.id FROM experience_step s, q
    WHERE s.trajectory_id = ANY(%s::bigint[]) AND NOT EXISTS (SELECT 1 FROM experience_stepsearch x WHERE x.step_id = s.id)
      AND {document} @@ q.query
), firsts AS (
    SELECT DISTINCT ON (s.trajectory_id) s.trajectory_id, s.seq, {body} AS body
    FROM experience_step s JOIN hits h ON h.step_id = s.id ORDER BY s.trajectory_id, s.seq
)
SELECT trajectory_id, seq, ts_headline('simple', translate(body, E'\\x02\\x03', ''), q.query,
    'StartSel=' || chr(2) || ', StopSel=' || chr(3) || ', MaxWords=24, MinWords=8, MaxFragments=2, FragmentDelimiter=" … "')
FROM firsts, q
"""


@dataclass(frozen=True)
class Hit:
    """The first step of a run that matches a search, and the matching text around the match."""

    seq: int
    snippet: str


@dataclass(frozen=True)
class Term:
    text: str
    phrase: bool = False
    prefix: bool = False


_TOKEN = re.compile(r'"([^"]*)"|(\S+)')


def query_groups(q: str) -> list[list[Term]]:
    """`q` in the websearch grammar the Postgres store answers: words and "quoted phrases" that must all match
    the same step, `or` between alternatives; `word*` a prefix. A leading '-' stays part of its word (pasted
    command flags). Empty groups are dropped."""
    groups: list[list[Term]] = [[]]
    for phrase, word in _TOKEN.findall(q):
        if not phrase and word.lower() == "or":
            groups.append([])
        elif phrase.strip():
            groups[-1].append(Term(phrase.strip(), phrase=True))
        elif word:
            groups[-1].append(Term(word.rstrip("*"), prefix=word.endswith("*")) if word.rstrip("*") else Term(word))
    return [group for group in groups if group]


_SPLIT = str.maketrans(SEPARATORS, " " * len(SEPARATORS))


def tsquery_sql(q: str) -> tuple[str, list[str]]:
    """`q` (query_groups' grammar) as a Postgres tsquery expression and its parameters: a word is
    plainto_tsquery (its separators split as in the documents, SEPARATORS), a "phrase" phraseto_tsquery,
    `word*` a prefix (`'word':*`, which websearch_to_tsquery cannot say), `&&` within a group, `||` between.
    A query with no word at all is the empty tsquery, which matches nothing."""
    groups, params = [], []
    for group in query_groups(q):
        parts = []
        for term in group:
            text = term.text.translate(_SPLIT)
            if term.prefix and (tokens := _FTS_TOKEN.findall(text)):
                *head, last = tokens
                parts.append("(plainto_tsquery('simple', %s) && to_tsquery('simple', %s))")
                params += [" ".join(head), f"'{last}':*"]  # a token is letters and digits: safe to quote
            else:
                parts.append(f"{'phraseto' if term.phrase else 'plainto'}_tsquery('simple', %s)")
                params.append(text)
        groups.append("(" + " && ".join(parts) + ")")
    return (" || ".join(groups) or "''::tsquery"), params


_FTS_TOKEN = re.compile(r"[^\W_]+")  # what FTS5's unicode61 tokenizer keeps: letters and digits


def fts5_query(q: str) -> str:
    """`q` (query_groups' grammar) as an FTS5 MATCH expression over the embedded store's step index
    (migration 0014): each word's tokens all in the step, a "phrase" its tokens in order, `word*` a prefix,
    `or` between groups. Every token is quoted, so nothing in `q` is read as FTS5 syntax (AND, NEAR, ^, :).
    Empty when `q` holds no token at all (matches nothing, as an empty tsquery does on Postgres)."""
    groups = []
    for group in query_groups(q):
        parts = [part for term in group if (part := _fts5_term(term))]
        if parts:
            groups.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(groups)


def _fts5_term(term: Term) -> str:
    tokens = _FTS_TOKEN.findall(term.text)
    if not tokens:
        return ""
    if term.phrase:
        return '"' + " ".join(tokens) + '"'
    # A word the tokenizer splits (src/util.py, parse_time) needs each piece, as Postgres's translated query does.
    quoted = [f'"{token}"' for token in tokens]
    if term.prefix:
        quoted[-1] += "*"
    return " AND ".join(quoted)


def fts5_step_ids(q: str) -> RawSQL:
    """A subquery of the ids of the steps matching `q` on the embedded store's FTS5 index."""
    return RawSQL(f"SELECT rowid FROM {STEP_FTS} WHERE {STEP_FTS} MATCH %s", (fts5_query(q) or '""',))


def search_hits(*, trajectory_ids: list[int], q: str) -> dict[int, Hit]:
    """For each of the runs (a page of results), its first step matching `q` and a snippet. One query."""
    if not trajectory_ids or not q.strip():
        return {}
    if connection.vendor == "postgresql":
        query, params = tsquery_sql(q)
        sql = _FIRST_HITS.format(query=query, document=STEP_SEARCH_DOCUMENT, body=_STEP_TEXT)
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, trajectory_ids, trajectory_ids])
            return {tid: Hit(seq=seq, snippet=snippet) for tid, seq, snippet in cursor.fetchall()}
    return _sqlite_hits(trajectory_ids, q)


def _sqlite_hits(trajectory_ids: list[int], q: str) -> dict[int, Hit]:
    steps = (Step.objects.filter(trajectory_id__in=trajectory_ids, id__in=fts5_step_ids(q))
             .order_by("trajectory_id", "seq").values_list("trajectory_id", "seq", "preview", "payload"))
    # Mark the tokens FTS5 matched (a phrase's words may be spread over other whitespace than in `q`).
    terms = [token for group in query_groups(q) for term in group for token in _FTS_TOKEN.findall(term.text)]
    hits: dict[int, Hit] = {}
    for trajectory_id, seq, preview, payload in steps:
        if trajectory_id not in hits:
            hits[trajectory_id] = Hit(seq=seq, snippet=snippet_around(_plain_text(preview, payload), terms))
    return hits


def _plain_text(preview: str, payload: dict) -> str:
    parts = [preview] + [payload.get(key) for key in ("command", "text", "output", "response_text", "tool_calls")]
    return " · ".join(part if isinstance(part, str) else json.dumps(part) for part in parts if part)


def snippet_around(text: str, terms: list[str], *, width: int = SNIPPET_CHARS) -> str:
    """The text around the first of `terms` found (case-insensitive), every term marked."""
    text = text.replace(MARK_START, "").replace(MARK_END, "")
    lowered = text.lower()
    found = [i for i in (lowered.find(t.lower()) for t in terms if t) if i >= 0]
    start = max(0, min(found) - width) if found else 0
    window = text[start:start + 2 * width + max(len(t) for t in terms if t)] if terms else text[: 2 * width]
    pattern = re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True) if t), re.IGNORECASE)
    marked = pattern.sub(lambda m: f"{MARK_START}{m.group(0)}{MARK_END}", window) if terms else window
    return ("… " if start else "") + marked + (" …" if start + len(window) < len(text) else "")


@dataclass(frozen=True)
class Total:
    count: int
    estimated: bool


def trajectory_total(queryset: QuerySet[Trajectory], *, estimate_above: int = ESTIMATE_ABOVE) -> Total:
    """How many runs `queryset` matches: exact (COUNT) while the trajectory table is small; past
    `estimate_above` rows (pg_class.reltuples, kept by ANALYZE) the planner's row estimate for the query,
    since an exact COUNT over millions of rows would cost more than the page it heads. One query or two."""
    if connection.vendor != "postgresql" or _table_rows() < estimate_above:
        return Total(queryset.count(), estimated=False)
    sql, params = queryset.order_by().values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return Total(int(plan[0]["Plan"]["Plan Rows"]), estimated=True)


def _table_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'experience_trajectory'::regclass")
        row = cursor.fetchone()
    return max(0, int(row[0])) if row else 0
