"""Every episode of the demo policy ends on its own, so a harness without a step budget of its own (Codex,
opencode, Claude Code) is not kept calling until the rollout's wall time."""

from __future__ import annotations

import random

from workers.demo import policy
from workers.demo.tasks import load_demo_tasks


def _actions_until_submit(task, seed: int, observation: str) -> list[policy.Action]:
    episode = policy._episode(task, random.Random(seed))
    actions = [next(episode)]
    while actions[-1].kind != "submit" and len(actions) <= policy.WANDER_ACTIONS + 30:
        actions.append(episode.send(observation))
    return actions


def test_every_episode_of_every_task_submits_within_a_bounded_number_of_actions():
    bound = policy.WANDER_ACTIONS + 20
    wandered = 0
    for task in load_demo_tasks():
        for seed in range(40):
            actions = _actions_until_submit(task, seed, observation="FAILED (failures=1)")
            assert actions[-1].kind == "submit", (task.key, seed, [a.kind for a in actions[-5:]])
            assert len(actions) <= bound, (task.key, seed, len(actions))
            wandered += not any(a.kind == "edit" for a in actions) and len(actions) > policy.WANDER_ACTIONS
    assert wandered, "some episodes wandered (the strategy this bound is for)"


def test_a_wandering_episode_gives_up_unsolved_after_its_actions():
    task = load_demo_tasks()[0]
    wander = policy._wander(task, random.Random(7), "python3 -m unittest")
    actions = [next(wander) for _ in range(policy.WANDER_ACTIONS + 3)]
    assert {a.kind for a in actions[: policy.WANDER_ACTIONS]} <= {"explore", "reproduce"}
    assert [a.kind for a in actions[policy.WANDER_ACTIONS:]] == ["submit"] * 3
    assert all(a.edit is None and "EOF" not in a.command for a in actions)


def test_a_forced_strategy_is_taken_whatever_the_seed_and_an_unknown_one_is_refused():
    """Tests of real harnesses force `solve` (their seeds are per session, random): every seed then edits
    with the task's solution, and the episode's other draws stay its seed's."""
    import pytest

    task = load_demo_tasks()[0]
    for seed in range(30):
        episode = policy._episode(task, random.Random(seed), "solve")
        actions = [next(episode)]
        while actions[-1].kind != "edit":
            actions.append(episode.send("FAILED (failures=1)"))
        assert actions[-1].edit == task.solution[0] if len(task.solution) == 1 else actions[-1].edit is None
        unforced = policy._episode(task, random.Random(seed))
        assert next(unforced) == actions[0], "forcing changes nothing before the strategy's own actions"
    with pytest.raises(ValueError, match="unknown demo strategy 'cheat'"):
        policy.next_action([{"role": "user", "content": task.instruction}], strategy="cheat")
