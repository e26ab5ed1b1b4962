"""RL samples from real harness traffic: the built-in harness and the mini-swe-agent preset (its installed
bundle, in a proxy-only bubblewrap sandbox) against the demo model, through the recording proxy with the
endpoint's token capture on. Each rollout is one exact sample whose loss mask and logprobs are, token for
token, what the demo model recorded it generated; the policy version is the one the model server named.
Then a harness loop that compacts its history, inserts a system reminder or re-renders an earlier turn,
through the same proxy and store: one fork each, with its cause."""

from __future__ import annotations

import json
import urllib.request

import pytest

from experience.models import Trajectory
from experience.services.rl_samples import run_samples, sample_data
from tests.integration.test_harness_presets import bundle_backend, harness_fleet, require_bundle  # noqa: F401
from tests.webapp.proxy.rollouts import running_rollout
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.proxy.server import serve_in_thread
from webapp.proxy.wiring import make_trove_proxy_app
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.demo.model import make_app as make_demo_app
from workers.harness import presets
from workers.rollout_runner import rollout_run

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "trove-demo-stand-in"
WEIGHTS = "weights-step-42"


class RecordingDemoModel:
    """The demo model keeping its own record of what it generated for each chat call, naming its weights."""

    def __init__(self) -> None:
        self.generations: list[dict] = []
        self._server = serve_in_thread(make_demo_app(generations=self.generations, weight_version=WEIGHTS),
                                       host="127.0.0.1", port=0, shutdown_timeout=0.5)
        self.url = f"{self._server.base_url}/v1"

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def recording_model():
    model = RecordingDemoModel()
    yield model
    model.stop()


def capturing_endpoint(model: RecordingDemoModel, *, model_names: tuple[str, ...] = (MODEL,), **fields):
    return make_endpoint(model.url, model_names=list(model_names), token_capture="vllm",
                         policy_version_from="header:X-Weight-Version", **fields)


def assert_one_exact_sample_of_what_the_model_generated(trajectory: Trajectory, model: RecordingDemoModel) -> None:
    calls = trajectory.steps.filter(kind="model_call", is_error=False).count()
    assert calls == len(model.generations) >= 2, "every call the model served was recorded"
    assembly = run_samples(trajectory_ids=[trajectory.pk])[trajectory.pk]
    assert assembly.exact and assembly.forks == [] and len(assembly.samples) == 1, assembly.note
    sample = assembly.samples[0]
    generated = [token for call in model.generations for token in call["ids"]]
    logprobs = [logprob for call in model.generations for logprob in call["logprobs"]]
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == generated
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == logprobs
    assert all(lp is None for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m)
    # The whole sample is the last call's prompt and completion, as the model saw and made them.
    assert sample.token_ids == model.generations[-1]["prompt_ids"] + model.generations[-1]["ids"]
    assert len(sample.calls) == calls and sample_data(sample)["policy_version"] == WEIGHTS


def test_the_builtin_harness_gives_one_exact_sample_per_rollout(local_backend, proxy, recording_model, demo_task_set,
                                                               demo_fleet):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=capturing_endpoint(recording_model),
                     model_name=MODEL, enqueue=lambda rollout_id: None, task_keys=["slugify"], max_steps=15)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED), rollout.error
    assert_one_exact_sample_of_what_the_model_generated(rollout.trajectory, recording_model)


def test_the_mini_swe_agent_preset_gives_one_exact_sample_per_rollout(
    bundle_backend, unix_proxy, recording_model, demo_task_set, harness_fleet  # noqa: F811
):
    require_bundle("mini-swe-agent")
    job = job_create(task_set=demo_task_set, fleet=harness_fleet, endpoint=capturing_endpoint(recording_model),
                     model_name=MODEL, enqueue=lambda rollout_id: None, harness=presets.canonical("mini-swe-agent"),
                     task_keys=["slugify"], max_steps=20, wall_time_s=150)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED), rollout.error
    assert_one_exact_sample_of_what_the_model_generated(rollout.trajectory, recording_model)


# --- a harness that edits its history ---------------------------------------------------------------------


def call_model(proxy_url: str, token: str, messages: list[dict]) -> dict:
    body = {"model": MODEL, "messages": messages, "tools": [{"type": "function", "function": {
        "name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]}
    request = urllib.request.Request(f"{proxy_url}/r/{token}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert "token_ids" not in answer["choices"][0] and "prompt_token_ids" not in answer, "the harness sees no ids"
    return answer["choices"][0]["message"]


def compacted(turn: int, messages: list[dict]) -> list[dict]:
    return [messages[0], {"role": "user", "content": "Summary of earlier turns: the agent listed the files."}] \
        if turn == 3 else messages


def reminded(turn: int, messages: list[dict]) -> list[dict]:
    reminder = {"role": "system", "content": "<system-reminder>3 steps left</system-reminder>"}
    return [*messages[:2], reminder, *messages[2:]] if turn == 2 else messages


def rerendered(turn: int, messages: list[dict]) -> list[dict]:
    if turn != 3:
        return messages
    first_reply = {**messages[2], "content": (messages[2].get("content") or "") + " (as I said)"}
    return [*messages[:2], first_reply, *messages[3:]]


@pytest.fixture
def edited_runs(settings, tmp_path, recording_model):
    """Runs of a scripted harness loop through the Trove-wired proxy (writing straight to the store), each
    call's history edited by `edit(turn, messages)` first; returns a run's assembly."""
    settings.REDIS_URL = None
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    app, sink = make_trove_proxy_app()
    server = serve_in_thread(app, shutdown_timeout=0.5)

    def run(edit, turns: int = 5):
        # running_rollout's job names the model "scripted-ok": the demo model serves any name.
        rollout = running_rollout(endpoint=capturing_endpoint(recording_model, model_names=("scripted-ok",)))
        messages = [{"role": "system", "content": "You are a careful software agent."},
                    {"role": "user", "content": "Fix the slugify function in textutil/slug.py."}]
        for turn in range(turns):
            messages = edit(turn, messages)
            reply = call_model(server.base_url, rollout.proxy_token, messages)
            messages = [*messages, reply]
            for call in reply.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"output of turn {turn}"})
            if not reply.get("tool_calls"):
                messages.append({"role": "user", "content": "Go on."})
        sink.flush(10)
        assert Trajectory.objects.get(pk=rollout.trajectory_id).steps.filter(kind="model_call").count() == turns
        return run_samples(trajectory_ids=[rollout.trajectory_id])[rollout.trajectory_id]

    yield run
    server.stop()
    sink.close(10)


@pytest.mark.parametrize(("edit", "cause", "seq_turn"), [
    (compacted, "compaction", 3), (reminded, "system_reminder", 2), (rerendered, "rerendered_turn", 3),
], ids=["compaction", "reminder", "rerender"])
def test_a_harness_that_edits_its_history_forks_once_with_the_cause(edited_runs, edit, cause, seq_turn):
    assembly = edited_runs(edit)

    assert assembly.exact and len(assembly.samples) == 2, [f.to_dict() for f in assembly.forks]
    [fork] = assembly.forks
    assert fork.cause == cause
    assert assembly.samples[1].calls[0] == fork.seq == assembly.samples[0].calls[-1] + 1
    assert len(assembly.samples[0].calls) == seq_turn and fork.token_index is not None


def test_a_harness_that_only_appends_to_its_history_is_one_sample(edited_runs):
    assembly = edited_runs(lambda turn, messages: messages)
    assert assembly.exact and len(assembly.samples) == 1 and assembly.forks == []
