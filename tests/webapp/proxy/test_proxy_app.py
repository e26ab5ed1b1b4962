"""The proxy end to end: a real client, the proxy served on loopback, a scripted upstream server."""

from __future__ import annotations

import json
import os
import re

from tests.webapp.proxy.harness import (
    BROKEN_STREAM_PART,
    MALFORMED_STREAM,
    OK_BODY,
    UPSTREAM_KEY,
    ProxyHarness,
    UpstreamState,
    new_call_id,
    read_first_chunk_and_hang_up,
    send,
    stream_events,
)
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread

MESSAGES = [
    {"role": "system", "content": "You are a careful engineer."},
    {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
]


def test_it_forwards_a_plain_call_unchanged_and_records_it(harness: ProxyHarness, upstream: UpstreamState):
    call_id = new_call_id()
    raw = json.dumps({"model": "scripted-ok", "messages": MESSAGES, "temperature": 0.2}).encode()

    reply = send(harness.url("tok-good"), raw=raw, call_id=call_id)

    assert reply.status == 200
    assert reply.json() == {**OK_BODY, "model": "scripted-ok"}
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.headers["X-Request-Id"] == "req-ok"
    forwarded = upstream.requests[-1]
    assert forwarded["raw"] == raw  # no re-serialisation when nothing is overridden
    assert forwarded["headers"]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    [record] = harness.records_for(call_id)
    assert (record.rollout_id, record.trajectory_id, record.status_code) == ("rollout-1", "traj-1", 200)
    assert record.request == json.loads(raw)
    assert record.response == reply.json()
    assert record.usage == OK_BODY["usage"]
    assert not record.is_error and not record.stream and record.ttft_ms is None
    assert record.latency_ms > 0 and record.ended_at >= record.started_at
    assert UPSTREAM_KEY.encode() not in record.to_json()


def test_a_plain_call_becomes_a_model_call_step(harness: ProxyHarness):
    call_id = new_call_id()
    send(harness.url("tok-good"), body={"model": "scripted-ok", "messages": MESSAGES}, call_id=call_id)

    step = harness.records_for(call_id)[0].to_step_record()

    assert step.kind == "model_call" and step.call_id == call_id
    assert [(m.role, m.content) for m in step.request_messages or []] == [
        ("system", "You are a careful engineer."),
        ("user", "List the files."),
    ]
    assert step.response_text == "ls -la"
    assert (step.tokens_in, step.tokens_out, step.model) == (12, 3, "scripted-ok")
    assert step.payload["finish_reason"] == "stop" and step.payload["trajectory_id"] == "traj-1"


def test_it_passes_a_stream_through_byte_for_byte_and_records_the_assembled_answer(harness: ProxyHarness):
    call_id = new_call_id()
    body = {"model": "scripted-stream", "messages": MESSAGES, "stream": True}

    reply = send(harness.url("tok-good"), body=body, call_id=call_id)

    assert reply.status == 200 and not reply.broken
    assert reply.headers["Content-Type"] == "text/event-stream"
    assert reply.body == b"".join(stream_events())
    [record] = harness.records_for(call_id)
    assert record.stream and not record.is_error
    assert record.ttft_ms is not None and record.ttft_ms <= record.latency_ms
    choice = record.response["choices"][0]
    assert choice["message"]["content"] == "Caf\u00e9 time"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"cmd": "pytest -q"}'},
        }
    ]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["logprobs"] == {
        "content": [{"token": "Caf", "logprob": -0.1}, {"token": "time", "logprob": -0.2}]
    }
    assert choice["token_ids"] == [101, 102, 103]
    assert record.usage == {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    assert record.to_step_record().tool_calls == choice["message"]["tool_calls"]


def test_an_unknown_token_gets_401_and_nothing_is_recorded(harness: ProxyHarness, upstream: UpstreamState):
    rejected_id = new_call_id()
    upstream_calls_before = len(upstream.requests)

    reply = send(
        harness.url("tok-nobody"), body={"model": "scripted-ok", "messages": MESSAGES}, call_id=rejected_id
    )
    # A later call's record proves the sink has caught up with everything before it.
    later_id = new_call_id()
    send(harness.url("tok-good"), body={"model": "scripted-ok", "messages": MESSAGES}, call_id=later_id)
    harness.records_for(later_id)

    assert reply.status == 401
    assert reply.json()["error"]["code"] == "invalid_token"
    assert harness.records_for(rejected_id, timeout=0) == []
    assert len(upstream.requests) == upstream_calls_before + 1


def test_an_upstream_500_is_passed_through_and_recorded_as_an_error(harness: ProxyHarness):
    call_id = new_call_id()

    reply = send(
        harness.url("tok-good"), body={"model": "scripted-500", "messages": MESSAGES}, call_id=call_id
    )

    assert reply.status == 500
    assert reply.json()["error"]["message"] == "the model fell over"
    [record] = harness.records_for(call_id)
    assert record.is_error and record.status_code == 500 and record.error_kind == "upstream_status"
    assert "the model fell over" in (record.error or "")
    assert record.response == reply.json()
    assert record.to_step_record().is_error


def test_a_silent_upstream_gets_504_after_the_timeout_and_is_recorded(harness: ProxyHarness):
    call_id = new_call_id()

    reply = send(
        harness.url("tok-good"), body={"model": "scripted-hang", "messages": MESSAGES}, call_id=call_id
    )

    assert reply.status == 504
    assert reply.json()["error"]["code"] == "upstream_timeout"
    [record] = harness.records_for(call_id)
    assert record.is_error and record.status_code == 504 and record.error_kind == "upstream_timeout"
    assert record.response == reply.json()


def test_an_unreachable_upstream_gets_502_and_is_recorded(harness: ProxyHarness):
    call_id = new_call_id()

    reply = send(harness.url("tok-unreachable"), body={"model": "x", "messages": MESSAGES}, call_id=call_id)

    assert reply.status == 502
    assert reply.json()["error"]["code"] == "upstream_connect"
    [record] = harness.records_for(call_id)
    assert record.is_error and record.error_kind == "upstream_connect" and record.rollout_id == "rollout-3"
    assert UPSTREAM_KEY not in (record.error or "")


def test_a_stream_broken_mid_way_is_passed_on_as_far_as_it_came_and_recorded(harness: ProxyHarness):
    call_id = new_call_id()
    body = {"model": "scripted-broken", "messages": MESSAGES, "stream": True}

    reply = send(harness.url("tok-good"), body=body, call_id=call_id)

    assert reply.status == 200
    assert reply.broken  # the client sees the break, as it would have from the upstream itself
    assert reply.body == BROKEN_STREAM_PART
    [record] = harness.records_for(call_id)
    assert record.is_error and record.error_kind == "stream_broken"
    assert record.response["choices"][0]["message"]["content"] == "half an"


def test_a_malformed_data_line_is_passed_through_and_recorded_as_an_error(harness: ProxyHarness):
    call_id = new_call_id()
    body = {"model": "scripted-malformed", "messages": MESSAGES, "stream": True}

    reply = send(harness.url("tok-good"), body=body, call_id=call_id)

    assert reply.status == 200 and not reply.broken
    assert reply.body == MALFORMED_STREAM
    [record] = harness.records_for(call_id)
    assert record.is_error and record.error_kind == "malformed_stream"
    assert "this is not json" in (record.error or "")
    assert record.response["choices"][0]["message"]["content"] == "before after"


def test_a_client_hanging_up_mid_stream_is_recorded_with_what_it_had_received(harness: ProxyHarness):
    call_id = new_call_id()
    body = {"model": "scripted-slow-stream", "messages": MESSAGES, "stream": True}

    first = read_first_chunk_and_hang_up(harness.url("tok-good"), body=body, call_id=call_id)

    [record] = harness.records_for(call_id)
    assert first.startswith(b"data: ")
    assert record.is_error and record.error_kind == "client_disconnected"
    content = record.response["choices"][0]["message"]["content"]
    assert content.startswith("word0 ") and len(content.split()) < 100


def test_the_model_override_replaces_the_requested_model(harness: ProxyHarness, upstream: UpstreamState):
    call_id = new_call_id()

    reply = send(
        harness.url("tok-override"), body={"model": "whatever", "messages": MESSAGES}, call_id=call_id
    )

    assert reply.status == 200
    assert upstream.requests[-1]["body"]["model"] == "served-model"
    [record] = harness.records_for(call_id)
    assert record.request["model"] == "served-model" and record.rollout_id == "rollout-2"


def test_a_body_that_is_not_json_gets_400_and_is_recorded(harness: ProxyHarness, upstream: UpstreamState):
    call_id = new_call_id()
    upstream_calls_before = len(upstream.requests)

    reply = send(harness.url("tok-good"), raw=b"{not json", call_id=call_id)

    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_request"
    [record] = harness.records_for(call_id)
    assert record.is_error and record.error_kind == "invalid_request"
    assert len(upstream.requests) == upstream_calls_before


def test_without_a_call_id_header_each_call_gets_a_fresh_one(harness: ProxyHarness):
    before = len(harness.records)
    body = {"model": "scripted-ok", "messages": MESSAGES}

    send(harness.url("tok-good"), body=body)
    send(harness.url("tok-good"), body=body)
    marker = new_call_id()
    send(harness.url("tok-good"), body=body, call_id=marker)
    harness.records_for(marker)

    fresh = [record.call_id for record in harness.records[before:] if record.call_id != marker]
    assert len(fresh) == 2 and len(set(fresh)) == 2
    assert all(re.fullmatch(r"[0-9a-f]{20}-[0-9a-f]+", call_id) for call_id in fresh)


def test_a_forked_process_makes_call_ids_of_its_own():
    from webapp.proxy.app import _call_ids

    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child: one id to the parent, then out without running pytest's exit handlers
        os.write(writer, _call_ids.next().encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    from_child = os.read(reader, 200).decode()
    os.close(reader)

    assert from_child.split("-")[0] != _call_ids.next().split("-")[0]


def test_a_retried_call_id_is_recorded_again_under_the_same_id(harness: ProxyHarness):
    # The contract: the proxy records every call it forwards; the writer keeps the first record of a
    # call id and ignores the rest, so a client retry that reuses its X-Trove-Call-Id is stored once.
    call_id = new_call_id()
    body = {"model": "scripted-ok", "messages": MESSAGES}

    send(harness.url("tok-good"), body=body, call_id=call_id)
    send(harness.url("tok-good"), body=body, call_id=call_id)

    assert [record.call_id for record in harness.records_for(call_id, count=2)] == [call_id, call_id]


def test_an_invalid_call_id_header_is_refused(harness: ProxyHarness):
    reply = send(harness.url("tok-good"), body={"model": "scripted-ok", "messages": MESSAGES}, call_id="a b")

    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_call_id"


def test_the_models_list_is_passed_through(harness: ProxyHarness, upstream: UpstreamState):
    reply = send(harness.url("tok-good", "v1/models"), method="GET")

    assert reply.status == 200
    assert reply.json()["data"][0]["id"] == "scripted-ok"
    assert upstream.requests[-1]["headers"]["Authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_the_models_list_needs_a_known_token(harness: ProxyHarness):
    reply = send(harness.url("tok-nobody", "v1/models"), method="GET")

    assert reply.status == 401
    assert reply.json()["error"]["type"] == "authentication_error"


def test_healthz_answers_ok(harness: ProxyHarness):
    reply = send(f"{harness.server.base_url}/healthz", method="GET")

    assert reply.status == 200 and reply.json() == {"status": "ok"}


def test_the_target_repr_hides_the_upstream_key():
    target = Target("r", "t", "http://upstream/v1", UPSTREAM_KEY)

    assert UPSTREAM_KEY not in repr(target)


def test_a_token_that_cannot_be_checked_gets_503_not_401():
    async def database_down(token: str):
        raise ConnectionError("the database is restarting")

    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)
    server = serve_in_thread(make_proxy_app(resolve=database_down, sink=sink), shutdown_timeout=0.5)
    try:
        reply = send(f"{server.base_url}/r/any-token/v1/chat/completions",
                     body={"model": "scripted-ok", "messages": MESSAGES})
    finally:
        server.stop()
        sink.close(5)

    assert reply.status == 503 and reply.json()["error"]["code"] == "token_check_unavailable"
    assert records == []
