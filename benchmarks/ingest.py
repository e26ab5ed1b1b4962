"""Bulk ingest throughput and blob savings, on Postgres.

    DATABASE_URL=postgres://... .venv/bin/python benchmarks/ingest.py [--runs 300] [--calls 50] [--rounds 3]

Workload: synthetic SWE-style runs, each a system prompt and a task, then `--calls` model calls whose
request context grows by two messages a call (the reply and the command output before it), each followed
by a command step (a 0.2-2 KB output, sometimes a 3-6 KB one, which goes to a blob). About 100 steps a run.
Every run has its own task and outputs; only the system prompt is shared (one per set of runs).

Phases, on a scratch database created for the run and dropped after (tables emptied between phases):

- bulk: `trajectories_ingest_many` in batches of 20 runs: validation, preparation (blob hashing,
  compression, previews, the exact-dedup hash), blobs, trajectories and steps (COPY), one transaction each.
- copy: the floor. The same kind of rows (trajectories, blobs, steps) for a second set of runs of the same
  shape, prepared and compressed beforehand (contexts as deltas, as the bulk path stores them), written
  with raw COPY in the same batches and formats (binary for steps and blobs), one transaction each; only
  the database work is timed.
- orm: the naive way, per-row `.save()` (autocommit) of the same prepared rows, on the first runs only.
- digests: the bulk runs stored again, alone, then the digest pass the beat runs after every ingest
  (`digests_derive_pending`, called until nothing is pending: each run read back, its digest derived and
  kept, its rubric labels written), timed. It is part of what storing a run costs before a value build can
  use it, so bulk_with_digests_steps_per_s is the steps over the bulk time plus this pass.

bulk and copy take turns batch by batch (a noisy neighbour on a shared machine hits both alike), for
`--rounds` rounds from empty tables; each figure is the median round, bulk_vs_copy the median of the
rounds' ratios. Then one `--calls`-call run is stored both ways to compare bytes on disk
(row sizes as Postgres stores them, its own TOAST compression included): with blobs (steps referencing
message and output blobs, each distinct content once) and without (every step holding its whole content
inline, the request context as JSON, as a store without blobs would).

Targets: bulk_steps_per_s >= 20,000 and >= copy_steps_per_s / 2, bulk_with_digests_steps_per_s >=
copy_steps_per_s / 2 as well; bytes_per_step_without_blobs >= 5 x bytes_per_step_with_blobs. The last line
is one JSON object.

    quick: DATABASE_URL=postgres://... .venv/bin/python benchmarks/ingest.py --runs 60 --rounds 1 --orm-runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

BATCH = 20
SYSTEM_PROMPT = "You are a careful software engineer working in a sandboxed repository. " * 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--orm-runs", type=int, default=10)
    args = parser.parse_args()
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("benchmarks/ingest.py measures Postgres: set DATABASE_URL=postgres://...")
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_ingest")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        figures = measure(args)
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
    print(json.dumps(figures))


def measure(args: argparse.Namespace) -> dict:
    rng = random.Random(7)
    # Two sets of runs of the same shape: bulk writes one, raw COPY the other, batch by batch in turns, so
    # both see the same table sizes and the same noisy neighbours; their content differs so neither finds
    # the other's blobs already stored.
    bulk_runs = [make_run(rng, index, args.calls) for index in range(args.runs)]
    copy_runs = [make_run(rng, args.runs + index, args.calls, system=SYSTEM_PROMPT + " (B)")
                 for index in range(args.runs)]
    steps = sum(len(r.steps) for r in bulk_runs)
    bulk, copy = [], []
    for _ in range(args.rounds):
        bulk_s, copy_s = time_in_turns(bulk_runs, copy_runs)
        bulk.append(steps / bulk_s)
        copy.append(sum(len(r.steps) for r in copy_runs) / copy_s)
    digest_s = time_digest_pass(bulk_runs)
    bulk_s = steps / statistics.median(bulk)
    empty_tables()
    orm_runs = bulk_runs[: args.orm_runs]
    orm = sum(len(r.steps) for r in orm_runs) / time_orm(orm_runs)
    with_blobs, without_blobs = bytes_per_step(make_run(random.Random(11), 10_000, args.calls))
    from django.db import connection

    return {
        "runs": args.runs,
        "steps": steps,
        "calls_per_run": args.calls,
        "rounds": args.rounds,
        "bulk_steps_per_s": round(statistics.median(bulk)),
        "copy_steps_per_s": round(statistics.median(copy)),
        "bulk_with_digests_steps_per_s": round(steps / (bulk_s + digest_s)),
        "digest_steps_per_s": round(steps / digest_s),
        "orm_steps_per_s": round(orm),
        "bulk_vs_copy": round(statistics.median(b / c for b, c in zip(bulk, copy, strict=True)), 3),
        "bulk_rounds": [round(x) for x in bulk],
        "copy_rounds": [round(x) for x in copy],
        "bytes_per_step_with_blobs": round(with_blobs),
        "bytes_per_step_without_blobs": round(without_blobs),
        "blob_saving": round(without_blobs / with_blobs, 2),
        "postgres": connection.pg_version,
        "load_avg": os.getloadavg()[0],
    }


def time_in_turns(bulk_runs: list, copy_runs: list) -> tuple[float, float]:
    """(bulk seconds, copy seconds) for all runs, the two ways taking turns batch by batch (alternating
    which goes first). Preparing the COPY rows is not timed."""
    empty_tables()
    ids = allocate_trajectory_ids(len(copy_runs))
    prepared, written, offset = [], set(), 0
    for batch in batches(copy_runs):
        trajectories, blobs, steps = prepared_rows(batch, ids[offset : offset + len(batch)], written)
        prepared.append((_with_defaults(trajectories), blobs, steps))
        offset += len(batch)
    bulk_s = copy_s = 0.0
    for turn, (bulk_batch, rows) in enumerate(zip(batches(bulk_runs), prepared, strict=True)):
        if turn % 2:
            copy_s += time_copy(rows)
            bulk_s += time_bulk(bulk_batch)
        else:
            bulk_s += time_bulk(bulk_batch)
            copy_s += time_copy(rows)
    return bulk_s, copy_s


def allocate_trajectory_ids(n: int) -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('experience_trajectory', 'id'))"
                       " FROM generate_series(1, %s)", [n])
        return [row[0] for row in cursor.fetchall()]


# ---------------------------------------------------------------- the workload


def make_run(rng: random.Random, index: int, calls: int, *, system: str = SYSTEM_PROMPT):
    from experience.records import MessageRecord, StepRecord, TrajectoryRecord

    start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(hours=index)
    task = f"bench__repo-{index}"
    instruction = f"Fix issue {index}: " + words(rng, 60)
    context = [MessageRecord("system", system), MessageRecord("user", instruction)]
    steps = [
        StepRecord(kind="message", text=system, payload={"role": "system"}),
        StepRecord(kind="message", text=instruction, payload={"role": "user"}),
    ]
    moment = start
    for call in range(calls):
        command = rng.choice(["ls -la", "cat src/mod.py", "python -m pytest tests -x -q", "grep -rn foo src",
                              "sed -n 1,80p src/util.py", "git diff"]) + f" # {index}.{call}"
        reply = f"Thought {call}: " + words(rng, 40) + f"\n```bash\n{command}\n```"
        output = words(rng, rng.randint(30, 300)) if rng.random() > 0.1 else words(rng, rng.randint(600, 1000))
        steps.append(StepRecord(kind="model_call", started_at=moment, ended_at=moment + timedelta(seconds=2),
                                request_messages=list(context), response_text=reply, model="bench-model",
                                tokens_in=300 + 40 * call, tokens_out=60, latency_ms=2000.0,
                                call_id=f"call-{index}-{call}"))
        moment += timedelta(seconds=2)
        steps.append(StepRecord(kind="command", started_at=moment, ended_at=moment + timedelta(milliseconds=300),
                                command=command, output=output, exit_code=rng.choice([0, 0, 0, 1])))
        moment += timedelta(seconds=1)
        context = context + [MessageRecord("assistant", reply), MessageRecord("user", output)]
    return TrajectoryRecord(source="bench", source_format="bench", source_ref=f"bench-{index}", task_key=task,
                            instruction=instruction, harness="bench", model="bench-model", status="completed",
                            reward=float(index % 2), success=bool(index % 2), started_at=start, finished_at=moment,
                            steps=steps)


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n))


def batches(items: list, size: int = BATCH):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def empty_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE experience_step, experience_trajectory, experience_blob CASCADE")


# ---------------------------------------------------------------- the three ways


def time_bulk(batch: list) -> float:
    from experience.services.ingest import trajectories_ingest_many

    started = time.perf_counter()
    trajectories_ingest_many(records=batch)
    return time.perf_counter() - started


def time_digest_pass(runs: list) -> float:
    """Seconds the digest pass takes over `runs`, stored (untimed) on tables holding only them."""
    from experience.models import TrajectoryDigest
    from experience.services.datasets import digests_derive_pending
    from experience.services.ingest import trajectories_ingest_many

    empty_tables()
    for batch in batches(runs):
        trajectories_ingest_many(records=batch)
    started = time.perf_counter()
    while digests_derive_pending():
        pass
    seconds = time.perf_counter() - started
    kept = TrajectoryDigest.objects.filter(error="").count()
    if kept != len(runs):
        raise SystemExit(f"the digest pass kept {kept} digests for {len(runs)} runs")
    return seconds


def prepared_rows(runs: list, ids: list[int], written: set[str]) -> tuple[list, list, list]:
    """The rows the bulk path writes for `runs`, as COPY tuples: trajectories, blobs (those not `written`
    by an earlier batch), steps."""
    from django.utils import timezone

    from experience.dedup.signature import exact_hash
    from experience.services.blobs import _encode
    from experience.services.bulk import next_ids
    from experience.services.ingest import _step_copy_rows, _totals
    from experience.steps import BlobSink

    sink = BlobSink()
    now = timezone.now()
    trajectories = []
    for pk, run in zip(ids, runs, strict=True):
        totals = _totals(run.steps, run.metadata)
        trajectories.append((pk, run.source, run.source_format, run.source_ref, run.task_key, run.instruction,
                             run.harness, run.model, run.status, run.reward, run.success, totals["n_steps"],
                             totals["n_model_calls"], totals["tokens_in"], totals["tokens_out"],
                             len(run.steps), exact_hash(run), now, now))
    step_ids = next_ids("experience_step", "id", sum(len(run.steps) for run in runs))
    steps = list(_step_copy_rows([(pk, run.steps) for pk, run in zip(ids, runs, strict=True)], sink, iter(step_ids)))
    blobs = [(d, len(c), *_encode(c), now) for d, c in sorted(sink.contents.items()) if d not in written]
    written.update(sink.contents)
    return trajectories, blobs, steps


TRAJECTORY_COPY_COLUMNS = (
    "id", "source", "source_format", "source_ref", "task_key", "instruction", "harness", "model", "status",
    "reward", "success", "n_steps", "n_model_calls", "tokens_in", "tokens_out", "next_seq", "content_hash",
    "created_at", "updated_at",
)
EMPTY_DEFAULTS = ("uid", "source_version", "task_set", "template", "image_digest", "metadata", "original_blob",
                  "final_diff", "is_duplicate", "curation_status", "tags", "notes", "search_indexed")


def time_copy(rows: tuple[list, list, list]) -> float:
    """Raw COPY of one batch's prepared rows (trajectories, blobs, steps) in one transaction."""
    from django.db import transaction

    from experience.services import blobs as blob_table
    from experience.services.bulk import copy_rows
    from experience.services.ingest import _STEP_COLUMNS, _STEP_TYPES

    trajectories, blobs, steps = rows
    started = time.perf_counter()
    with transaction.atomic():  # each table in the format the bulk path writes it
        copy_rows("experience_trajectory", TRAJECTORY_COPY_COLUMNS + EMPTY_DEFAULTS, trajectories)
        copy_rows("experience_blob", blob_table.COLUMNS, blobs, types=blob_table.COLUMN_TYPES)
        copy_rows("experience_step", _STEP_COLUMNS, steps, types=_STEP_TYPES)
    return time.perf_counter() - started


