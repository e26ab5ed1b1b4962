"""Finding trajectories: filters, full-text search over step content, keyset (cursor) pages.

One vocabulary of filters serves the explorer page, the API (whose FilterSet translates query parameters
into a `TrajectoryFilters`), exports and bulk curation (`filters_from_params` reads the same names from any
mapping, e.g. a command line or a JSON body).

Full text: `q` is a websearch-style query (every word in the same step, "quoted phrases", `or`, `prefix*`; a
leading '-' is kept as part of a command flag rather than read as "not"; experience.search_hits.query_groups)
over each step's searchable text. On Postgres it becomes a tsquery (search_hits.tsquery_sql) answered by the GIN index on StepSearch documents (see experience.services.search_index for why they are
filled after ingest, and how search stays complete meanwhile). The 'simple' configuration lowercases but
does not stem, which suits commands, paths and code. What is searchable: a step's preview and its inline
texts (command, thought, output, reply, tool calls), i.e. all of any text up to 2 KB and the first 300
characters of a longer one. On SQLite (the embedded default) the same grammar (search_hits.fts5_query)
over the same content is answered by an FTS5 index that triggers keep in sync with the steps (migration 0014), so it never lags ingest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, time
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from experience.errors import ValidationError
from experience.models import Step, Trajectory
from experience.search_hits import fts5_step_ids, tsquery_sql
from experience.services.search_index import STEP_SEARCH_DOCUMENT
from experience.services.step_labels import runs_with_step_label

OUTCOMES = ("success", "failure", "unknown")
DUPLICATE_CHOICES = ("any", "exclude", "only")
CLUSTER_OUTCOMES = ("mixed", "same")  # as the clusters page's `outcomes` (services.dedup.OUTCOME_FILTERS)
LIST_DEFERRED = ("instruction", "final_diff", "metadata", "notes")  # large columns a list never shows
DEFAULT_PAGE, MAX_PAGE = 50, 500
SIMILAR_LIMIT = 50


@dataclass(frozen=True)
class TrajectoryFilters:
    """Every way to narrow the trajectory list. Empty values mean "no filter"; all given filters must hold."""

    ids: tuple[int, ...] = ()
    task: str = ""  # task_key, exact
    task_set: str = ""
    model: str = ""
    harness: str = ""
    source: str = ""
    source_format: str = ""
    status: tuple[str, ...] = ()  # any of
    outcome: str = ""  # success | failure | unknown (success is true / false / not known)
    curation: tuple[str, ...] = ()  # any of pending, approved, rejected
    duplicate: str = "any"  # any | exclude (only canonical and unique runs) | only (only duplicates)
    created_after: datetime | None = None
    created_before: datetime | None = None
    tags: tuple[str, ...] = ()  # all of
    q: str = ""  # full text over step content
    similar: int | None = None  # runs similar to this trajectory id (see similar_ids)
    step_label: str = ""  # runs with a curator's label of this name on a step (services.step_labels)
    cluster_outcomes: str = ""  # mixed | same: runs in a dedup cluster whose runs' outcomes differ / agree
    job: int | None = None  # runs a rollout job made (the job id the rollout runner writes into their metadata)

    def is_empty(self) -> bool:
        return self == TrajectoryFilters()

    def as_params(self) -> dict[str, str]:
        """The filters as query parameters (the inverse of filters_from_params), empty ones left out."""
        params: dict[str, str] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value in (None, "", ()) or (item.name == "duplicate" and value == "any"):
                continue
            if isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            params[item.name] = str(value)
        return params


def trajectory_search(*, filters: TrajectoryFilters, queryset: QuerySet[Trajectory] | None = None) -> QuerySet[Trajectory]:
    """The trajectories matching every filter, newest first, large columns deferred. Lazy: one query."""
    queryset = Trajectory.objects.all() if queryset is None else queryset
    queryset = queryset.filter(_column_filters(filters))
    if filters.tags:
        queryset = _with_tags(queryset, filters.tags)
    if filters.q.strip():
        queryset = queryset.filter(id__in=_step_matches(filters.q.strip()))
    if filters.similar is not None:
        queryset = queryset.filter(id__in=similar_ids(trajectory_id=filters.similar))
    if filters.step_label:
        queryset = queryset.filter(id__in=runs_with_step_label(filters.step_label))
    return queryset.defer(*LIST_DEFERRED).order_by("-id")


def _column_filters(filters: TrajectoryFilters) -> Q:
    condition = Q()
    exact = {"task_key": filters.task, "task_set": filters.task_set, "model": filters.model,
             "harness": filters.harness, "source": filters.source, "source_format": filters.source_format}
    for name, value in exact.items():
        if value:
            condition &= Q(**{name: value})
    if filters.ids:
        condition &= Q(id__in=filters.ids)
    if filters.status:
        condition &= Q(status__in=filters.status)
    if filters.curation:
        condition &= Q(curation_status__in=filters.curation)
    if filters.outcome:
        condition &= Q(success={"success": True, "failure": False, "unknown": None}[filters.outcome])
    if filters.duplicate != "any":
        condition &= Q(is_duplicate=filters.duplicate == "only")
    if filters.job is not None:  # only rollouts: an imported run's metadata may carry a job id of its own system
        condition &= Q(source="rollout", metadata__job_id=filters.job)
    if filters.cluster_outcomes:  # a run in no cluster matches neither
        condition &= Q(cluster__mixed_outcomes=filters.cluster_outcomes == "mixed")
    if filters.created_after:
        condition &= Q(created_at__gte=filters.created_after)
    if filters.created_before:
        condition &= Q(created_at__lt=filters.created_before)
    return condition


def _with_tags(queryset: QuerySet[Trajectory], tags: Iterable[str]) -> QuerySet[Trajectory]:
    if connection.vendor == "postgresql":
        for tag in tags:  # tags @> '["x"]', answered by the GIN index
            queryset = queryset.filter(tags__contains=[tag])
        return queryset
    # SQLite has no JSON containment: match the tag's JSON text inside the list's JSON text.
    queryset = queryset.annotate(tags_text=Cast("tags", TextField()))
    for tag in tags:
        queryset = queryset.filter(tags_text__contains=json.dumps(tag))
    return queryset


# Indexed runs are answered by the GIN index on StepSearch; runs the indexer has not reached yet (a partial
# index lists them) are matched by computing their steps' documents on the fly, so results never lag ingest.
_STEP_MATCHES = """
SELECT trajectory_id FROM experience_stepsearch WHERE document @@ ({query})
UNION ALL
SELECT s.trajectory_id FROM experience_step s
WHERE s.trajectory_id IN (SELECT id FROM experience_trajectory WHERE NOT search_indexed)
  AND NOT EXISTS (SELECT 1 FROM experience_stepsearch x WHERE x.step_id = s.id)
  AND {document} @@ ({query})
