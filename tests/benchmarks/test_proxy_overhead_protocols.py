"""benchmarks/proxy_overhead.py speaks each protocol it measures: its mock upstream's answers (plain and
streamed) are what Trove's own protocol modules read as the benchmark's fixed answer, and a run of it
through Trove's proxy (the counting sink: no database) records every call it sends, in that protocol."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import proxy_overhead  # noqa: E402

from webapp.proxy.protocols import PROTOCOLS  # noqa: E402

ANSWERS = {
    "chat": (proxy_overhead.PLAIN_BODY, proxy_overhead._stream_events()),
    "responses": (json.dumps(proxy_overhead._responses_answer()).encode(), proxy_overhead._responses_events()),
    "messages": (json.dumps(proxy_overhead.MESSAGES_ANSWER).encode(), proxy_overhead._messages_events()),
}


def answer_text(protocol: str, body: dict) -> str:
    chat = body if protocol == "chat" else PROTOCOLS[protocol].to_chat_response(body)
    return chat["choices"][0]["message"]["content"]


@pytest.mark.parametrize("protocol", sorted(proxy_overhead.PROTOCOL_PATHS))
def test_the_mock_upstream_answers_each_protocol_the_way_its_clients_read_it(protocol: str):
    plain, events = ANSWERS[protocol]
    module = PROTOCOLS[protocol]

    assembled = module.assemble(events)

    assert answer_text(protocol, json.loads(plain)) == proxy_overhead.ANSWER_TEXT
    assert assembled.error is None and answer_text(protocol, assembled.body) == proxy_overhead.ANSWER_TEXT
    assert set(proxy_overhead.REQUESTS[protocol]) >= {"model"}
    if protocol != "chat":  # the same conversation as the chat request, in this protocol
        messages = module.to_chat_request(proxy_overhead.REQUESTS[protocol])["messages"]
        assert [m["role"] for m in messages] == [m["role"] for m in proxy_overhead.REQUEST["messages"]]


@pytest.mark.parametrize("protocol", ["responses", "messages"])
def test_a_run_through_trove_records_every_call_of_the_protocol(protocol: str):
    keys = proxy_overhead.orchestrate(100, "count", True, 1, protocol=protocol, stream=True)

    assert keys["protocol"] == protocol and keys["stream"] is True
    assert keys["recorded_fraction"] == 1.0 and keys["failed_calls"] == {"direct": 0, "trove": 0}
    assert keys["trove_p50_ms"] is not None and keys["trove_rps"] and keys["trove_cpu_ms_per_call"] > 0