def _with_defaults(rows: list) -> list:
    import uuid

    return [(*row, str(uuid.uuid4()), "", "", "", "", "{}", "", "", False, "pending", "[]", "", False) for row in rows]


def time_orm(runs: list) -> float:
    """Per-row saves of the same rows, each in its own transaction (autocommit), as naive code would."""
    from experience.models import Blob, Trajectory
    from experience.services.blobs import _encode
    from experience.services.ingest import _step_row, _trajectory_fields
    from experience.steps import BlobSink, prepare_step

    sink = BlobSink()
    work = [(run, [prepare_step(step, sink) for step in run.steps]) for run in runs]
    started = time.perf_counter()
    for digest, content in sink.contents.items():
        encoding, data = _encode(content)
        Blob(sha256=digest, size=len(content), encoding=encoding, data=data).save()
    for run, steps in work:
        trajectory = Trajectory(source=run.source, source_ref=run.source_ref, **_trajectory_fields(run))
        trajectory.save()
        for seq, item in enumerate(steps):
            _step_row(trajectory.pk, seq, item).save()
    return time.perf_counter() - started


# ---------------------------------------------------------------- bytes on disk


# Row bytes outside the variable-length columns: the tuple header (24) and the fixed-width columns.
STEP_FIXED_BYTES = 24 + 8 + 8 + 4 + 8 + 8 + 8 + 4 + 4 + 4 + 1
BLOB_FIXED_BYTES = 24 + 8 + 8
STEP_VARIABLE = ("pg_column_size(kind) + coalesce(pg_column_size(call_id), 0) + pg_column_size(preview)"
                 " + pg_column_size(payload) + pg_column_size(blob_refs)")