"""


def _step_matches(q: str) -> Any:
    """A subquery of the trajectory ids having a step that matches `q`."""
    if connection.vendor == "postgresql":
        query, params = tsquery_sql(q)
        return RawSQL(_STEP_MATCHES.format(query=query, document=STEP_SEARCH_DOCUMENT), (*params, *params))
    # SQLite: the same grammar (`or`, "phrases", prefix*) on the FTS5 step index, which triggers keep in sync.
    return Step.objects.filter(id__in=fts5_step_ids(q)).values("trajectory_id")


def similar_ids(*, trajectory_id: int, limit: int = SIMILAR_LIMIT) -> list[int]:
    """Ids of the runs most similar to `trajectory_id`, best first (the dedup service's answer)."""
    # Imported here: the dedup service reads runs through this module's selectors.
    from experience.services.dedup import similar_runs

    return [_id_of(item) for item in similar_runs(trajectory_id=trajectory_id, limit=limit)]


def trajectory_similar(*, filters: TrajectoryFilters) -> list[Trajectory]:
    """The runs similar to `filters.similar` that also match the other filters, most similar first: one
    page (the dedup service's top matches), two queries plus the service's own work."""
    if filters.similar is None:
        raise ValidationError("similar: required", field="similar")
    ranked = similar_ids(trajectory_id=filters.similar)
    rows = {t.pk: t for t in trajectory_search(filters=replace(filters, similar=None)).filter(id__in=ranked)}
    return [rows[pk] for pk in ranked if pk in rows]


def _id_of(item: Any) -> int:
    if isinstance(item, int):
        return item
    if isinstance(item, tuple | list):
        return _id_of(item[0])
    for name in ("trajectory_id", "pk", "id"):
        if hasattr(item, name):
            return int(getattr(item, name))
    raise TypeError(f"similar_runs returned {item!r}, not a run")
# --- end of the "similar runs" hook -------------------------------------------------------------------------


@dataclass
class Page:
    """One keyset page: rows newest first, and the cursor of the next page (None on the last one)."""

    rows: list[Trajectory] = field(default_factory=list)
    next_cursor: int | None = None


def page_after(queryset: QuerySet[Trajectory], *, after: int | None = None, limit: int = DEFAULT_PAGE) -> Page:
    """The page of `queryset` (ordered by -id) after cursor `after`: one query whatever the table's size."""
    limit = max(1, min(limit, MAX_PAGE))
    if after is not None:
        queryset = queryset.filter(id__lt=after)
    rows = list(queryset.order_by("-id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows=rows, next_cursor=rows[-1].pk if more else None)


# --- reading filters from a mapping (query string, command line, JSON body) -------------------------------------

_TEXT = ("task", "task_set", "model", "harness", "source", "source_format", "q", "step_label")


def filters_from_params(params: Mapping[str, Any]) -> TrajectoryFilters:
    """Parse filters named as in TrajectoryFilters. Lists come as comma-separated text or JSON lists.

    Raises ValidationError naming the parameter for a bad value or an unknown name.
    """
    known = {f.name for f in fields(TrajectoryFilters)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValidationError(f"{unknown[0]}: not a filter; known: {', '.join(sorted(known))}", field=unknown[0])
    values: dict[str, Any] = {name: _text(params, name) for name in _TEXT if name in params}
    if "ids" in params:
        values["ids"] = tuple(_integer(v, "ids") for v in _items(params["ids"]))
    values.update(_choices(params, "status", Trajectory.Status.values))
    values.update(_choices(params, "curation", Trajectory.Curation.values))
    if "tags" in params:
        values["tags"] = tuple(_items(params["tags"]))
    if params.get("outcome"):
        values["outcome"] = _choice(_text(params, "outcome"), OUTCOMES, "outcome")
    if params.get("duplicate"):
        values["duplicate"] = _choice(_text(params, "duplicate"), DUPLICATE_CHOICES, "duplicate")
    if params.get("cluster_outcomes"):
        values["cluster_outcomes"] = _choice(_text(params, "cluster_outcomes"), CLUSTER_OUTCOMES, "cluster_outcomes")
    for name in ("created_after", "created_before"):
        if params.get(name):
            values[name] = parse_moment(_text(params, name), name)
    if params.get("similar") not in (None, ""):
        values["similar"] = _integer(params["similar"], "similar")
    if params.get("job") not in (None, ""):
        values["job"] = _integer(params["job"], "job")
    return TrajectoryFilters(**values)


def parse_moment(text: str, name: str) -> datetime:
    """An ISO date (midnight, in the server's time zone) or date-time; naive times are the server's."""
    moment = parse_datetime(text)
    if moment is None:
        day = parse_date(text)
        if day is None:
            raise ValidationError(f"{name}: {text!r} is not an ISO date or date-time", field=name)
        moment = datetime.combine(day, time.min)
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def _text(params: Mapping[str, Any], name: str) -> str:
    value = params[name]
    if isinstance(value, list | tuple):
        value = value[0] if value else ""
    if not isinstance(value, str | int):
        raise ValidationError(f"{name}: must be text", field=name)
    return str(value).strip()


def _items(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        raw = [str(v) for v in value]
    else:
        raw = str(value).split(",")
    return [item.strip() for item in raw if item.strip()]


def _choices(params: Mapping[str, Any], name: str, allowed: Iterable[str]) -> dict[str, tuple[str, ...]]:
    if name not in params:
        return {}
    return {name: tuple(_choice(item, tuple(allowed), name) for item in _items(params[name]))}


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise ValidationError(f"{name}: {value!r} is not one of {', '.join(allowed)}", field=name)
    return value


def _integer(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{name}: {value!r} is not an integer", field=name) from None
