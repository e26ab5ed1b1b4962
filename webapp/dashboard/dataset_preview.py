"""What the dataset pages show of a version beyond its stats: the first rows of each split, the runs one
version added and removed against another, and the manifest as a page. Reads only (the files a build wrote,
the manifests); no row is ever held whole past PREVIEW_ROWS."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

from django.http import Http404

from experience.distill.spec import SPLITS
from experience.errors import NotFound, TroveError
from experience.models import DatasetVersion, Trajectory
from experience.services import datasets
from webapp.access.permissions import scope_required

PREVIEW_ROWS = 5
PREVIEW_VALUE_CHARS = 240  # a long value (a prompt, a context) is cut in the preview; the files hold it whole
RUNS_LISTED = 200


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > PREVIEW_VALUE_CHARS:
        return value[:PREVIEW_VALUE_CHARS] + f"… ({len(value)} chars)"
    if isinstance(value, list) and len(json.dumps(value)) > PREVIEW_VALUE_CHARS:
        return f"[{len(value)} items]"
    if isinstance(value, dict) and len(json.dumps(value)) > PREVIEW_VALUE_CHARS:
        return {key: _short(item) for key, item in value.items()}
    return value


def split_previews(version: DatasetVersion, *, rows: int = PREVIEW_ROWS) -> list[dict]:
    """The first `rows` rows of each split of a ready version: the columns, and each row's values shortened.
    A split whose files are missing says so instead of failing the page."""
    if version.status != DatasetVersion.Status.READY:
        return []
    previews: list[dict[str, Any]] = []
    for split in SPLITS:
        try:
            first = list(islice(datasets.version_rows(version=version, split=split), rows))
        except (NotFound, OSError) as error:
            previews.append({"split": split, "columns": [], "rows": [], "error": str(error)})
            continue
        columns = list(dict.fromkeys(key for row in first for key in row))
        previews.append({"split": split, "columns": columns, "error": "",
                         "rows": [[_cell(row.get(column)) for column in columns] for row in first]})
    return previews


def _cell(value: Any) -> str:
    short = _short(value)
    return short if isinstance(short, str) else json.dumps(short, ensure_ascii=False)


def run_changes(a: DatasetVersion, b: DatasetVersion, *, limit: int = RUNS_LISTED) -> dict[str, Any]:
    """The source runs b added to and removed from a, listed with their task and outcome (the first `limit`
    of each, lowest id first), and how many there are in all. One query."""
    runs_a, runs_b = _source_ids(a), _source_ids(b)
    added, removed = sorted(runs_b - runs_a), sorted(runs_a - runs_b)
    shown = added[:limit] + removed[:limit]
    rows = {t.pk: t for t in Trajectory.objects.filter(pk__in=shown).only("id", "task_key", "success", "curation_status")}
    return {"added": [rows.get(pk, pk) for pk in added[:limit]], "removed": [rows.get(pk, pk) for pk in removed[:limit]],
            "n_added": len(added), "n_removed": len(removed), "limit": limit}


def _source_ids(version: DatasetVersion) -> set[int]:
    # The manifest keeps ids as text (they are written as row fields); the pages link them as numbers.
    return {int(pk) for pk in (version.manifest or {}).get("source_trajectory_ids", []) if str(pk).isdigit()}


@scope_required("datasets")
def dataset_manifest(request, name: str, version: int):
    from django.shortcuts import render

    try:
        found = datasets.dataset_version_get(dataset=datasets.dataset_get(ref=name), version=version)
    except TroveError as error:
        raise Http404(error.message) from None
    manifest = found.manifest or {}
    return render(request, "dashboard/dataset_manifest.html", {
        "version": found, "dataset": found.dataset, "manifest_text": json.dumps(manifest, indent=2, sort_keys=True),
        "sections": [(key, json.dumps(value, indent=2, sort_keys=True)) for key, value in sorted(manifest.items())],
    })