def bytes_per_step(run) -> tuple[float, float]:
    """(with blobs, without) for one run: the bytes its rows take as Postgres stores them (pg_column_size of
    each column, so Postgres' own TOAST compression of large values counts for both), plus a fixed per-row
    size for the header and fixed-width columns."""
    from django.db import connection

    from experience.exporters.trove_jsonl import step_to_dict
    from experience.models import Step
    from experience.services.ingest import trajectories_ingest_many
    from experience.steps import referenced_hashes

    empty_tables()
    trajectory_id = trajectories_ingest_many(records=[run])[0].trajectory_id
    refs = {h for r in Step.objects.filter(trajectory_id=trajectory_id).values_list("blob_refs", flat=True)
            for h in referenced_hashes(r)}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT sum({STEP_VARIABLE} + %s) FROM experience_step WHERE trajectory_id = %s",
                       [STEP_FIXED_BYTES, trajectory_id])
        step_bytes = cursor.fetchone()[0]
        cursor.execute("SELECT sum(pg_column_size(sha256) + pg_column_size(encoding) + pg_column_size(data) + %s)"
                       " FROM experience_blob WHERE sha256 = ANY(%s)", [BLOB_FIXED_BYTES, list(refs)])
        blob_bytes = cursor.fetchone()[0]
        cursor.execute("CREATE TEMP TABLE naive_step (LIKE experience_step INCLUDING DEFAULTS)")
        for seq, step in enumerate(run.steps):  # every step's whole content inline, context included
            cursor.execute(
                "INSERT INTO naive_step (id, trajectory_id, seq, kind, is_error, call_id, preview, payload, blob_refs)"
                " VALUES (%s, %s, %s, %s, %s, %s, '', %s::jsonb, '{}')",
                [seq, trajectory_id, seq, step.kind, step.is_error, step.call_id,
                 json.dumps(step_to_dict(step), ensure_ascii=False, default=str)],
            )
        cursor.execute(f"SELECT sum({STEP_VARIABLE} + %s) FROM naive_step", [STEP_FIXED_BYTES])
        naive_bytes = cursor.fetchone()[0]
        cursor.execute("DROP TABLE naive_step")
    n = len(run.steps)
    return (step_bytes + blob_bytes) / n, naive_bytes / n


if __name__ == "__main__":
    main()
