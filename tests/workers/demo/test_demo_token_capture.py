"""The demo registers its model endpoint with the token capture the demo model answers, so a demo job's
rollouts are exact RL samples; and the harness, which never asked for token ids or logprobs, gets answers
without them. A relay between the built-in harness and the proxy keeps the bytes the harness received."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from experience.services.rl_samples import run_samples
from webapp.proxy.server import serve_in_thread
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.demo.model import TOKEN_CAPTURE
from workers.rollout_runner import rollout_run
from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN_FIELDS = ("token_ids", "prompt_token_ids")


def relay_app(target: str, answers: list[dict]) -> web.Application:
    """Forwards every request to `target` unchanged and keeps each JSON answer it passes back."""

    async def forward(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as session, session.request(
                request.method, target + request.path_qs, data=await request.read(),
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")}) as upstream:
            body = await upstream.read()
            if upstream.content_type == "application/json":
                answers.append(json.loads(body))
            return web.Response(body=body, status=upstream.status, content_type=upstream.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@pytest.fixture
def harness_view(proxy, settings):
    """The answers the harness gets: the harness reaches the proxy through a relay that records them."""
    answers: list[dict] = []
    relay = serve_in_thread(relay_app(proxy.base_url, answers), host="127.0.0.1", port=0, shutdown_timeout=0.5)
    settings.TROVE_PROXY_PUBLIC_URL = relay.base_url
    yield answers
    relay.stop()


def test_the_demo_endpoint_asks_for_token_ids_and_an_external_one_does_not(demo_model_url):
    assert seed_demo_endpoint(demo_model_url).token_capture == TOKEN_CAPTURE == "vllm"
    external = seed_demo_endpoint("https://models.example.com/v1", name="demo-external", token_capture="off")
    assert external.token_capture == "off"


def test_a_demo_rollout_is_one_exact_sample_and_the_harness_sees_no_token_fields(
        local_backend, harness_view, demo_model_url, demo_task_set, demo_fleet):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name=DEMO_MODEL_NAME, enqueue=lambda rollout_id: None, task_keys=["slugify"],
                     max_steps=15)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED), rollout.error
    calls = list(rollout.trajectory.steps.filter(kind="model_call", is_error=False).values_list("payload", flat=True))
    assert len(calls) >= 2 and all(p["token_capture"] == "vllm" and p["token_ids"] and p["prompt_token_ids"]
                                   for p in calls), "the record keeps the ids the proxy asked for"
    assembly = run_samples(trajectory_ids=[rollout.trajectory_id])[rollout.trajectory_id]
    assert assembly.exact and len(assembly.samples) == 1 and assembly.forks == [], assembly.note

    chat_answers = [a for a in harness_view if "choices" in a]
    assert len(chat_answers) == len(calls)
    for answer in chat_answers:
        choice = answer["choices"][0]
        assert not any(name in answer or name in choice for name in TOKEN_FIELDS), answer
        assert choice.get("logprobs") is None, "logprobs stay out of an answer that did not ask for them"
        assert choice["message"]["content"] or choice["message"].get("tool_calls")
