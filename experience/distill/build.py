"""One pass from runs to files and a manifest.

`distill` is what the build service calls with runs streamed out of the database: every row is made,
counted and written as it comes, into one JSONL.gz and one Parquet file per split. Order the runs by task
key (pairwise sets and negative balancing need it; the other kinds do not care, but a fixed order also
makes the files byte-identical across rebuilds).

A build may also run as shards side by side (`distill_shard`, each over its own runs, into its own
directory), merged by `merge_shards`: the manifests add up, and each shard's file of a split becomes one
part of that split (`train-00000-of-00002.parquet`; one part when a single pass made them all). The runs
of one task must all go to the same shard (pairs and balancing are made within a task), and splits are by
task, so each shard makes exactly the rows a single pass would make of its runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experience.distill.credit import sft_rows
from experience.distill.errors import EmptyDatasetError
from experience.distill.manifest import ManifestBuilder
from experience.distill.pairwise import pairwise_rows
from experience.distill.rl_rows import rl_rows
from experience.distill.schemas import schema_for_kind
from experience.distill.source import SourceRun
from experience.distill.spec import DatasetSpec
from experience.distill.values import outcome_rows, value_rows
from experience.distill.writers import JsonlGzWriter, ParquetRowWriter, RowEncoder, WriteResult

Row = dict[str, Any]
FORMATS = ("jsonl", "parquet")

_ROW_MAKERS: dict[str, Callable[[Iterable[SourceRun], DatasetSpec], Iterator[Row]]] = {
    "value": value_rows,
    "outcome": outcome_rows,
    "pairwise": pairwise_rows,
    "sft": sft_rows,
    "rl": rl_rows,
}


def rows_for(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """The rows of the spec's kind, streamed."""
    return _ROW_MAKERS[spec.kind](runs, spec)


class _SplitFiles:
    """Writers per (split, format), opened on a split's first row, so empty splits leave no files."""

    def __init__(
        self, out_dir: Path, spec: DatasetSpec, formats: tuple[str, ...], row_group_rows: int
    ) -> None:
        self._out_dir = out_dir
        self._spec = spec
        self._formats = formats
        self._row_group_rows = row_group_rows
        self._writers: dict[str, list[JsonlGzWriter | ParquetRowWriter]] = {}

    def write(self, row: Mapping[str, Any], line: bytes) -> None:
        """A row and its canonical JSON (the JSONL line, without the newline)."""
        split = str(row["split"])
        if split not in self._writers:
            self._writers[split] = [self._open(split, fmt) for fmt in self._formats]
        for writer in self._writers[split]:
            if isinstance(writer, JsonlGzWriter):
                writer.write_line(line)
            else:
                writer.write(row)

    def _open(self, split: str, fmt: str) -> JsonlGzWriter | ParquetRowWriter:
        if fmt == "jsonl":
            return JsonlGzWriter(self._out_dir / f"{split}.jsonl.gz")
        schema = schema_for_kind(self._spec.kind)
        return ParquetRowWriter(
            self._out_dir / f"{split}.parquet", schema=schema, row_group_rows=self._row_group_rows
        )

    def close(self) -> list[WriteResult]:
        return [writer.close() for writers in self._writers.values() for writer in writers]


@dataclass
class Shard:
    """What `distill_shard` made: its manifest so far (not finished: a shard may make no rows) and the
    files it wrote."""

    manifest: ManifestBuilder
    files: list[WriteResult]


def distill(
    runs: Iterable[SourceRun], spec: DatasetSpec, *, out_dir: str | Path, **options: Any
) -> dict[str, Any]:
    """Build a dataset version into `out_dir` in one pass and return its manifest (with a `files` list):
    one shard (`distill_shard`, which `options` go to), merged.

    Raises `EmptyDatasetError` (after removing any file it wrote) when the spec matched no rows.
    """
    return merge_shards([distill_shard(runs, spec, out_dir=out_dir, **options)], out_dir=out_dir)


def distill_shard(
    runs: Iterable[SourceRun],
    spec: DatasetSpec,
    *,
    out_dir: str | Path,
    label_versions: Mapping[str, str] | None = None,
    curation_version: str = "",
    formats: tuple[str, ...] = FORMATS,
    row_group_rows: int = 10_000,
) -> Shard:
    """The rows of these runs, written into `out_dir` (a file per split and format), and their manifest."""
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    builder = ManifestBuilder(spec, label_versions=label_versions, curation_version=curation_version)
    files = _SplitFiles(directory, spec, formats, row_group_rows)
    encoder = RowEncoder()
    try:
        for row in rows_for(builder.track(runs), spec):
            # One encoding per row: the JSONL line is what the manifest's row digest hashes.
            line = encoder.encode(row)
            builder.observe(row, line)
            files.write(row, line)
    finally:
        results = files.close()
    # Hashed here, where a build's shards do it side by side, rather than when they are merged.
    return Shard(
        builder, [dataclasses.replace(result, sha256=_file_sha256(Path(result.path))) for result in results]
    )


def merge_shards(shards: Sequence[Shard], *, out_dir: str | Path) -> dict[str, Any]:
    """The manifest of the shards together, with a `files` list: each shard's file of a split and format
    moved into `out_dir` as one part of it (`part_name`), in shard order.

    Raises `EmptyDatasetError` (after removing every file the shards wrote) when they made no rows.
    """
    directory = Path(out_dir)
    builder = shards[0].manifest
    for shard in shards[1:]:
        builder.merge(shard.manifest)
    try:
        manifest = builder.finish()
    except EmptyDatasetError:
        for shard in shards:
            for result in shard.files:
                Path(result.path).unlink(missing_ok=True)
        raise
    parts: dict[str, list[WriteResult]] = {}
    for shard in shards:
        for result in shard.files:
            parts.setdefault(Path(result.path).name, []).append(result)
    moved = []
    for name, named in parts.items():
        for index, result in enumerate(named):
            target = directory / part_name(name, index, len(named))
            os.replace(result.path, target)
            moved.append(dataclasses.replace(result, path=str(target)))
    manifest["files"] = [_describe(result) for result in sorted(moved, key=lambda r: r.path)]
    return manifest


def part_name(name: str, index: int, count: int) -> str:
    """Part `index` of `count` of a split's file `name` (`train.parquet`): `train-00000-of-00002.parquet`.
    A split's rows come as one part per shard that made any (a build in READERS processes makes up to that
    many), read in part order; the parts of a split's JSONL and of its Parquet hold the same rows."""
    split, _, extension = name.partition(".")
    return f"{split}-{index:05d}-of-{count:05d}.{extension}"


def split_parts(names: Iterable[str], split: str, extension: str) -> list[str]:
    """The names among `names` of a split's parts in one format (`jsonl.gz`, `parquet`), in part order."""
    prefix, suffix = f"{split}-", f".{extension}"
    return sorted(
        name for name in names if name.startswith(prefix) and name.endswith(suffix) and "-of-" in name
    )


def _describe(result: WriteResult) -> dict[str, Any]:
    return {
        "name": Path(result.path).name,
        "rows": result.rows,
        "bytes": result.bytes,
        "sha256": result.sha256,
    }


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
