"""Every harness preset solves a demo task end to end: its real CLI agent (installed bundle, read-only in the
sandbox) in a bubblewrap sandbox whose only network is the recording proxy, against the demo model in the
protocol it speaks; the reward comes from the task's tests, every call the demo model served is recorded,
and the replay shows the harness's tool calls.

The bundles come from the registries through `manage.py harness install` (.ci/run installs them once, cached
in TROVE_HARNESS_DIR); a missing bundle fails here with the command that installs it.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from experience.importers import detect_format, iter_records
from experience.importers.errors import ImportFormatError
from experience.models import Trajectory
from experience.run_steps import step_views
from experience.services.blobs import blob_get
from webapp.fleets import services as fleet_services
from webapp.fleets.models import SandboxEvent
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.harness import presets
from workers.harness.presets.bundles import bundle_installed
from workers.rollout_runner import rollout_run

MODEL = "trove-demo-stand-in"
RUNNABLE = ("mini-swe-agent", "opencode", "codex", "claude-code", "qwen-code", "gemini-cli")
MODEL_ROUTES = ("/chat/completions", "/responses", "/messages", ":generateContent", ":streamGenerateContent")


class CountingDemoModel:
    """The demo model, counting the model calls it served (count_tokens and pre-connects are not calls)."""

    def __init__(self, *, strategy: str | None = "solve") -> None:
        from aiohttp import web

        from webapp.proxy.server import serve_in_thread
        from workers.demo.model import make_app

        self.served = 0

        @web.middleware
        async def count(request, handler):
            response = await handler(request)
            if request.method == "POST" and request.path.endswith(MODEL_ROUTES):
                self.served += 1
            return response

        # Every episode solves: the harnesses' seeds are per session (random), and a test named for a solve
        # must see one, whatever the seed.
        app = make_app(strategy=strategy)
        app.middlewares.append(count)
        self._server = serve_in_thread(app, host="127.0.0.1", port=0, shutdown_timeout=0.5)
        self.url = f"{self._server.base_url}/v1"

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def demo_model():
    model = CountingDemoModel()
    yield model
    model.stop()


@pytest.fixture
def harness_fleet(transactional_db):
    """Proxy-only sandboxes with room for a native CLI agent (its threads count against pids)."""
    template = fleet_services.template_create(name=f"harness-{uuid.uuid4().hex[:6]}", cpu=1.0, memory_mb=2048,
                                              pids=1024, network="proxy-only", max_lifetime_s=3600,
                                              idle_timeout_s=900)
    return fleet_services.fleet_create(name=f"test-h-{uuid.uuid4().hex[:6]}", template=template, backend="local",
                                       min_warm=0, max_warm=4, max_total=8)


@pytest.fixture
def bundle_backend(local_backend):
    """The local backend with the installed bundles mounted, as the registry builds it."""
    local_backend.bundle_dir = str(settings.TROVE_HARNESS_DIR)
    return local_backend


# The catalogue's harnesses whose own logs Trove imports (issue 17): the log of the version it installs must read.
NATIVE_LOG_FORMATS = {"codex": "codex", "claude-code": "claude_code", "mini-swe-agent": "mini_swe_agent"}


def assert_native_logs_import(entries: list[dict], format: str, folder: Path) -> None:
    """The native logs, written out where they were (a session's subagents beside it), import as `format`."""
    for entry in entries:
        path = folder / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob_get(entry["sha256"]))
    files = [folder / e["path"] for e in entries if "/subagents/" not in e["path"]]
    assert [detect_format(f) for f in files] == [format] * len(files), [e["path"] for e in entries]
    runs = [run for f in files for run in iter_records(f)]
    kinds = {step.kind for run in runs for step in run.steps}
    assert runs and "model_call" in kinds and kinds & {"command", "tool_call"}, (format, kinds)


# Those whose logs Trove does not import yet: the refusal names the format (never a misread as another's).
NATIVE_LOG_NAMED = {"qwen-code": "a Qwen Code session", "gemini-cli": "a Gemini CLI saved chat"}


def assert_native_logs_named(entries: list[dict], named: str, folder: Path) -> None:
    for entry in entries:
        path = folder / Path(entry["path"]).name
        path.write_bytes(blob_get(entry["sha256"]))
        with pytest.raises(ImportFormatError, match=f"this looks like {named}"):
            detect_format(path)


