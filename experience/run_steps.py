"""Selectors for the run page and its API: step views by page or by seq, the run's step index, the context
lens of a model call, and search within a run. Each reads a bounded number of rows whatever the run's
length (the index reads one narrow row per step), and shapes them with `experience.steps_view`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Q

from experience.compare import Action, align, counts, first_divergence, patch_diff, run_actions
from experience.errors import NotFound, ValidationError
from experience.models import Step, Trajectory
from experience.services.stored import stored_step_records
from experience.steps import CONTEXT, context_length
from experience.steps_view import (
    LinkRow,
    attach_links,
    attach_message_tokens,
    call_tokens,
    context_lens,
    diff_view,
    link_tool_calls,
    message_view,
    step_index,
    step_view,
)

PAGE = 50
FIRST_SCREEN = 30  # steps embedded in the run page: a screen and a half, so it is readable before any fetch
MAX_PAGE = 200
LINK_WINDOW = 200  # steps either side of a page searched for the other end of its tool calls
SEARCH_LIMIT = 1000
MAX_QUERY = 200
ACTION_KINDS = ("command", "tool_call", "model_call")  # the steps a run's actions are read from


def run_page_config(*, trajectory: Trajectory) -> dict[str, Any]:
    """What the run page embeds: the first screen of step views and the final diff. The rest of the run is
    fetched as the reader scrolls (`step_views`, `run_step_index`). Nothing here reads the whole run: what
    depends on every step (the timeline, the value curve, jump marks) comes with the index after the page is
    usable, so the page costs the same at 1,000 steps and at 30,000."""
    views, last = step_views(trajectory=trajectory, limit=FIRST_SCREEN)
    return {"id": trajectory.pk, "n_steps": trajectory.n_steps, "first": views, "next_after": last,
            "final_diff": diff_view(trajectory.final_diff) if trajectory.final_diff else None}


def run_labels(*, trajectory: Trajectory, limit: int = 50) -> list[dict[str, Any]]:
    """The run's labels (rubric detectors, curators, value models), each with the seq of the step it marks and
    that step's kind and first preview line (for a rubric label, the action that changed it)."""
    rows = trajectory.labels.order_by("name", "id").values_list(
        "name", "value", "source", "step__seq", "step__kind", "step__preview"
    )[:limit]
    return [
        {"name": name, "value": value, "value_text": label_value_text(value), "source": source, "seq": seq,
         "step_kind": kind, "trigger": (preview or "").strip().split("\n", 1)[0]}
        for name, value, source, seq, kind, preview in rows
    ]


def label_value_text(value: Any) -> str:
    """A label's value as a person reads it: a detector's true / false as such, a curator's step label
    (`{"by", "note"}`) or override (`{"override", "reason"}`) as its words, never a Python dict."""
    if not isinstance(value, dict):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if "override" in value:
        said = f"set to {str(value['override']).lower()}"
        return f"{said}: {value['reason']}" if value.get("reason") else said
    note = value.get("note") or ""
    by = f"by {value['by']}" if value.get("by") else ""
    return " ".join(part for part in (f"“{note}”" if note else "", by) if part) or "labelled"


def step_views(*, trajectory: Trajectory, seqs: Sequence[int] | None = None, after: int = -1,
               limit: int = PAGE, full_output: bool = False) -> tuple[list[dict[str, Any]], int | None]:
    """Views of the steps named by `seqs`, or of up to `limit` steps after seq `after`, in order, each tool
    call linked to its result; and the seq to ask `after` for the next page (None at the end)."""
    queryset = Step.objects.filter(trajectory=trajectory).order_by("seq")
    if seqs is not None:
        rows, last = list(queryset.filter(seq__in=list(seqs)[:MAX_PAGE])), None
    else:
        rows = list(queryset.filter(seq__gt=after)[: limit + 1])
        last = rows[limit - 1].seq if len(rows) > limit else None
        rows = rows[:limit]
    records = stored_step_records(rows, context=False)
    views = [_view(row, record, full_output) for row, record in zip(rows, records, strict=True)]
    if rows:
        attach_links(views, _links(trajectory, rows[0].seq, rows[-1].seq))
    return views, last


def _view(row: Step, record: Any, full_output: bool) -> dict[str, Any]:
    n_context = context_length(row.blob_refs[CONTEXT]) if CONTEXT in row.blob_refs else None
    return step_view(record, seq=row.seq, step_id=row.pk, value_estimate=row.value_estimate, n_context=n_context,
                     full_output=full_output)


def _links(trajectory: Trajectory, first: int, last: int) -> dict[str, dict[str, int]]:
    window = Step.objects.filter(trajectory=trajectory, seq__gte=first - LINK_WINDOW, seq__lte=last + LINK_WINDOW)
    window = window.filter(Q(payload__has_key="tool_call_id") | Q(payload__has_key="tool_calls"))
    rows = window.values_list("seq", "kind", "payload__tool_call_id", "payload__tool_calls")
    return link_tool_calls(LinkRow(seq, kind, str(call_id) if call_id else None, calls if isinstance(calls, list) else None)
                           for seq, kind, call_id, calls in rows)


