"""Full-text search on the embedded (SQLite) store: the FTS5 index (migration 0014) against the substring scan
it replaced, and what keeping the index costs ingest.

    env -u DATABASE_URL .venv/bin/python benchmarks/embedded_search.py [--runs 2000] [--steps 20]

Builds a scratch SQLite store under a temporary TROVE_VAR_DIR (migrated, so with the FTS5 triggers), stores
`runs` runs of `steps` steps each through the real ingest service (`trajectories_ingest_many`), half with the
FTS5 triggers and half with them dropped, alternating batches so drift hits both alike: ingest_steps_per_s
with the index kept and ingest_floor_steps_per_s without it (the real floor: the same writes, nothing
indexed). Then times the explorer's search (`trajectory_search(q=...)`, all matching ids) over every stored
step for a word, a phrase, an `or` and a prefix, each the median of 5: search_p50_ms over the four, against
the baseline substring_p50_ms, the same four queries answered the way the embedded store did before FTS5
(case-insensitive LIKE over each step's preview and payload text; it cannot say "whole word", so its answers
are a superset). Targets: search at least 10x faster than the substring scan at 40,000 steps; ingest with the
index at least 0.5x the floor. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = ("pytest django parse_time widget flaky module yaml loader import error traceback assert config path "
         "request response cache token sandbox fleet rollout harness kernel buffer socket thread lock").split()
QUERIES = ("flamegraph", '"module named yaml"', "flamegraph or segfault", "flame*")


def setup_django(var_dir: str) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ["TROVE_VAR_DIR"] = var_dir
    os.environ.setdefault("SECRET_KEY", "bench-secret")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def make_runs(n: int, steps: int, rng: random.Random, offset: int) -> list:
    from experience.records import StepRecord, TrajectoryRecord

    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    runs = []
    for i in range(n):
        body = [StepRecord(kind="command", command=f"python -m pytest tests/{rng.choice(WORDS)}.py -k {text(2)}",
                           output=text(40), exit_code=rng.randint(0, 1)) for _ in range(steps)]
        if (offset + i) % 50 == 0:  # a few needles, so the queries match some runs
            body[steps // 2] = StepRecord(kind="command", command="make flamegraph",
                                          output="ImportError: No module named yaml", exit_code=1)
        runs.append(TrajectoryRecord(source="api", source_format="bench", source_ref=f"bench-{offset + i}",
                                     task_key=f"task-{i % 20}", instruction="Fix it.", harness="builtin",
                                     model="m", status="completed", steps=body))
    return runs


def fts_migration():
    import importlib

    return importlib.import_module("experience.migrations.0014_step_fts_sqlite")


def set_triggers(on: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for statement in fts_migration().DROP_TRIGGERS + (fts_migration().TRIGGERS if on else []):
            cursor.execute(statement)


def measure_ingest(runs: int, steps: int, batch: int) -> tuple[float, float]:
    from experience.services.ingest import trajectories_ingest_many

    rng, timings = random.Random(7), {True: [], False: []}
    for n, start in enumerate(range(0, runs, batch)):
        indexed = n % 2 == 0
        records = make_runs(min(batch, runs - start), steps, rng, start)
        set_triggers(indexed)
        began = time.perf_counter()
        trajectories_ingest_many(records=records)
        timings[indexed].append(len(records) * steps / (time.perf_counter() - began))
    set_triggers(True)
    return statistics.median(timings[True]), statistics.median(timings[False])


def reindex_all() -> None:
    """The steps stored while the triggers were off go into the index, so search sees every step."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO experience_step_fts (experience_step_fts) VALUES ('delete-all')")
        cursor.execute(fts_migration().FILL)


def substring_ids(q: str) -> list[int]:
    """The search the embedded store did before FTS5: every term a case-insensitive substring of one step."""
    from django.db.models import Q, TextField
    from django.db.models.functions import Cast

    from experience.models import Step, Trajectory
    from experience.search_hits import query_groups

    condition = Q(pk__in=[])
    for group in query_groups(q):
        both = Q()
        for term in group:
            both &= Q(preview__icontains=term.text) | Q(payload_text__icontains=term.text)
        condition |= both
    steps = Step.objects.annotate(payload_text=Cast("payload", TextField())).filter(condition)
    return list(Trajectory.objects.filter(id__in=steps.values("trajectory_id")).values_list("pk", flat=True))


def fts_ids(q: str) -> list[int]:
    from experience.search import filters_from_params, trajectory_search

    return list(trajectory_search(filters=filters_from_params({"q": q})).values_list("pk", flat=True))


def median_ms(find, q: str, repeats: int = 5) -> tuple[float, int]:
    samples, found = [], 0
    for _ in range(repeats):
        began = time.perf_counter()
        found = len(find(q))
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trove-bench-fts-") as var_dir:
        setup_django(var_dir)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        indexed, floor = measure_ingest(args.runs, args.steps, args.batch)
        reindex_all()
        per_query = {}
        for q in QUERIES:
            fts, fts_found = median_ms(fts_ids, q)
            sub, sub_found = median_ms(substring_ids, q)
            per_query[q] = {"fts_ms": round(fts, 2), "substring_ms": round(sub, 2), "fts_runs": fts_found,
                            "substring_runs": sub_found}
            print(f"{q!r:28} fts {fts:8.2f} ms ({fts_found} runs)   substring {sub:8.2f} ms ({sub_found} runs)")
    search = statistics.median(v["fts_ms"] for v in per_query.values())
    substring = statistics.median(v["substring_ms"] for v in per_query.values())
    result = {
        "bench": "embedded_search", "runs": args.runs, "steps": args.runs * args.steps,
        "search_p50_ms": round(search, 2), "substring_p50_ms": round(substring, 2),
        "search_speedup": round(substring / search, 1) if search else None,
        "ingest_steps_per_s": round(indexed), "ingest_floor_steps_per_s": round(floor),
        "ingest_ratio": round(indexed / floor, 2), "queries": per_query,
    }
    result["targets_met"] = {"search_10x": result["search_speedup"] >= 10, "ingest_half": result["ingest_ratio"] >= 0.5}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
