"""A dataset version's manifest, built while the rows stream past.

The builder keeps counters, not rows: per split (rows, positives, tasks, trajectories), per task row
counts, the source runs' (id, content hash) pairs and an order-free digest of the rows. Memory grows
with the number of tasks and source runs, never with the number of rows.

Content hash: sha256 over the spec's canonical JSON, then the sorted (trajectory id, content hash) pairs
of the runs that gave rows, then the rows' digest. The rows' digest is the sum mod 2**256 of each row's
128-bit XXH3 (over its canonical JSON: `row_digest`) plus the row count: a multiset hash, so it does not
depend on the order rows were made in (nor on how a build was sharded), yet changes with any row's
content. The same spec rebuilt on the same data gives the same hash; any change to the spec, the runs used
or a row changes it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from experience.distill.credit import CREDIT_VERSION
from experience.distill.errors import EmptyDatasetError
from experience.distill.rubric import RUBRIC_VERSION
from experience.distill.selection import exclusion_reason, kept_despite_duplicate_mark
from experience.distill.source import SourceRun
from experience.distill.spec import SPLITS, DatasetSpec
from experience.distill.writers import encode_row

Row = Mapping[str, Any]
_MODULUS = 2**256


@dataclass
class _SplitCounts:
    rows: int = 0
    positives: int = 0
    labelled: int = 0  # rows with an outcome (pairwise rows have none)
    tasks: set[str] = field(default_factory=set)
    trajectories: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "positives": self.positives,
            "positive_rate": self.positives / self.labelled if self.labelled else None,
            "tasks": len(self.tasks),
            "trajectories": len(self.trajectories),
        }


def row_trajectory_ids(row: Row) -> list[str]:
    """The source runs a row was made from (two for a pairwise row)."""
    if "chosen_trajectory_id" in row:
        return [str(row["chosen_trajectory_id"]), str(row["rejected_trajectory_id"])]
    return [str(row["trajectory_id"])]


def row_digest(row: Row, encoded: bytes | None = None) -> int:
    """The 128-bit XXH3 of the row's canonical JSON (`encoded`, when the caller has it already), as an
    integer. Not a cryptographic hash: the content hash names what a version holds (the same spec on the
    same data gives the same hash, any change another), it does not guard the files against tampering
    (the manifest's sha256 per file does). A value set's rows repeat their run's growing context, ~600 MB
    of JSON per 100,000 steps: XXH3 reads it ten times faster than sha256."""
    return xxhash.xxh3_128_intdigest(encode_row(row) if encoded is None else encoded)


class ManifestBuilder:
    """Collects a manifest from the runs offered (`track`) and the rows made (`observe`).

    The build wraps the runs in `track`, calls `observe(row, encoded)` with each row and the bytes it
    wrote for it, then `finish()` after the rows are consumed. `wrap(rows)` observes a row stream itself.
    """

    def __init__(
        self,
        spec: DatasetSpec,
        *,
        label_versions: Mapping[str, str] | None = None,
        curation_version: str = "",
    ) -> None:
        self.spec = spec
        self.label_versions = {"rubric": RUBRIC_VERSION, "credit": CREDIT_VERSION, **(label_versions or {})}
        self.curation_version = curation_version
        self.runs_offered = 0
        self.runs_excluded: Counter[str] = Counter()
        self.duplicates_kept = 0  # marked duplicates of a run whose outcome differs: kept
        self._source_hashes: dict[str, str] = {}
        self._used: set[str] = set()
        self._splits = {name: _SplitCounts() for name in SPLITS}
        self._task_rows: Counter[str] = Counter()
        self._rows = 0
        self._digest = 0

    def merge(self, other: ManifestBuilder) -> None:
        """Take in what another builder of the same spec collected from other runs (a shard of a build:
        every figure is a count, a set or a sum, so the merged manifest is the one a single pass over all
        the runs would give)."""
        if other.spec != self.spec:
            raise ValueError("only builders of the same spec merge")
        self.runs_offered += other.runs_offered
        self.runs_excluded.update(other.runs_excluded)
        self.duplicates_kept += other.duplicates_kept
        self._source_hashes.update(other._source_hashes)
        self._used |= other._used
        for name, counts in other._splits.items():
            mine = self._splits[name]
            mine.rows += counts.rows
            mine.positives += counts.positives
            mine.labelled += counts.labelled
            mine.tasks |= counts.tasks
            mine.trajectories |= counts.trajectories
        self._task_rows.update(other._task_rows)
        self._rows += other._rows
        self._digest += other._digest

    def track(self, runs: Iterable[SourceRun]) -> Iterator[SourceRun]:
        """Pass runs through, noting each usable run's content hash and each left-out run's reason."""
        for run in runs:
            self.runs_offered += 1
            reason = exclusion_reason(run, self.spec)
            if reason is None:
                self._source_hashes[run.trajectory_id] = run.resolved_hash()
            else:
                self.runs_excluded[reason] += 1
            self.duplicates_kept += kept_despite_duplicate_mark(run, self.spec)
            yield run

    def observe(self, row: Row, encoded: bytes | None = None) -> None:
        """Count a row; `encoded`: its canonical JSON (`writers.RowEncoder`), if already made."""
        ids = row_trajectory_ids(row)
        self._used.update(ids)
        counts = self._splits[str(row["split"])]
        counts.rows += 1
        task_key = str(row["task_key"])
        counts.tasks.add(task_key)
        counts.trajectories.update(ids)
        outcome = row.get("outcome")
        if outcome is True or outcome is False:
            counts.labelled += 1
            counts.positives += outcome
        self._task_rows[task_key] += 1
        self._rows += 1
        # Summed as is, reduced mod 2**256 when read: the sum of a row count's 128-bit digests stays small.
        self._digest += row_digest(row, encoded)

    def wrap(self, rows: Iterable[Row]) -> Iterator[Row]:
        for row in rows:
            self.observe(row)
            yield row

    def content_hash(self) -> str:
        digest = hashlib.sha256(self.spec.to_json().encode("utf-8"))
        digest.update(b"\n")
        for trajectory_id, content_hash in self._sources():
            digest.update(f"{trajectory_id}\t{content_hash}\n".encode())
        digest.update((self._digest % _MODULUS).to_bytes(32, "big"))
        digest.update(str(self._rows).encode())
        return digest.hexdigest()

    def finish(self) -> dict[str, Any]:
        """The manifest. Raises `EmptyDatasetError` when no row was made."""
        if self._rows == 0:
            excluded = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.runs_excluded.items()))
            raise EmptyDatasetError(
                f"the spec matched no rows ({self.runs_offered} runs offered; excluded: {excluded or 'none'})"
            )
        sources = self._sources()
        return {
            "kind": self.spec.kind,
            "spec": self.spec.to_dict(),
            "content_hash": self.content_hash(),
            "rows": self._rows,
            "splits": {name: counts.as_dict() for name, counts in self._splits.items()},
            "task_rows": dict(sorted(self._task_rows.items())),
            "largest_task_share": max(self._task_rows.values()) / self._rows,
            "source_trajectory_ids": [trajectory_id for trajectory_id, _ in sources],
            "runs_offered": self.runs_offered,
            "runs_excluded": dict(sorted(self.runs_excluded.items())),
            # Dedup never hides a success behind a failure: only duplicates of a run with the same outcome
            # are left out; a run marked a duplicate of a run whose outcome differs is kept.
            "duplicates": {
                "left_out_same_outcome": self.runs_excluded["duplicate"],
                "kept_outcome_differs": self.duplicates_kept,
            },
            "label_versions": dict(sorted(self.label_versions.items())),
            "curation_version": self.curation_version,
        }

    def _sources(self) -> list[tuple[str, str]]:
        missing = self._used - set(self._source_hashes)
        if missing:
            raise RuntimeError(f"rows came from runs that were not tracked: {', '.join(sorted(missing)[:5])}")
        return sorted((trajectory_id, self._source_hashes[trajectory_id]) for trajectory_id in self._used)
