"""The same pipeline in the embedded default: no DATABASE_URL (SQLite under var/), no REDIS_URL (the
in-process worker on the memory transport). Run as `manage.py demo` in a subprocess, as a newcomer would."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from webapp.var_dir import sandbox_host_dir

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


# Assembles the RL samples of every stored run with the embedded store's own settings, as a trainer would.
SAMPLES_SCRIPT = """
import json
from experience.models import Trajectory
from experience.services.rl_samples import run_samples
from webapp.rollouts.models import ModelEndpoint
assemblies = run_samples(trajectory_ids=Trajectory.objects.values_list("pk", flat=True))
samples = [s for a in assemblies.values() for s in a.samples]
print(json.dumps({"runs": len(assemblies), "samples": len(samples), "exact": sum(s.exact for s in samples),
                  "capture": ModelEndpoint.objects.get(name="demo-model").token_capture}))
"""


@dataclass
class DemoRun:
    tmp_path: Path
    env: dict[str, str]
    result: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> DemoRun:
    """One `manage.py demo` run (2 samples of 3 tasks) that the tests below read."""
    tmp_path = tmp_path_factory.mktemp("embedded")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env.update(TROVE_VAR_DIR=str(tmp_path / "var"), DEMO_SERVE="0", TROVE_PROXY_PORT="0",
               TROVE_DEMO_MODEL_PORT="0", DJANGO_SETTINGS_MODULE="webapp.settings")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--samples", "2", "--tasks", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    return DemoRun(tmp_path=tmp_path, env=env, result=result)


def test_the_demo_job_runs_in_the_embedded_default(demo_run):
    tmp_path, result = demo_run.tmp_path, demo_run.result
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "6 rollouts" in result.stdout and "demo stand-in" in result.stdout
    assert "No hostname was supplied" not in result.stderr  # kombu's warning for a broker URL without a host

    database = sqlite3.connect(tmp_path / "var" / "trove.sqlite3")
    statuses = [row[0] for row in database.execute("select status from rollouts_rollout")]
    assert len(statuses) == 6 and set(statuses) <= {"succeeded", "failed"}
    kinds = {row[0] for row in database.execute("select distinct kind from experience_step")}
    assert {"model_call", "command", "eval"} <= kinds
    rewards = [row[0] for row in database.execute("select reward from experience_trajectory")]
    assert len(rewards) == 6 and all(r in (0.0, 1.0) for r in rewards)
    # The demo fills the warm pool (2 x concurrency 2) before the job starts, and says how many run at once.
    warm_claims = database.execute(
        "select count(*) from fleets_sandbox where leased_at is not null and not cold_claim").fetchone()[0]
    assert warm_claims >= 4 and "rollouts run 2 at a time" in result.stdout
    live = database.execute("select count(*) from fleets_sandbox where state != 'terminated'").fetchone()[0]
    assert live == 0
    sandbox_root = sandbox_host_dir(tmp_path / "var") / "sandboxes"  # the default (as root: outside var/)
    leftovers = [p.name for p in sandbox_root.iterdir() if not p.name.startswith(".")]
    assert leftovers == []
    if sandbox_root.parent != tmp_path / "var":
        shutil.rmtree(sandbox_root.parent)  # this run's own directory under /var/lib/trove-sandboxes


def test_the_demo_jobs_rollouts_are_exact_rl_samples(demo_run):
    """The demo registers its model with token capture on, so every run is one sample of the token ids the
    demo model generated (exact fraction 1.0), not a re-tokenised guess."""
    assert demo_run.result.returncode == 0, demo_run.result.stderr[-4000:]
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c", SAMPLES_SCRIPT], cwd=REPO, env=demo_run.env,
                           capture_output=True, text=True, timeout=300)
    assert shell.returncode == 0, shell.stderr[-4000:]
    figures = json.loads(shell.stdout.strip().splitlines()[-1])

    assert figures["capture"] == "vllm"
    assert figures["runs"] == 6 and figures["samples"] == 6 and figures["exact"] == 6, figures