def step_view_one(*, trajectory: Trajectory, seq: int) -> dict[str, Any]:
    views, _ = step_views(trajectory=trajectory, seqs=[seq], full_output=True)
    if not views:
        raise NotFound(f"trajectory {trajectory.pk} has no step {seq}")
    return views[0]


def run_step_index(*, trajectory: Trajectory) -> dict[str, Any]:
    """The whole run in a few columns (see `steps_view.step_index`): one narrow row per step."""
    if connection.vendor == "postgresql":
        return step_index(_index_rows_postgres(trajectory.pk))
    steps = Step.objects.filter(trajectory=trajectory).order_by("seq")
    rest = ("is_error", "exit_code", "value_estimate", "payload__tool", "payload__success", "payload__value")
    rows = steps.values_list("seq", "kind", "started_at", "ended_at", "duration_ms", *rest)
    return step_index((seq, kind, _epoch_ms(started or ended), _span_ms(started, ended, duration), *more)
                      for seq, kind, started, ended, duration, *more in rows)


# Times as float8 (EXTRACT gives numeric, and 60,000 Decimals were a good part of the cost); the payload is read
# only where the index needs it (a tool call's tool, an evaluation's verdict), so a model call's large payload
# is never de-TOASTed, and its JSON is parsed for the few evaluations only.
_INDEX_SQL = """
SELECT seq, kind,
       (EXTRACT(EPOCH FROM COALESCE(started_at, ended_at)) * 1000)::float8,
       COALESCE(duration_ms, (EXTRACT(EPOCH FROM (ended_at - started_at)) * 1000)::float8),
       is_error, exit_code, value_estimate,
       CASE WHEN kind = 'tool_call' THEN payload ->> 'tool' END,
       CASE WHEN kind = 'eval' THEN (payload -> 'success')::text END,
       CASE WHEN kind = 'eval' THEN (payload -> 'value')::text END
FROM {table} WHERE trajectory_id = %s ORDER BY seq
"""


def _index_rows_postgres(trajectory_id: int) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(_INDEX_SQL.format(table=Step._meta.db_table), [trajectory_id])
        rows = cursor.fetchall()
    return [row if row[1] != "eval" else (*row[:8], _json(row[8]), _json(row[9])) for row in rows]


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _epoch_ms(moment: Any) -> float | None:
    return None if moment is None else moment.timestamp() * 1000


def _span_ms(started: Any, ended: Any, duration: float | None) -> float | None:
    if duration is not None:
        return duration
    return (ended - started).total_seconds() * 1000 if started and ended else None


def run_context_lens(*, trajectory: Trajectory, seq: int, unchanged: bool = False) -> dict[str, Any]:
    """The context of the model call at `seq` against the previous model call of the run; with `unchanged`
    the unchanged messages too (a page fetches them only when the reader opens them)."""
    with_context = Step.objects.filter(trajectory=trajectory, blob_refs__has_key=CONTEXT)
    step = with_context.filter(seq=seq).first()
    if step is None:
        raise NotFound(f"step {seq} of trajectory {trajectory.pk} is not a model call with a stored context")
    previous = with_context.filter(seq__lt=seq).order_by("-seq").first()
    rows = [previous, step] if previous else [step]
    records = stored_step_records(rows, context=True)
    current = records[-1].request_messages or []
    lens = context_lens(records[0].request_messages if previous else None, current)
    attach_message_tokens(lens, current, call_tokens(records[0]) if previous else None, call_tokens(records[-1]))
    lens["seq"], lens["previous_seq"] = seq, previous.seq if previous else None
    if unchanged:
        lens["unchanged_messages"] = [message_view(m, i) for i, m in enumerate(current[: lens["unchanged"]])]
    return lens


def run_search(*, trajectory: Trajectory, q: str) -> list[int]:
    """Seqs of the steps whose preview or inline content holds `q` (case-insensitive), in order."""
    q = q.strip()
    if not q or len(q) > MAX_QUERY:
        raise ValidationError(f"q: give between 1 and {MAX_QUERY} characters", field="q")
    matches = Step.objects.filter(trajectory=trajectory).filter(Q(preview__icontains=q) | Q(payload__icontains=q))
    return list(matches.order_by("seq").values_list("seq", flat=True)[:SEARCH_LIMIT])


def run_compare(*, a: Trajectory, b: Trajectory) -> dict[str, Any]:
    """Two runs aligned over their normalised actions (`experience.compare`): the pairs, their counts, the
    first divergence, each run's outcome and a diff of the two final patches."""
    pairs = align(_actions_of(a), _actions_of(b))
    divergence = first_divergence(pairs)
    return {"a": a, "b": b, "pairs": pairs, "counts": counts(pairs), "divergence": divergence,
            "divergence_pair": pairs[divergence] if divergence is not None else None,
            "patch_diff": patch_diff(a.final_diff, b.final_diff) if a.final_diff != b.final_diff else ""}


def _actions_of(trajectory: Trajectory) -> list[Action]:
    rows = list(Step.objects.filter(trajectory=trajectory, kind__in=ACTION_KINDS).order_by("seq"))
    return run_actions(list(zip((row.seq for row in rows), stored_step_records(rows, context=False), strict=True)))
