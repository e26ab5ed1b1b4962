"""Runs shaped as the built-in harness records a demo rollout, for the value model tests.

Each decision is a model call carrying the request the model saw (the context grows by the reply and the
command's output) and the command it ran. A run ends on a submit reply, then the evaluation step the runner
writes (`workers.rollout_runner._eval_step`: kind `eval`, the verdict in its text, output and payload).

As with the demo's hidden tests, the visible tests the agent runs do not decide the reward: a run whose
visible tests passed fails the hidden ones a third of the time, and one that gave up always fails. So the
evaluation step tells the outcome exactly while what the agent saw tells it only in part: a model that
read the evaluation would rank the runs perfectly.
"""

from __future__ import annotations

import random
from dataclasses import replace

from experience.distill.source import SourceRun
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

SYSTEM = "You are a careful software engineer. Reply with one bash command in a ```bash block."


def _plan(rng: random.Random, task: str) -> tuple[list[tuple[str, str, int]], bool]:
    """(commands with their output and exit code, whether the visible tests passed at the end)."""
    steps = [(f"cat {task}/core.py", "def run(x):\n    return x\n", 0)]
    if rng.random() < 0.5:
        steps.append(("ls -la", "core.py\ntests", 0))
    steps.append((f"python3 -m unittest tests/test_{task}.py", "FAILED (failures=1)\nexit code 1", 1))
    roll = rng.random()
    if roll < 0.2:  # gives up
        return steps + [(f"cat -n {task}/core.py", "1 def run(x):", 0)], False
    steps.append((f"python3 - <<'EOF'\n# edit {task}/core.py\nEOF", f"edited {task}/core.py", 0))
    passed = roll < 0.7
    verdict = ("OK\nexit code 0", 0) if passed else ("FAILED (failures=2)\nexit code 1", 1)
    steps.append((f"python3 -m unittest tests/test_{task}.py", *verdict))
    return steps, passed


def demo_like_record(task: str, rng: random.Random) -> TrajectoryRecord:
    plan, visible_passed = _plan(rng, task)
    success = visible_passed and rng.random() < 2 / 3
    instruction = f"Fix `{task}.run()`: it returns the wrong value. The tests are in tests/test_{task}.py."
    messages = [MessageRecord("system", SYSTEM), MessageRecord("user", instruction)]
    steps: list[StepRecord] = []
    for command, output, exit_code in plan:
        reply = f"Next I run this.\n\n```bash\n{command}\n```"
        steps.append(StepRecord(kind="model_call", request_messages=list(messages), response_text=reply))
        steps.append(StepRecord(kind="command", command=command, output=output, exit_code=exit_code))
        messages += [MessageRecord("assistant", reply), MessageRecord("user", f"{output}")]
    done = "The tests pass now. TROVE_FINISHED" if visible_passed else "I could not fix it. TROVE_FINISHED"
    steps.append(StepRecord(kind="model_call", request_messages=list(messages), response_text=done))
    steps.append(eval_step(success))
    return TrajectoryRecord(
        source="rollout", source_format="trove", source_ref=f"demo-like:{task}:{rng.random()}",
        task_key=task, instruction=instruction, task_set="demo-like", status="completed",
        success=success, reward=1.0 if success else 0.0, steps=steps,
    )  # fmt: skip


def eval_step(success: bool) -> StepRecord:
    verdict = "passed" if success else "failed (exit 1)"
    return StepRecord(
        kind="eval",
        command="python3 -m unittest tests/test_x.py tests/test_x_hidden.py",
        output="OK" if success else "FAILED (failures=3)",
        exit_code=0 if success else 1,
        text=f"evaluation {verdict}; reward {1.0 if success else 0.0}",
        payload={"reward": 1.0 if success else 0.0, "timed_out": False},
    )


def demo_like_runs(seed: int, tasks: int, runs_per_task: int, prefix: str = "task") -> list[SourceRun]:
    """Runs sorted by (task key, id), as the build reads them."""
    rng = random.Random(seed)
    runs = []
    for task in range(tasks):
        for attempt in range(runs_per_task):
            key = f"{prefix}{seed}_{task:02d}"
            runs.append(SourceRun(trajectory_id=f"{key}-{attempt}", record=demo_like_record(key, rng)))
    return runs


def without_eval(run: SourceRun) -> SourceRun:
    steps = [step for step in run.record.steps if step.kind != "eval"]
    return replace(run, record=replace(run.record, steps=steps))


def with_eval_of(run: SourceRun, other: SourceRun) -> SourceRun:
    """`run` with `other`'s evaluation step in place of its own (the outcome label stays `run`'s)."""
    (theirs,) = [step for step in other.record.steps if step.kind == "eval"]
    steps = [theirs if step.kind == "eval" else step for step in run.record.steps]
    return replace(run, record=replace(run.record, steps=steps))
