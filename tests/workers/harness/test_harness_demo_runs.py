"""The built-in harness works every demo task with the demo model and a real executor, over several seeds:
outcomes are mixed, and successful runs look like an agent's (explore -> reproduce -> edit -> test)."""

from __future__ import annotations

from collections import Counter

import pytest

from workers.demo.tasks import load_demo_tasks
from workers.harness.builtin import openai_chat, run_builtin_harness

SEEDS = (0, 1, 2, 3)
MAX_STEPS = 20


def _kind(command: str) -> str:
    if command.startswith("python3 - <<"):
        return "edit"
    if "unittest" in command:
        return "test"
    if command.split()[0] in {"ls", "cat", "find", "grep", "sed", "head", "wc"}:
        return "explore"
    return "other"


def _has_agent_shape(kinds: list[str]) -> bool:
    """An exploration, then a test run before the first edit, an edit, and a test run after the last edit."""
    if "edit" not in kinds or "explore" not in kinds:
        return False
    first_edit, last_edit = kinds.index("edit"), len(kinds) - 1 - kinds[::-1].index("edit")
    return (
        kinds.index("explore") < first_edit
        and "test" in kinds[kinds.index("explore") : first_edit]
        and "test" in kinds[last_edit:]
    )


def _run(task, seed, url, workspace):
    execute = workspace(task)
    commands: list[str] = []
    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(url, "trove-demo-stand-in", seed=seed),
        execute=execute,
        max_steps=MAX_STEPS,
        seed=seed,
        on_command=lambda cmd, *_: commands.append(cmd),
    )
    for path, text in task.eval_files.items():  # the hidden tests reach the workspace only for the evaluation
        execute.backend.write_file(execute.handle, path, text.encode())
    passed = execute(task.eval_command).ok  # the reward, as the rollout runner computes it after the harness
    return outcome, commands, passed


@pytest.mark.slow
def test_every_task_over_several_seeds_gives_mixed_outcomes_and_agent_shaped_successes(
    demo_model_url, task_workspace
):
    tasks = load_demo_tasks()
    results = {(t.key, s): _run(t, s, demo_model_url, task_workspace) for t in tasks for s in SEEDS}

    successes = [(key, seed) for (key, seed), (_, _, passed) in results.items() if passed]
    reasons = Counter(outcome.reason for outcome, _, _ in results.values())
    by_difficulty = Counter((t.difficulty, results[(t.key, s)][2]) for t in tasks for s in SEEDS)
    print(
        f"\ndemo policy success rate: {len(successes)}/{len(results)} = {len(successes) / len(results):.0%}; "
        f"end reasons {dict(reasons)}; by difficulty "
        + ", ".join(
            f"{d}: {by_difficulty[(d, True)]}/{by_difficulty[(d, True)] + by_difficulty[(d, False)]}"
            for d in ("easy", "medium", "hard")
        )
    )

    assert 0.25 * len(results) < len(successes) < 0.9 * len(results)
    assert reasons["submitted"] and reasons["step_budget"]
    for key, seed in successes:
        outcome, commands, _ = results[(key, seed)]
        assert outcome.finished, (key, seed)
        assert _has_agent_shape([_kind(c) for c in commands]), (key, seed, commands)
    for outcome, commands, passed in results.values():
        assert outcome.steps <= MAX_STEPS and outcome.commands == len(commands)
        assert passed or outcome.reason in {"submitted", "step_budget"}
    mixed = {t.key for t in tasks if len({results[(t.key, s)][2] for s in SEEDS}) == 2}
    assert len(mixed) >= 4
    easy_rate = by_difficulty[("easy", True)] / sum(v for (d, _), v in by_difficulty.items() if d == "easy")
    hard_rate = by_difficulty[("hard", True)] / sum(v for (d, _), v in by_difficulty.items() if d == "hard")
    assert easy_rate > hard_rate


def test_a_rerun_with_the_same_seed_repeats_the_run_exactly(demo_model_url, task_workspace):
    task = next(t for t in load_demo_tasks() if t.key == "interval_merge")

    first = _run(task, 5, demo_model_url, task_workspace)
    second = _run(task, 5, demo_model_url, task_workspace)

    assert first[1] == second[1] and first[2] == second[2]
    assert [m["content"] for m in first[0].messages if m["role"] == "assistant"] == [
        m["content"] for m in second[0].messages if m["role"] == "assistant"
    ]
