"""Import speed of the formats from the wild against Trove's own export, on Postgres.

    DATABASE_URL=postgres://... .venv/bin/python benchmarks/import_formats.py [--runs 10000] [--sessions 1000]
        [--trials 1000]

Workload: `--runs` OpenAI-format conversations (a system prompt, a task, then 8 tool calls, shell and other
tools alternating, each answered, and a final reply: about 30 steps a run), written once as one JSON array
(the tau-bench shape) and once as Trove's own JSONL export of exactly the runs the array imports to; and
`--sessions` Claude Code session transcripts of the same shape, one file each, in one directory; and `--trials`
Harbor trial directories of the same runs (result.json with the verifier's reward, agent/trajectory.json in
ATIF-v1.7 as Trove's exporter writes it) in one job folder.

Phases, each from empty tables, on a scratch database created for the run and dropped after:
- trove: `manage.py import`'s service on the Trove export (the baseline: Trove's own bulk ingest format);
- array: the same service on the JSON array;
- claude: the same service on the directory of sessions (small files: written together, 50 to a group);
- harbor: the same service on the job folder (each trial read once, from its agent/trajectory.json).
Each figure is steps stored per second, end to end (detection, parsing, validation, fingerprints,
ingest). Target (issue 17): array and claude (and harbor) each at least half the trove rate. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

CALLS = 8
SYSTEM = "You are a careful agent. Use the tools to inspect and change the repository in /repo. " * 8


def conversation(index: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {index}: make tests/test_{index}.py pass."}]
    for call in range(CALLS):
        call_id = f"call_{index}_{call}"
        if call % 2 == 0:
            tool = {"name": "bash", "arguments": json.dumps({"command": f"cd /repo && pytest -q tests/test_{index}.py -k c{call}"})}
        else:
            tool = {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{index}_{call}.py"})}
        messages.append({"role": "assistant", "content": f"Step {call} of task {index}.",
                         "tool_calls": [{"id": call_id, "type": "function", "function": tool}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": f"output {index}.{call}\n" + "x" * (200 + (index * 7 + call) % 600)})
    messages.append({"role": "assistant", "content": f"Task {index} done."})
    return {"task_id": f"task-{index}", "trial": 0, "reward": float(index % 2), "info": {"n": index},
            "traj": messages}


def claude_session(index: int) -> str:
    session = f"00000000-0000-4000-8000-{index:012d}"
    common = {"isSidechain": False, "userType": "external", "cwd": "/repo", "sessionId": session,
              "version": "2.0.76", "gitBranch": "main"}
    lines = [{"type": "summary", "summary": f"Task {index}", "leafUuid": "x"},
             {**common, "type": "user", "uuid": f"{index}-u", "parentUuid": None,
              "timestamp": "2025-11-03T09:00:00.000Z",
              "message": {"role": "user", "content": f"Task {index}: make tests/test_{index}.py pass."}}]
    for call in range(CALLS):
        tool_id = f"toolu_{index}_{call}"
        name, given = ("Bash", {"command": f"pytest -q tests/test_{index}.py -k c{call}"}) if call % 2 == 0 else (
            "Read", {"file_path": f"/repo/src/module_{index}_{call}.py"})
        for block in ({"type": "text", "text": f"Step {call} of task {index}."},
                      {"type": "tool_use", "id": tool_id, "name": name, "input": given}):
            lines.append({**common, "type": "assistant", "uuid": f"{index}-a{call}-{block['type']}",
                          "timestamp": "2025-11-03T09:00:01.000Z",
                          "message": {"id": f"msg_{index}_{call}", "model": "claude-sonnet-4-5", "role": "assistant",
                                      "content": [block], "usage": {"input_tokens": 10, "output_tokens": 5}}})
        lines.append({**common, "type": "user", "uuid": f"{index}-r{call}", "timestamp": "2025-11-03T09:00:02.000Z",
                      "message": {"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": tool_id,
                           "content": f"output {index}.{call}\n" + "x" * (200 + (index * 7 + call) % 600)}]}})
    lines.append({**common, "type": "assistant", "uuid": f"{index}-end", "timestamp": "2025-11-03T09:00:03.000Z",
                  "message": {"id": f"msg_{index}_end", "model": "claude-sonnet-4-5", "role": "assistant",
                              "content": [{"type": "text", "text": f"Task {index} done."}]}})
    return "".join(json.dumps(line) + "\n" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--trials", type=int, default=1_000)
    args = parser.parse_args()
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("benchmarks/import_formats.py measures Postgres: set DATABASE_URL=postgres://...")
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_import_formats")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        with tempfile.TemporaryDirectory(prefix="trove-bench-import-") as folder:
            figures = measure(args, Path(folder))
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
    print(json.dumps(figures))


def measure(args: argparse.Namespace, folder: Path) -> dict:
    from experience.exporters import trove_jsonl
    from experience.importers import iter_records

    array = folder / "array" / "runs.json"
    array.parent.mkdir()
    array.write_text(json.dumps([conversation(i) for i in range(args.runs)], indent=2))
    export = folder / "trove" / "runs.jsonl"
    export.parent.mkdir()
    with open(export, "w") as handle:
        trove_jsonl.write(iter_records(array), handle)
    sessions = folder / "claude" / "-repo"
    sessions.mkdir(parents=True)
    for index in range(args.sessions):
        (sessions / f"00000000-0000-4000-8000-{index:012d}.jsonl").write_text(claude_session(index))

    job = folder / "harbor" / "job"
    write_trials(job, array, args.trials)

    figures: dict = {"runs": args.runs, "sessions": args.sessions, "trials": args.trials}
    for label, path in (("trove", export), ("array", array), ("claude", sessions.parent), ("harbor", job)):
        runs, steps, seconds = timed_import(path)
        figures[f"{label}_runs"] = runs
        figures[f"{label}_steps_per_s"] = round(steps / seconds)
        figures[f"{label}_runs_per_s"] = round(runs / seconds, 1)
        print(f"{label}: {runs} runs, {steps} steps in {seconds:.1f} s", file=sys.stderr)
    for label in ("array", "claude", "harbor"):
        figures[f"{label}_vs_trove"] = round(figures[f"{label}_steps_per_s"] / figures["trove_steps_per_s"], 2)
    figures["target_met"] = all(figures[f"{k}_vs_trove"] >= 0.5 for k in ("array", "claude", "harbor"))
    return figures


def write_trials(job: Path, array: Path, count: int) -> None:
    """The array's first `count` runs as Harbor trials: Trove's ATIF export as the agent's trajectory."""
    from itertools import islice

    from experience.exporters import atif
    from experience.importers import iter_records

    for index, record in enumerate(islice(iter_records(array), count)):
        trial = job / f"task-{index}__t{index:07d}"
        (trial / "agent").mkdir(parents=True)
        document = atif.write(record)
        document["extra"] = {}  # a trajectory as Harbor's agents write it, with no Trove hints
        (trial / "agent" / "trajectory.json").write_text(json.dumps(document, indent=2))
        (trial / "result.json").write_text(json.dumps({
            "id": f"trial-{index}", "task_name": record.task_key, "trial_name": trial.name, "source": "bench",
            "config": {"agent": {"name": "terminus-2", "model_name": "policy"}, "job_id": "bench"},
            "agent_info": {"name": "terminus-2", "version": "2.0.0"},
            "agent_result": {"n_input_tokens": 1000, "n_output_tokens": 100, "cost_usd": None},
            "verifier_result": {"rewards": {"reward": record.reward}}, "exception_info": None,
            "started_at": "2026-03-01T10:00:00Z", "finished_at": "2026-03-01T10:05:00Z"}, indent=4))


def timed_import(path: Path) -> tuple[int, int, float]:
    from django.db import connection

    from experience.models import Step
    from experience.services.importing import trajectories_import_path

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE experience_step, experience_trajectory, experience_blob CASCADE")
    start = time.perf_counter()
    report = trajectories_import_path(path=path)
    seconds = time.perf_counter() - start
    if report.failed:
        raise SystemExit(f"{path}: {report.failed[0].error}")
    return report.imported, Step.objects.count(), seconds


if __name__ == "__main__":
    main()