def require_bundle(name: str) -> tuple[presets.Preset, str]:
    preset, version = presets.resolve(name)
    assert bundle_installed(settings.TROVE_HARNESS_DIR, preset, version), (
        f"{name}@{version} is not installed in {settings.TROVE_HARNESS_DIR}: run "
        f"`manage.py harness install {name}` (.ci/run does)")
    return preset, version


def preset_job(task_set, fleet, model, harness: str, **options):
    from tests.webapp.rollouts.jobs_factories import make_endpoint

    preset, _ = presets.resolve(harness)
    # Each protocol's upstream base URL as its clients write it: Gemini's ends in /v1beta, the others' in /v1.
    base_url = model.url.removesuffix("/v1") + "/v1beta" if preset.protocol == "gemini" else model.url
    endpoint = make_endpoint(base_url, model_names=[MODEL], protocol=preset.protocol)
    options.setdefault("max_steps", 20)
    # A harness with no turn limit of its own (codex, opencode) runs a wandering demo sample to the wall time.
    options.setdefault("wall_time_s", 150)
    return job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, model_name=MODEL,
                      enqueue=lambda rollout_id: None, harness=presets.canonical(harness),
                      task_keys=["slugify"], **options)


def replayed_tool_calls(trajectory: Trajectory) -> list[dict]:
    """The tool calls the replay page shows (its step view model), over the whole run."""
    views, _ = step_views(trajectory=trajectory, limit=1000)
    return [call for view in views if view["kind"] == "model_call" for call in view.get("tool_calls") or []]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", RUNNABLE)
def test_a_preset_solves_a_demo_task_through_the_proxy_in_its_own_protocol(
    bundle_backend, unix_proxy, demo_model, demo_task_set, harness_fleet, name, tmp_path
):
    preset, version = require_bundle(name)
    job = preset_job(demo_task_set, harness_fleet, demo_model, name)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.SUCCEEDED, (status, rollout.error)
    trajectory = rollout.trajectory
    assert trajectory.status == Trajectory.Status.COMPLETED and trajectory.harness == f"{name}@{version}"
    assert trajectory.metadata["harness_name"] == name and trajectory.metadata["harness_version"] == version
    assert trajectory.metadata["harness_protocol"] == preset.protocol
    assert trajectory.metadata["model_endpoint"] == job.endpoint.name
    eval_step = trajectory.steps.get(kind="eval")
    assert rollout.reward == eval_step.payload["reward"] == 1.0 and trajectory.success is True
    calls = trajectory.steps.filter(kind="model_call")
    assert calls.count() == demo_model.served >= 2, "every call the demo model served was recorded"
    assert not calls.filter(is_error=True).exists()
    assert replayed_tool_calls(trajectory), "the replay shows the harness's tool calls"
    log_note = trajectory.steps.get(kind="note", payload__harness=name)
    assert log_note.payload["native_logs"], f"{name} left its native log ({preset.native_logs})"
    first = log_note.payload["native_logs"][0]
    assert len(blob_get(first["sha256"])) == first["bytes"] > 0
    if name in NATIVE_LOG_FORMATS:
        assert_native_logs_import(log_note.payload["native_logs"], NATIVE_LOG_FORMATS[name], tmp_path)
    if name in NATIVE_LOG_NAMED:
        assert_native_logs_named(log_note.payload["native_logs"], NATIVE_LOG_NAMED[name], tmp_path)
    if name == "opencode":  # its session itself, not only its log: a SQLite database (and its WAL) since 1.x
        kept = {Path(e["path"]).name: e for e in log_note.payload["native_logs"]}
        assert blob_get(kept["opencode.db"]["sha256"]).startswith(b"SQLite format 3\x00"), sorted(kept)
    # printed by the harness's script after it, in its exec: none of their own, nothing of them in its output
    assert not SandboxEvent.objects.filter(sandbox=rollout.sandbox, kind="exec", reason="collect native logs").exists()
    harness_step = trajectory.steps.get(kind="command", payload__harness=f"{name}@{version}")
    output = blob_get(harness_step.blob_refs["output"]).decode() if "output" in harness_step.blob_refs else ""
    assert "TROVE-NATIVE-LOGS" not in output
    command = harness_step.payload["command"]
    assert rollout.token not in command and "<instruction>" in command


