"""Where a run came from, and who may say so.

A run's `source` is its provenance: `rollout` (Trove ran it: the rollout runner opened it and its reward
came from Trove's own evaluation), `import` (read from a file) or `api` (posted by a client). Datasets and
people trust a `rollout` run's outcome more than a claimed one, so no client may claim it: the API and the
importers cannot store a run whose source is `rollout`, however it is spelled ("Rollout", " rollout ",
"roll-out", full-width letters, a zero-width space inside).

The trusted path proves itself by the call it makes, not by anything in the request: the ingest services
take `rollout_runner=True`, a keyword argument that only Trove's own rollout runner passes (and tests
standing in for it). No view, serializer or importer passes it, and no request field reaches it. Nor may a
client add steps to a rollout (`check_client_may_append`): its steps come from its runner and the
recording proxy, and a planted step (an evaluation that "passed") would change what the run says it did.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from experience.errors import Conflict, NotFound, ValidationError
from experience.models import Trajectory
from experience.records import TrajectoryRecord

ROLLOUT = "rollout"
IMPORT = "import"
API = "api"
RESERVED_SOURCES = (ROLLOUT,)
# Where an import keeps the source a file claimed, when it was not "import" (a Trove export of rollouts).
CLAIMED_SOURCE_KEY = "claimed_source"


def spelled_source(source: object) -> str | None:
    """The reserved source that `source` spells once case, width, spacing and punctuation are ignored,
    or None. ("ROLLOUT", "roll_out", "ｒｏｌｌｏｕｔ" and "roll\u200bout" all spell `rollout`.)"""
    if not isinstance(source, str):
        return None
    folded = unicodedata.normalize("NFKC", source).casefold()
    letters = "".join(ch for ch in folded if ch.isalnum())
    return next((reserved for reserved in RESERVED_SOURCES if letters == reserved), None)


def check_source(source: object, *, field: str, rollout_runner: bool) -> None:
    """Refuse a reserved source from any caller but the rollout runner; the runner may claim only the
    exact spelling. Raises ValidationError naming `field`."""
    reserved = spelled_source(source)
    if reserved is None:
        return
    if not rollout_runner:
        raise ValidationError(
            f"{field}: {source!r} is reserved for runs Trove's rollout runner made; a client or a file cannot "
            f"claim it (leave it out, or give another source such as {API!r})",
            field=field,
        )
    if source != reserved:
        raise ValidationError(f"{field}: write the source as {reserved!r}, not {source!r}", field=field)


def as_import(record: TrajectoryRecord) -> TrajectoryRecord:
    """The record as an import: source `import`, whatever the file said (a Trove export keeps its runs'
    original source, `rollout` included). A different claim is kept in metadata[CLAIMED_SOURCE_KEY]."""
    if record.source == IMPORT:
        return record
    metadata = dict(record.metadata) if isinstance(record.metadata, dict) else record.metadata
    if isinstance(metadata, dict):
        metadata[CLAIMED_SOURCE_KEY] = record.source
    return dataclasses.replace(record, source=IMPORT, metadata=metadata)


def check_client_may_append(*, trajectory_id: int) -> None:
    """Refuse a client's steps for a rollout run (Conflict, 409); NotFound when there is no such run."""
    source = Trajectory.objects.filter(pk=trajectory_id).values_list("source", flat=True).first()
    if source is None:
        raise NotFound(f"trajectory {trajectory_id} does not exist")
    if source == ROLLOUT:
        raise Conflict(
            f"trajectory: {trajectory_id} is a rollout; its steps come from Trove's runner and proxy only",
            field="trajectory",
        )
