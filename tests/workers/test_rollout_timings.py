"""Where a real rollout's time went (Rollout.timings, the runner's Clock): the commands' own run time is what
the agent measured inside the sandbox, never the round trip around it, so the fence checks and exec logs
Trove adds to every exec are Trove's overhead, not sandbox time (benchmarks/rollout_throughput.py reads it)."""

from __future__ import annotations

import pytest

from webapp.fleets.models import SandboxEvent
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run
from workers.seed import seed_demo_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _run_demo_rollout(demo_task_set, demo_fleet, demo_model_url):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name="trove-demo-stand-in", enqueue=lambda rollout_id: None, task_keys=["slugify"],
                     max_steps=15)
    rollout = job.rollouts.get()
    rollout_run(rollout_id=rollout.pk, worker="w")
    rollout.refresh_from_db()
    return rollout


def test_sandbox_and_eval_time_are_the_agents_own_measure_of_each_command(local_backend, proxy, demo_model_url,
                                                                          demo_task_set, demo_fleet):
    rollout = _run_demo_rollout(demo_task_set, demo_fleet, demo_model_url)

    execs = list(SandboxEvent.objects.filter(sandbox_id=rollout.sandbox_id, kind="exec").values_list("reason", "data"))
    evals = [data["duration_ms"] for reason, data in execs if reason == "eval"]
    others = [data["duration_ms"] for reason, data in execs if reason != "eval"]
    timings = rollout.timings
    assert len(evals) == 1 and len(others) >= 3, execs  # setup, the harness's commands, the diff, the preparation
    # Each logged duration is the agent's figure (rounded to 0.01 ms); the clock sums the same figures.
    assert timings["eval_ms"] == pytest.approx(evals[0], abs=0.06)
    assert timings["sandbox_ms"] == pytest.approx(sum(others), abs=0.06 + 0.005 * len(others))


def test_the_round_trips_and_the_sandboxs_lifecycle_are_kept_apart_from_the_commands(local_backend, proxy,
                                                                                      demo_model_url, demo_task_set,
                                                                                      demo_fleet):
    rollout = _run_demo_rollout(demo_task_set, demo_fleet, demo_model_url)

    timings = rollout.timings
    assert set(timings) == {"model_ms", "sandbox_ms", "eval_ms", "exec_wall_ms", "sandbox_lifecycle_ms", "total_ms"}
    # A round trip holds its command, so the round trips' wall time is at least the commands' own time.
    assert timings["exec_wall_ms"] >= timings["sandbox_ms"] + timings["eval_ms"]
    # The demo fleet keeps nothing warm: the claim created the sandbox and the release destroyed it.
    assert timings["sandbox_lifecycle_ms"] > 0
    # Model calls, round trips and the lifecycle happen one after another: they fit in the rollout's wall time.
    parts = timings["model_ms"] + timings["exec_wall_ms"] + timings["sandbox_lifecycle_ms"]
    assert parts <= timings["total_ms"] + 0.3  # each figure is rounded to 0.1 ms
