"""Token capture: an endpoint with `token_capture` gets vLLM's or SGLang's token fields added to each call;
the record keeps prompt ids, completion ids, logprobs and the policy version; the harness gets the answer
without what it did not ask for, whole and streamed, passed through or translated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.webapp.proxy.protocol_harness import Scripted, make_scripted_app, new_call_id, post, sse_data
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.capture import StreamStripper, capture_request, policy_version
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread
from workers.demo.model import make_app as make_demo_app

KEY = "sk-capture-upstream-secret"
VERSION = "policy-step-7"


@dataclass
class CaptureProxy:
    base_url: str
    sink: InProcessSink
    records: list[CallRecord]
    generations: list[dict]
    scripted: Scripted

    def url(self, token: str, path: str = "v1/chat/completions") -> str:
        return f"{self.base_url}/r/{token}/{path}"

    def record(self, call_id: str) -> CallRecord:
        self.sink.flush(5)
        found = [r for r in self.records if r.call_id == call_id]
        assert len(found) == 1, f"{len(found)} records for {call_id}"
        return found[0]


@pytest.fixture(scope="module")
def capture_proxy() -> Iterator[CaptureProxy]:
    generations: list[dict] = []
    demo = serve_in_thread(make_demo_app(generations=generations, weight_version=VERSION), shutdown_timeout=0.5)
    scripted = Scripted()
    scripted_server = serve_in_thread(make_scripted_app(scripted), shutdown_timeout=0.5)

    def target(name: str, root: str, **fields) -> Target:
        return Target(f"rollout-{name}", f"traj-{name}", root + "/v1", KEY, endpoint=name, allow_private_network=True,
                      **fields)

    targets = {
        "vllm": target("vllm", demo.base_url, token_capture="vllm", policy_version_from="header:X-Weight-Version"),
        "sglang": target("sglang", demo.base_url, token_capture="sglang",
                         policy_version_from="body:metadata.weight_version"),
        "off": target("off", demo.base_url),
        "scripted-vllm": target("scripted-vllm", scripted_server.base_url, token_capture="vllm"),
        "scripted-off": target("scripted-off", scripted_server.base_url),
    }

    async def resolve(value: str) -> Target | None:
        return targets.get(value)

    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)
    proxy = serve_in_thread(make_proxy_app(resolve=resolve, sink=sink, upstream_timeout=2.0), shutdown_timeout=0.5)
    yield CaptureProxy(proxy.base_url, sink, records, generations, scripted)
    proxy.stop()
    sink.close()
    scripted_server.stop()
    demo.stop()


def chat_body(**extra) -> dict:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    return {"model": "stand-in", "messages": [{"role": "user", "content": "Fix the slugify function."}],
            "tools": tools, **extra}


def harness_choice(raw: bytes, stream: bool) -> tuple[dict, list[dict]]:
    """The answer's top level and its choices as the harness got them (a stream's chunks one by one)."""
    if not stream:
        answer = json.loads(raw)
        return answer, answer["choices"]
    chunks = sse_data(raw)
    return chunks[0], [choice for chunk in chunks for choice in chunk["choices"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_vllm_capture_records_ids_logprobs_and_version_and_the_harness_sees_none_of_them(capture_proxy, stream):
    call_id = new_call_id()
    before = len(capture_proxy.generations)
    reply = post(capture_proxy.url("vllm"), chat_body(stream=stream), call_id=call_id)

    assert reply.status == 200
    top, choices = harness_choice(reply.body, stream)
    assert "prompt_token_ids" not in top and "prompt_token_ids" not in reply.body.decode()
    assert all("token_ids" not in choice and choice.get("logprobs") is None for choice in choices)
    generated = capture_proxy.generations[before]
    payload = capture_proxy.record(call_id).to_step_record().payload
    assert payload["prompt_token_ids"] == generated["prompt_ids"]
    assert payload["token_ids"] == generated["ids"]
    assert [entry["logprob"] for entry in payload["logprobs"]] == generated["logprobs"]
    assert payload["policy_version"] == VERSION and payload["token_capture"] == "vllm"
    # The request recorded is the harness's own: the capture's fields are not in it.
    assert "return_token_ids" not in payload["params"] and "logprobs" not in payload["params"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_harness_that_asks_for_logprobs_itself_gets_them_and_still_not_the_token_ids(capture_proxy, stream):
    call_id = new_call_id()
    reply = post(capture_proxy.url("vllm"), chat_body(stream=stream, logprobs=True), call_id=call_id)

    top, choices = harness_choice(reply.body, stream)
    assert any(choice.get("logprobs") for choice in choices)
    assert "prompt_token_ids" not in top and all("token_ids" not in choice for choice in choices)
    assert capture_proxy.record(call_id).to_step_record().payload["token_ids"]


def test_a_harness_that_asks_for_token_ids_itself_gets_them(capture_proxy):
    reply = post(capture_proxy.url("vllm"), chat_body(return_token_ids=True))
    answer = reply.json()
    assert answer["prompt_token_ids"] and answer["choices"][0]["token_ids"]
    assert answer["choices"][0]["logprobs"] is None


def test_sglang_capture_reads_the_prompt_ids_from_the_choice_and_the_version_from_the_body(capture_proxy):
    call_id = new_call_id()
    before = len(capture_proxy.generations)
    reply = post(capture_proxy.url("sglang"), chat_body(), call_id=call_id)

    choice = reply.json()["choices"][0]
    assert "prompt_token_ids" not in choice and "token_ids" not in choice and choice["logprobs"] is None
    assert reply.json()["metadata"] == {"weight_version": VERSION}  # the server's own field, not the capture's
    payload = capture_proxy.record(call_id).to_step_record().payload
    assert payload["prompt_token_ids"] == capture_proxy.generations[before]["prompt_ids"]
    assert payload["token_ids"] == capture_proxy.generations[before]["ids"]
    assert payload["policy_version"] == VERSION and payload["token_capture"] == "sglang"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_translated_call_keeps_the_upstreams_ids_in_the_record_and_out_of_the_harnesss_answer(capture_proxy, stream):
    call_id = new_call_id()
    before = len(capture_proxy.generations)
    body = {"model": "stand-in", "input": "Fix the slugify function.", "stream": stream,
            "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]}
    reply = post(capture_proxy.url("vllm", "v1/responses"), body, call_id=call_id)

    assert reply.status == 200 and b"logprobs" not in reply.body and b"token_ids" not in reply.body
    payload = capture_proxy.record(call_id).to_step_record().payload
    assert payload["token_ids"] == capture_proxy.generations[before]["ids"]
    assert payload["prompt_token_ids"] == capture_proxy.generations[before]["prompt_ids"]
    assert payload["policy_version"] == VERSION


def test_the_upstream_gets_the_capture_fields_and_an_event_split_across_chunks_is_stripped_whole(capture_proxy):
    scripted = capture_proxy.scripted
    events = [{"id": "c", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"content": "Hello"},
                                                                   "token_ids": [7], "logprobs": {"content": [
                                                                       {"token": "Hello", "logprob": -0.5}]}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [8],
                                       "logprobs": {"content": [{"token": "!", "logprob": -0.1}]}}]}]
    raw = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    scripted.mode, scripted.content_type = "replay", "text/event-stream"
    scripted.chunks = [raw[:13], raw[13:70], raw[70:71], raw[71:]]  # boundaries inside events and lines
    call_id = new_call_id()
    try:
        reply = post(capture_proxy.url("scripted-vllm"), chat_body(stream=True), call_id=call_id)
        sent = json.loads(scripted.requests[-1]["raw"])
    finally:
        scripted.chunks, scripted.content_type = [], "application/json"

    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    got = sse_data(reply.body)
    assert [c["choices"][0]["delta"] for c in got] == [{"content": "Hello"}, {}]
    assert all("token_ids" not in c["choices"][0] and c["choices"][0]["logprobs"] is None for c in got)
    assert "prompt_token_ids" not in got[0] and reply.body.endswith(b"data: [DONE]\n\n")
    payload = capture_proxy.record(call_id).to_step_record().payload
    assert payload["prompt_token_ids"] == [1, 2] and payload["token_ids"] == [7, 8]
    assert [e["logprob"] for e in payload["logprobs"]] == [-0.5, -0.1]


def test_without_capture_the_request_goes_upstream_byte_for_byte(capture_proxy):
    scripted = capture_proxy.scripted
    scripted.body = json.dumps({"id": "c", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                "content": "hi"}}]}).encode()
    raw = json.dumps(chat_body()).encode()
    reply = post(capture_proxy.url("scripted-off"), raw=raw)
    assert reply.status == 200 and scripted.requests[-1]["raw"] == raw


def test_capture_request_leaves_the_harnesss_body_alone_and_hides_only_what_it_did_not_ask_for():
    body = {"messages": [], "logprobs": True}
    sent, capture = capture_request(body, "sglang")
    assert body == {"messages": [], "logprobs": True}
    assert sent == {"messages": [], "logprobs": True, "return_prompt_token_ids": True, "return_token_ids": True}
    assert capture.hidden == frozenset({"token_ids", "prompt_token_ids"})
    assert capture_request(body, "off") == (body, None)


def test_a_stream_stripper_passes_non_json_lines_and_a_tail_without_a_blank_line():
    stripper = StreamStripper(frozenset({"token_ids"}))
    out = stripper.feed(b": keep-alive\n\ndata: {\"choices\": [{\"token_ids\": [1], \"delta\": {}}]}")
    assert out == b": keep-alive\n\n"
    assert json.loads(stripper.end()[6:]) == {"choices": [{"delta": {}}]}


def test_a_policy_version_is_read_only_where_the_endpoint_says_and_never_as_a_structure():
    answer = {"metadata": {"weight_version": 12, "nested": {"a": 1}}}
    assert policy_version("body:metadata.weight_version", headers={}, answer=answer) == "12"
    assert policy_version("body:metadata.nested", headers={}, answer=answer) is None
    assert policy_version("body:metadata.missing.deeper", headers={}, answer=answer) is None
    assert policy_version("header:X-Weights", headers={"X-Weights": "v" * 500}, answer=None) == "v" * 200
    assert policy_version("header:X-Weights", headers={}, answer=answer) is None


def test_a_capture_field_the_harness_set_off_is_turned_on_upstream_and_hidden_from_it():
    sent, capture = capture_request({"messages": [], "logprobs": False, "return_token_ids": False}, "vllm")
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    assert capture.hidden == frozenset({"logprobs", "token_ids", "prompt_token_ids"})
