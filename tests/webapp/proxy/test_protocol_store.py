"""A call in each protocol, through the real proxy to the demo model, crosses the queue as JSON and is
stored in Postgres as one normalised model_call step, with the raw exchange in its response blob: what the
replay page and datasets read knows no protocol."""

from __future__ import annotations

import json

import pytest

from experience.models import Step
from experience.services.stored import stored_step_records
from tests.webapp.proxy.protocol_harness import ProtocolProxy, new_call_id, post
from tests.webapp.proxy.rollouts import running_rollout
from tests.webapp.proxy.test_protocol_translation import BODIES, CLAUDE_HEADERS
from webapp.proxy.records import CallRecord
from webapp.proxy.writer import write_call_records

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_spool(settings, tmp_path):
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"


@pytest.mark.parametrize(("client", "endpoint"), [("responses", "responses"), ("messages", "chat"),
                                                  ("gemini", "gemini"), ("chat", "messages")])
def test_a_call_of_any_protocol_is_stored_as_one_normalised_model_call_step(
    protocol_proxy: ProtocolProxy, client: str, endpoint: str
):
    trajectory_id = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    call_id = new_call_id()
    stream = client != "gemini"
    reply = post(protocol_proxy.url(client, endpoint, stream=not stream), BODIES[client](1), call_id=call_id,
                 headers=CLAUDE_HEADERS if client == "messages" else None)
    assert reply.status == 200
    record = CallRecord.from_json(protocol_proxy.record(call_id).to_json())  # as it crosses the queue
    record.trajectory_id = str(trajectory_id)

    assert write_call_records([record]).stored == 1

    [step] = stored_step_records(list(Step.objects.filter(trajectory_id=trajectory_id, kind="model_call")))
    assert step.call_id == call_id and not step.is_error
    assert step.request_messages[0].role == "system"
    assert any(m.role == "tool" and m.tool_call_id for m in step.request_messages)
    assert step.tool_calls and json.loads(step.tool_calls[0]["function"]["arguments"])
    assert step.tokens_in and step.tokens_out and step.payload["reasoning"]
    assert step.response_json["choices"][0]["message"]["tool_calls"] == step.tool_calls
    raw = step.response_json["raw_exchange"]
    assert raw["protocol"] == client and raw["response"].encode() == reply.body
    assert json.loads(raw["request"]) == BODIES[client](1)
    if endpoint != client:
        assert step.payload["upstream_protocol"] == endpoint and raw["upstream"]["protocol"] == endpoint
