"""Record factories (factory_boy over the plain dataclasses the store ingests) and fixture paths.

`run_record(...)` builds a small coding-agent run: a system prompt and a task, then model calls whose
context grows by the previous reply and command output, each followed by its command. `stored(...)` puts
runs in the store through the real ingest service. The real fixtures' paths are in
tests/experience/importers/fixture_files.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import factory

from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services.ingest import trajectories_ingest_many

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class StepFactory(factory.Factory):
    class Meta:
        model = StepRecord

    kind = "command"
    command = factory.Sequence(lambda n: f"echo step-{n}")
    output = "ok\n"
    exit_code = 0


class RunFactory(factory.Factory):
    class Meta:
        model = TrajectoryRecord

    source = "api"
    source_format = "trove-test"
    source_ref = factory.Sequence(lambda n: f"run-{n}")
    task_key = factory.Sequence(lambda n: f"task-{n % 3}")
    instruction = "Fix the bug."
    harness = "builtin"
    model = "policy-7"
    status = "completed"
    steps = factory.LazyFunction(lambda: [StepFactory(), StepFactory()])


def run_record(*, calls: int = 3, commands: list[str] | None = None, **fields) -> TrajectoryRecord:
    """A run whose model calls see a growing context (the messages are shared objects, as importers make)."""
    commands = commands or [f"python -m pytest tests/test_mod.py::test_{n}" for n in range(calls)]
    context = [MessageRecord("system", "You are careful. " * 40), MessageRecord("user", "Fix parse().")]
    steps: list[StepRecord] = []
    clock = T0
    for n, command in enumerate(commands):
        reply = f"Let me run it.\n```bash\n{command}\n```"
        output = f"{n} passed\n" + "x" * (50 * n)
        steps.append(StepRecord(kind="model_call", request_messages=list(context), response_text=reply,
                                tokens_in=100 + 10 * n, tokens_out=20, call_id=f"call-{n}", started_at=clock,
                                ended_at=clock + timedelta(seconds=1)))
        steps.append(StepRecord(kind="command", command=command, output=output, exit_code=n % 2,
                                started_at=clock + timedelta(seconds=1), ended_at=clock + timedelta(seconds=2)))
        clock += timedelta(seconds=2)
        context = context + [MessageRecord("assistant", reply), MessageRecord("tool", output)]
    return RunFactory(steps=steps, started_at=T0, finished_at=clock, reward=1.0, success=True, **fields)


def stored(*records: TrajectoryRecord) -> list[int]:
    """Store runs as the store holds them, rollouts included: the test stands in for the rollout runner."""
    return [o.trajectory_id for o in trajectories_ingest_many(records=list(records), rollout_runner=True)]