@pytest.mark.django_db(transaction=True)
def test_a_preset_that_fails_before_reaching_the_model_is_an_infra_error_never_training_data(
    bundle_backend, unix_proxy, demo_model, demo_task_set, harness_fleet, monkeypatch, settings
):
    """A harness that cannot start its run (here: opencode given a subcommand it does not have) exits with an
    error without one model call: the run says nothing about the agent, so it is infra, not a failed sample."""
    settings.TROVE_ROLLOUT_MAX_ATTEMPTS = 1
    preset, _ = require_bundle("opencode")
    broken = dataclasses.replace(preset, argv=("no-such-subcommand", *preset.argv[1:]))
    monkeypatch.setitem(presets.CATALOGUE, "opencode", broken)
    job = preset_job(demo_task_set, harness_fleet, demo_model, "opencode", wall_time_s=120)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.INFRA_ERROR, rollout.error
    assert "harness_failed" in rollout.error and "without one model call" in rollout.error
    assert rollout.trajectory.status == Trajectory.Status.INFRA_ERROR and rollout.reward is None
    assert demo_model.served == 0


@pytest.mark.django_db(transaction=True)
def test_a_preset_whose_bundle_is_not_installed_is_refused_before_a_sandbox_is_taken(
    bundle_backend, unix_proxy, demo_model, demo_task_set, harness_fleet
):
    job = preset_job(demo_task_set, harness_fleet, demo_model, "opencode@0.0.1-never-installed")
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.INFRA_ERROR
    assert "harness_not_installed" in rollout.error and "manage.py harness install opencode@0.0.1" in rollout.error
    assert bundle_backend.list({}) == []


def test_manage_py_demo_runs_a_preset_and_its_summary_names_harness_version_and_protocol(tmp_path):
    """`manage.py demo --harness codex` as a newcomer runs it: the embedded default (SQLite, in-process worker),
    the installed bundle, Codex speaking Responses to the proxy, which translates for the chat demo model."""
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    preset, version = require_bundle("codex")
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env.update(TROVE_VAR_DIR=str(tmp_path / "var"), DEMO_SERVE="0", TROVE_PROXY_PORT="0", TROVE_DEMO_MODEL_PORT="0",
               TROVE_HARNESS_DIR=str(settings.TROVE_HARNESS_DIR), DJANGO_SETTINGS_MODULE="webapp.settings")

    result = subprocess.run([sys.executable, "manage.py", "demo", "--harness", "codex", "--samples", "1", "--tasks", "2"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=600)

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"Harness Codex CLI (codex) version {version}, speaking the OpenAI Responses protocol" in result.stdout
    assert "2 rollouts" in result.stdout and "0 infra errors" in result.stdout
    database = sqlite3.connect(tmp_path / "var" / "trove.sqlite3")
    harnesses = {row[0] for row in database.execute("select harness from experience_trajectory")}
    assert harnesses == {f"codex@{version}"}
    calls = database.execute("select count(*) from experience_step where kind = 'model_call'").fetchone()[0]
    assert calls >= 4



@pytest.mark.django_db(transaction=True)
def test_claude_code_with_a_read_only_home_claims_success_but_ends_infra_error_never_training_data(
    bundle_backend, unix_proxy, demo_model, demo_task_set, harness_fleet, monkeypatch, settings
):
    """The real Claude Code bundle given a HOME (so a config directory) it cannot write: the bundle's own
    read-only mount. It still calls the model, runs its tools and exits 0 with a successful JSON result, but
    keeps no session log, so whether its tools ran cannot be checked: infra, not a sample to train on."""
    settings.TROVE_ROLLOUT_MAX_ATTEMPTS = 1
    preset, version = require_bundle("claude-code")
    env = {**preset.env, "HOME": "$bundle", "CLAUDE_CONFIG_DIR": "$bundle/.claude"}
    monkeypatch.setitem(presets.CATALOGUE, "claude-code", dataclasses.replace(preset, env=env, writable_dirs=()))
    job = preset_job(demo_task_set, harness_fleet, demo_model, "claude-code")
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    harness_step = rollout.trajectory.steps.get(kind="command", payload__harness=f"claude-code@{version}")
    assert harness_step.payload["reason"] == "exited" and '"subtype":"success"' in harness_step.payload["output"]
    assert demo_model.served >= 1, "it reached the model"
    assert status == Rollout.Status.INFRA_ERROR, rollout.error
    assert "harness_failed" in rollout.error and "no session log" in rollout.error and "not writable" in rollout.error
    assert rollout.trajectory.status == Trajectory.Status.INFRA_ERROR and rollout.reward is None
    assert not rollout.trajectory.steps.filter(kind="eval").exists(), "an untrusted run is not evaluated"
