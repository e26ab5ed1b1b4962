"""What a dataset build costs on Postgres: a `value` version from a store of 1,000,000 steps.

The store: `--runs` synthetic coding-agent runs of `--steps-per-run` steps (20,000 x 50 by default), made
the way the recording proxy and the built-in harness store them: per decision a model call (its context
the list of message blobs, each message stored once, the reply inline) and the command it ran (output
inline, or in a blob past 2 KiB), over 1,000 tasks of 20 runs each, a third to a half of them successful.
It is written with COPY (generation time is not counted) into its own database (`--database-url`,
created if missing) and reused by later runs unless `--regenerate`. A tenth of the runs form the task set
`bench-small` (100,000 steps).

The headline is the first build (first_build_vs_copy): a store as ingest leaves it without the digest pass,
where the build reads every run's steps. The build on kept digests (build_vs_copy) is beside it: what later
builds cost once the digests exist (benchmarks/ingest.py times the digest pass as part of ingest's cost).

Figures, each measured in a child process (so its peak RSS is its own, read with getrusage):

- copy_rows_per_s: `COPY (SELECT <the step columns the build reads> FROM experience_step) TO STDOUT` of the
  1,000,000 step rows, read to the end in this process: the floor, best of two.
- read_rows_per_s: the build's read path alone (`dataset_source.source_runs`: trajectory rows through a
  server-side cursor, steps and blobs a batch at a time, records rebuilt), step rows per second.
- rows_per_s: the whole build (`dataset_version_build` of a `value` spec over the 1,000,000 steps:
  read, rubric labels, value rows, JSONL.gz and Parquet per split, manifest), step rows per second, on
  a store whose runs have their digest kept (`TrajectoryDigest`: what the beat derives after ingest, and
  any earlier value build keeps, writing the runs' rubric labels at the same time), so the build reads
  each run's digest instead of its steps, and finds their labels written.
  dataset_rows_per_s and output_mb_per_s say what it wrote. build_cpu_seconds_1m / read_cpu_seconds_1m:
  the CPU time they took (the build's reader processes included), which a busy machine inflates less than
  the wall time.
- first_build_rows_per_s: the same build on a store with no digest kept and no rubric label written (both
  deleted first): it reads every run's steps, derives and keeps their digests and writes their labels;
  first_build_cpu_seconds_1m its CPU time.
  The difference is what deriving digests costs, paid once per run (after ingest, or by the first build).
- peak_rss_mb_100k / peak_rss_mb_1m: peak RSS of the build child at 100,000 and at 1,000,000 steps, plus
  READERS times the largest peak of its reader processes (an upper bound).

Targets: the first build, the build on kept digests and the read path each at least a quarter of the COPY
rate; peak memory at 1M at most 1.5x that at 100k. (With a smaller --runs the `_1m` figures are of the whole
store and the `_100k` ones of its tenth.) The last line printed is one JSON object.

    .venv/bin/python benchmarks/distill.py [--runs 20000] [--steps-per-run 50] [--regenerate]
    quick: .venv/bin/python benchmarks/distill.py --runs 1000 --database-url postgres://postgres@127.0.0.1:5432/trove_bench_distill_quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/trove_bench_distill"
RUNS_PER_TASK = 20
SMALL_SET, LARGE_SET = "bench-small", "bench-large"
INLINE_LIMIT = 2048

WORDS = (
    "parser serializer field value rounding precision timezone datetime schema nested list dict cache "
    "request response header token session config loader plugin registry handler retry timeout buffer "
    "stream encoder decoder widget layout render column index query filter order limit offset cursor "
    "migration model manager signal worker queue task result error warning exception fails crashes "
    "returns wrong missing unexpected empty negative overflow unicode bytes path file directory"
).split()
SYSTEM = (
    "You are a software engineer working in a sandboxed repository. Each reply is a short THOUGHT and "
    "exactly one bash command in a ```bash block; you will see its output. Reproduce the issue first, "
    "make the smallest fix, run the tests, and when you are done reply with the line SUBMIT. "
) * 4


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("SECRET_KEY", "bench")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def ensure_database(database_url: str) -> None:
    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')


# --- the synthetic store -------------------------------------------------------------------------------


class Generator:
    """Synthetic runs as step / trajectory / blob rows, ready for COPY."""

    def __init__(self, seed: int) -> None:
        import zstandard

        self.rng = random.Random(seed)
        self.zstd = zstandard.ZstdCompressor(level=3)
        self.blobs: dict[str, tuple[int, str, bytes]] = {}
        self.now = datetime(2025, 6, 1, tzinfo=UTC)

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def blob(self, content: bytes) -> str:
        digest = hashlib.sha256(content).hexdigest()
        if digest not in self.blobs:
            packed = self.zstd.compress(content) if len(content) >= 512 else content
            encoding = "zstd" if len(packed) < len(content) else "raw"
            self.blobs[digest] = (len(content), encoding, packed if encoding == "zstd" else content)
        return digest

    def message(self, role: str, content: str) -> str:
        text = json.dumps({"content": content, "role": role}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return self.blob(text.encode())

    def task(self, number: int) -> dict[str, Any]:
        files = [f"src/pkg{number % 37}/{self.rng.choice(WORDS)}.py" for _ in range(3)]
        symbols = [f"{self.rng.choice(WORDS)}_{self.rng.choice(WORDS)}" for _ in range(4)]
        instruction = f"{symbols[0]}() in {files[0]} {self.words(90)}. Make it handle {self.words(12)}."
        return {"key": f"bench__repo{number % 50}-{number}", "files": files, "symbols": symbols,
                "instruction": instruction, "difficulty": self.rng.random()}  # fmt: skip

    def action(self, task: dict[str, Any], t: int, decisions: int, success: bool) -> tuple[str, str, int]:
        """(command, output, exit code) of decision t, shaped like a real run's phases."""
        rng, file, symbol = self.rng, self.rng.choice(task["files"]), self.rng.choice(task["symbols"])
        if t == decisions:
            return "submit", "", 0
        phase = t / decisions
        if phase < 0.3:
            return rng.choice([
                (f"cat {file}", self.code(rng.randint(15, 60)), 0),
                (f"grep -rn {symbol} src/", "\n".join(f"{file}:{rng.randint(1, 400)}: {self.words(8)}" for _ in range(rng.randint(2, 12))), 0),
                ("ls -R src | head -50", "\n".join(f"{self.rng.choice(WORDS)}.py" for _ in range(rng.randint(5, 30))), 0),
            ])  # fmt: skip
        if phase < 0.45:
            return "python reproduce.py", f"Traceback (most recent call last):\n  File \"{file}\", line {rng.randint(5, 300)}\n{self.words(10)}\nValueError: {self.words(6)}", 1
        if phase < 0.75:
            return (f"sed -i 's/{rng.choice(WORDS)}(/{symbol}(/' {file} && git diff",
                    f"diff --git a/{file} b/{file}\n" + self.code(rng.randint(4, 14), prefix="+"), 0)  # fmt: skip
        passed = success or rng.random() < 0.2
        verdict = f"{rng.randint(10, 90)} passed in {rng.random() * 3:.2f}s" if passed else (
            f"FAILED tests/test_{rng.choice(WORDS)}.py::test_{symbol} - AssertionError: {self.words(8)}\n"
            f"{rng.randint(1, 5)} failed, {rng.randint(5, 80)} passed in {rng.random() * 3:.2f}s")  # fmt: skip
        return f"pytest tests/test_{rng.choice(WORDS)}.py -q", self.code(rng.randint(0, 8)) + verdict, 0 if passed else 1

    def code(self, lines: int, prefix: str = "") -> str:
        rng = self.rng
        return "".join(
            f"{prefix}{'    ' * rng.randint(0, 3)}{rng.choice(['def', 'return', 'if', 'for', 'x ='])} "
            f"{rng.choice(WORDS)}_{rng.choice(WORDS)}({rng.choice(WORDS)}){':' if rng.random() < 0.4 else ''}\n"
            for _ in range(lines)
        )

    def run(self, task: dict[str, Any], trajectory_id: int, steps_per_run: int) -> tuple[dict, list[tuple]]:
        """One run: a trajectory row and its step rows (model call, then command, per decision)."""
        decisions = max(1, steps_per_run // 2)
        success = self.rng.random() > 0.35 + 0.3 * task["difficulty"]
        context = [self.message("system", SYSTEM), self.message("user", task["instruction"])]
        clock = self.now + timedelta(seconds=trajectory_id * 60)
        steps, tokens = [], 0
        for t in range(1, decisions + 1):
            command, output, exit_code = self.action(task, t, decisions, success)
            reply = f"THOUGHT: {self.words(self.rng.randint(8, 30))}\n\n```bash\n{command}\n```"
            tokens_in = sum(self.blobs[h][0] for h in context) // 4
            call_payload = {"response_text": reply, "model": "bench-policy", "latency_ms": 420.0}
            steps.append((trajectory_id, len(steps), "model_call", clock, clock + timedelta(milliseconds=420), 420.0,
                          tokens_in, 60, None, False, f"call-{trajectory_id}-{t}", reply[:300],
                          json.dumps(call_payload), json.dumps({"request_messages": list(context)})))  # fmt: skip
            clock += timedelta(milliseconds=500)
            payload: dict[str, Any] = {"command": command}
            refs: dict[str, Any] = {}
            if len(output) > INLINE_LIMIT:
                refs["output"] = self.blob(output.encode())
            else:
                payload["output"] = output
            steps.append((trajectory_id, len(steps), "command", clock, clock + timedelta(milliseconds=900), 900.0,
                          None, None, exit_code, False, None, command[:300], json.dumps(payload), json.dumps(refs)))  # fmt: skip
            clock += timedelta(seconds=1)
            tokens += tokens_in + 60
            context += [self.message("assistant", reply), self.message("user", f"exit code {exit_code}\n{output}")]
        reward = 1.0 if success else 0.0
        return {"id": trajectory_id, "task": task, "success": success, "reward": reward, "steps": len(steps),
                "calls": decisions, "tokens": tokens, "finished": clock}, steps  # fmt: skip

    def take_blobs(self) -> list[tuple]:
        rows = [(digest, size, encoding, data, self.now) for digest, (size, encoding, data) in self.blobs.items()]
        # The system prompt and task messages recur in later chunks: keep the digests, drop the bytes.
        self.blobs = {}
        return rows


STEP_COPY_COLUMNS = ("trajectory_id", "seq", "kind", "started_at", "ended_at", "duration_ms", "tokens_in",
                     "tokens_out", "exit_code", "is_error", "call_id", "preview", "payload", "blob_refs")  # fmt: skip
TRAJECTORY_COPY_COLUMNS = (
    "id", "uid", "source", "source_format", "source_version", "source_ref", "task_set", "task_key", "instruction",
    "harness", "model", "template", "image_digest", "metadata", "original_blob", "status", "reward", "success",
    "final_diff", "n_steps", "n_model_calls", "tokens_in", "tokens_out", "duration_s", "started_at",
    "finished_at", "next_seq", "content_hash", "is_duplicate", "curation_status", "tags", "notes", "created_at",
    "updated_at",
)  # fmt: skip


def trajectory_row(run: dict[str, Any], task_set: str, now: datetime) -> tuple:
    task = run["task"]
    started = now + timedelta(seconds=run["id"] * 60)
    return (run["id"], str(uuid.uuid4()), "rollout", "trove", "1", f"bench-{run['id']}", task_set, task["key"],
            task["instruction"], "builtin", "bench-policy", "python", "", "{}", "",
            "completed" if run["success"] else "failed", run["reward"], run["success"], "", run["steps"],
            run["calls"], run["tokens"], run["calls"] * 60, (run["finished"] - started).total_seconds(), started,
            run["finished"], run["steps"], hashlib.sha256(str(run["id"]).encode()).hexdigest(), False, "pending",
            "[]", "", now, now)  # fmt: skip


def copy_rows(table: str, columns: tuple[str, ...], rows: Any) -> None:
    from django.db import connection

    with connection.cursor() as cursor, cursor.connection.cursor() as raw:
        with raw.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def copy_blobs(rows: list[tuple]) -> None:
    """Blobs recur across chunks (the system prompt): COPY to a scratch table, insert the new ones."""
    from django.db import connection, transaction

    columns = ("sha256", "size", "encoding", "data", "created_at")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE IF NOT EXISTS bench_blob (LIKE experience_blob) ON COMMIT DELETE ROWS")
        copy_rows("bench_blob", columns, rows)
        cursor.execute(f"INSERT INTO experience_blob ({', '.join(columns)}) SELECT {', '.join(columns)} "
                       "FROM bench_blob ON CONFLICT (sha256) DO NOTHING")  # fmt: skip


_TYPE_DEFAULTS = {"boolean": False, "text": "", "character varying": "", "integer": 0, "bigint": 0,
                  "double precision": 0.0, "jsonb": "{}", "smallint": 0}  # fmt: skip


def other_required_columns(table: str, given: tuple[str, ...]) -> tuple[tuple[str, ...], tuple]:
    """NOT NULL columns without a database default that the generator does not set (fields other parts of
    Trove add as they grow), with a neutral value of their type."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s "
            "AND is_nullable = 'NO' AND column_default IS NULL ORDER BY ordinal_position", [table])  # fmt: skip
        missing = [(name, kind) for name, kind in cursor.fetchall() if name not in given and name != "id"]
    return tuple(name for name, _ in missing), tuple(_TYPE_DEFAULTS.get(kind, "") for _, kind in missing)


def generate(runs: int, steps_per_run: int) -> None:
    from django.db import connection

    generator = Generator(seed=7)
    tasks = [generator.task(n) for n in range(max(1, runs // RUNS_PER_TASK))]
    small_tasks = max(1, len(tasks) // 10)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE experience_trajectory, experience_step, experience_blob, experience_label, "
                       "experience_dataset, experience_datasetversion RESTART IDENTITY CASCADE")  # fmt: skip
    trajectory_id = 0
    for chunk_start in range(0, len(tasks), 50):
        trajectories, steps = [], []
        for number in range(chunk_start, min(len(tasks), chunk_start + 50)):
            task_set = SMALL_SET if number < small_tasks else LARGE_SET
            for _ in range(RUNS_PER_TASK):
                trajectory_id += 1
                run, run_steps = generator.run(tasks[number], trajectory_id, steps_per_run)
                trajectories.append(trajectory_row(run, task_set, generator.now))
                steps += run_steps
        extra_columns, extra_values = other_required_columns("experience_trajectory", TRAJECTORY_COPY_COLUMNS)
        copy_rows("experience_trajectory", TRAJECTORY_COPY_COLUMNS + extra_columns,
                  (row + extra_values for row in trajectories))  # fmt: skip
        extra_columns, extra_values = other_required_columns("experience_step", STEP_COPY_COLUMNS)
        copy_rows("experience_step", STEP_COPY_COLUMNS + extra_columns, (row + extra_values for row in steps))
        copy_blobs(generator.take_blobs())
        log(f"  generated {trajectory_id} runs ({time.perf_counter() - started:.0f} s)")
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('experience_trajectory', 'id'), %s)", [trajectory_id])
        cursor.execute("VACUUM ANALYZE experience_trajectory")
        cursor.execute("VACUUM ANALYZE experience_step")
        cursor.execute("VACUUM ANALYZE experience_blob")


def store_size() -> tuple[int, int]:
    from experience.models import Step, Trajectory

    return Trajectory.objects.filter(source="rollout").count(), Step.objects.count()


# --- measurements --------------------------------------------------------------------------------------


def copy_floor() -> dict[str, Any]:
    """Rows per second of COPY ... TO STDOUT of the step columns the build reads, read to the end."""
    from django.db import connection

    from experience.services.dataset_source import STEP_COLUMNS

    statement = f"COPY (SELECT {', '.join(STEP_COLUMNS)} FROM experience_step) TO STDOUT"
    best: dict[str, Any] = {}
    for _attempt in range(2):
        rows = size = 0
        started = time.perf_counter()
        with connection.cursor() as cursor, cursor.connection.cursor() as raw, raw.copy(statement) as copy:
            for block in copy:
                size += len(block)
                rows += bytes(block).count(b"\n")
        elapsed = time.perf_counter() - started
        if not best or rows / elapsed > best["rows_per_s"]:
            best = {"rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed, "mb": size / 1e6}
    return best


def child(args: argparse.Namespace) -> None:
    """One measured build (or read pass) in this process; prints its figures as JSON."""
    from django.conf import settings
    from django.db import connection

    from experience.models import Label, TrajectoryDigest
    from experience.services import dataset_source, datasets

    settings.TROVE_DATASET_DIR = Path(args.out_dir)
    filters = {"task_sets": [args.task_set]} if args.task_set else {}
    if args.drop_digests:  # a first build: it derives and keeps every digest and writes the rubric labels
        TrajectoryDigest.objects.all().delete()
        Label.objects.all().delete()
        with connection.cursor() as cursor:  # as autovacuum would (it may be off): no dead rows to wade through
            cursor.execute(f"VACUUM (ANALYZE) {Label._meta.db_table}, {TrajectoryDigest._meta.db_table}")
    started, cpu_started = time.perf_counter(), cpu_seconds()
    if args.child == "read":
        runs = steps = 0
        for run in dataset_source.source_runs(datasets.spec_for(kind="value", filters=filters)):
            runs += 1
            steps += len(run.record.steps)
        result: dict[str, Any] = {"runs": runs, "steps": steps}
    else:
        dataset = datasets.dataset_create(name=f"bench-{uuid.uuid4().hex[:8]}", kind="value", filters=filters)
        version = datasets.dataset_version_request(dataset=dataset, force=True)  # the build is measured, not the splits
        version = datasets.dataset_version_build(version_id=version.pk)
        assert version.status == "ready", version.error
        out = sum(entry["bytes"] for entry in version.manifest["files"])
        result = {"runs": version.manifest["store"]["runs_read"], "steps": version.manifest["store"]["steps_read"],
                  "dataset_rows": version.row_count, "output_bytes": out, "content_hash": version.content_hash}  # fmt: skip
    result["seconds"] = time.perf_counter() - started
    result["cpu_seconds"] = cpu_seconds() - cpu_started
    # The build runs in forked reader processes (`datasets._shards_aside`): their peaks count too. RUSAGE_CHILDREN
    # gives the largest peak of any of them.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    readers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * datasets.READERS
    result["peak_rss_mb"] = (own + readers) / 1024
    print(json.dumps(result), flush=True)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have ended (the reader)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_child(
    args: argparse.Namespace, kind: str, task_set: str, out_dir: str, *, drop_digests: bool = False
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, "--database-url", args.database_url, "--out-dir", out_dir]
    if task_set:
        command += ["--task-set", task_set]
    if drop_digests:
        command.append("--drop-digests")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {kind} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--steps-per-run", type=int, default=50)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--child", choices=("read", "build"), help=argparse.SUPPRESS)
    parser.add_argument("--task-set", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--drop-digests", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setup_django(args.database_url)
        child(args)
        return
    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.regenerate or store_size() != (args.runs, args.runs * (args.steps_per_run // 2) * 2):
        log(f"generating {args.runs} runs x {args.steps_per_run} steps")
        generate(args.runs, args.steps_per_run)
    runs, steps = store_size()
    log(f"store: {runs} runs, {steps} steps")
    floor = copy_floor()
    log(f"copy: {floor['rows_per_s']:.0f} rows/s ({floor['mb']:.0f} MB)")
    with tempfile.TemporaryDirectory(prefix="trove-bench-distill-") as out_dir:
        read = run_child(args, "read", "", out_dir)
        log(f"read path: {read['steps'] / read['seconds']:.0f} steps/s, peak {read['peak_rss_mb']:.0f} MB")
        first = run_child(args, "build", "", out_dir, drop_digests=True)
        log(f"first build (no digests kept), the headline: {first['steps']} steps in {first['seconds']:.1f} s, "
            f"{first['steps'] / first['seconds'] / floor['rows_per_s']:.3f}x COPY")
        small = run_child(args, "build", SMALL_SET, out_dir)
        log(f"build 100k: {small['steps']} steps in {small['seconds']:.1f} s, peak {small['peak_rss_mb']:.0f} MB")
        large = run_child(args, "build", "", out_dir)
        log(f"build on kept digests: {large['steps']} steps in {large['seconds']:.1f} s, "
            f"{large['steps'] / large['seconds'] / floor['rows_per_s']:.3f}x COPY, peak {large['peak_rss_mb']:.0f} MB")
    result = {
        "store_runs": runs,
        "store_steps": steps,
        "copy_rows_per_s": round(floor["rows_per_s"]),
        "first_build_rows_per_s": round(first["steps"] / first["seconds"]),
        "first_build_vs_copy": round(first["steps"] / first["seconds"] / floor["rows_per_s"], 3),
        "read_rows_per_s": round(read["steps"] / read["seconds"]),
        "rows_per_s": round(large["steps"] / large["seconds"]),
        "dataset_rows": large["dataset_rows"],
        "dataset_rows_per_s": round(large["dataset_rows"] / large["seconds"]),
        "output_mb_per_s": round(large["output_bytes"] / 1e6 / large["seconds"], 1),
        "build_seconds_1m": round(large["seconds"], 1),
        "build_cpu_seconds_1m": round(large["cpu_seconds"], 1),
        "read_cpu_seconds_1m": round(read["cpu_seconds"], 1),
        "read_vs_copy": round(read["steps"] / read["seconds"] / floor["rows_per_s"], 3),
        "build_vs_copy": round(large["steps"] / large["seconds"] / floor["rows_per_s"], 3),
        "first_build_seconds_1m": round(first["seconds"], 1),
        "first_build_cpu_seconds_1m": round(first["cpu_seconds"], 1),
        "first_build_content_hash_matches": first["content_hash"] == large["content_hash"],
        "peak_rss_mb_read_1m": round(read["peak_rss_mb"], 1),
        "peak_rss_mb_100k": round(small["peak_rss_mb"], 1),
        "peak_rss_mb_1m": round(large["peak_rss_mb"], 1),
        "rss_ratio_1m_vs_100k": round(large["peak_rss_mb"] / small["peak_rss_mb"], 3),
        "steps_100k": small["steps"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
