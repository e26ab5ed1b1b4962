"""A stream whose last bytes and end reach the proxy together is sent on with its end in one write.

Each write the proxy makes is a wake-up of the harness (and, on a busy machine, a wait for a core), so the
upstream's last bytes and the end of the chunked body go out together when they came together. The
guarantees stay: the harness gets the upstream's bytes (the key cut out, the capture's fields stripped),
and the record is whole. The upstream here is a raw socket server that sends its whole answer, headers,
body and chunked end, in one `sendall`, so the proxy reads them in one go.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import http_writer, web

from tests.webapp.proxy.harness import UPSTREAM_KEY, new_call_id, send
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread


def _sse(payload: dict[str, Any] | str) -> bytes:
    return b"data: " + (payload if isinstance(payload, str) else json.dumps(payload)).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-end", "object": "chat.completion.chunk", "created": 1700000002, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None, **extra}]}


# The upstream quotes its key in the last event, and carries token ids and logprobs (what a capture strips).
STREAM = (
    _sse({**_chunk({"role": "assistant", "content": "ls"}, token_ids=[7],
                   logprobs={"content": [{"token": "ls", "logprob": -0.5}]}), "prompt_token_ids": [1, 2]})
    + _sse(_chunk({"content": f" (you sent {UPSTREAM_KEY})"}, token_ids=[8]))
    + _sse({**_chunk({}, finish_reason="stop"), "usage": {"prompt_tokens": 2, "completion_tokens": 2,
                                                           "total_tokens": 4}})
    + _sse("[DONE]")
)


def _whole_answer_in_one_send() -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + f"{len(STREAM):x}\r\n".encode() + STREAM + b"\r\n0\r\n\r\n"


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)
    return body


@pytest.fixture(scope="module")
def one_send_upstream() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                _read_request(conn)
                conn.sendall(_whole_answer_in_one_send())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    listener.close()


@pytest.fixture(scope="module")
def proxy(one_send_upstream: str) -> Iterator[tuple[str, InProcessSink, list[CallRecord]]]:
    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)
    targets = {
        "tok-plain": Target("r-1", "t-1", one_send_upstream, UPSTREAM_KEY, allow_private_network=True),
        "tok-capture": Target("r-2", "t-2", one_send_upstream, UPSTREAM_KEY, allow_private_network=True,
                              token_capture="vllm"),
    }

    async def resolve(token: str) -> Target | None:
        return targets.get(token)

    server = serve_in_thread(make_proxy_app(resolve=resolve, sink=sink), shutdown_timeout=0.5)
    yield server.base_url, sink, records
    server.stop()
    sink.close()


@pytest.fixture
def proxy_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes]]:
    """What the proxy's handlers hand to their responses' write and write_eof (the upstream here is no
    aiohttp server, so every call is the proxy's)."""
    writes: list[tuple[str, bytes]] = []
    original_write, original_write_eof = web.StreamResponse.write, web.StreamResponse.write_eof

    async def write(self: web.StreamResponse, data: bytes) -> None:
        writes.append(("write", bytes(data)))
        await original_write(self, data)

    async def write_eof(self: web.StreamResponse, data: bytes = b"") -> None:
        if not self._eof_sent:
            writes.append(("write_eof", bytes(data)))
        await original_write_eof(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", write)
    monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
    return writes


@pytest.fixture
def sends_to_harness(proxy, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the proxy hands its transports towards the harness, one item per transport write (its sockets
    to the upstream and the test's client are told apart by the local port: the proxy's own)."""
    port = int(proxy[0].rsplit(":", 1)[1])
    sends: list[bytes] = []
    original_write, original_writelines = http_writer.StreamWriter._write, http_writer.StreamWriter._writelines

    def towards_harness(writer: http_writer.StreamWriter) -> bool:
        return writer.transport is not None and writer.transport.get_extra_info("sockname")[1] == port

    def write(self: http_writer.StreamWriter, chunk: bytes) -> None:
        if towards_harness(self):
            sends.append(bytes(chunk))
        original_write(self, chunk)

    def writelines(self: http_writer.StreamWriter, chunks: Any) -> None:
        chunks = list(chunks)
        if towards_harness(self):
            sends.append(b"".join(chunks))
        original_writelines(self, chunks)

    monkeypatch.setattr(http_writer.StreamWriter, "_write", write)
    monkeypatch.setattr(http_writer.StreamWriter, "_writelines", writelines)
    return sends


def _record(sink: InProcessSink, records: list[CallRecord], call_id: str) -> CallRecord:
    sink.flush(5.0)
    [record] = [record for record in records if record.call_id == call_id]
    return record


def test_the_last_bytes_go_out_with_the_end_in_one_write_and_the_record_is_whole(proxy, proxy_writes):
    base_url, sink, records = proxy
    call_id = new_call_id()

    reply = send(f"{base_url}/r/tok-plain/v1/chat/completions", call_id=call_id,
                 body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})

    expected = STREAM.replace(UPSTREAM_KEY.encode(), b"[redacted]")
    assert reply.status == 200 and not reply.broken and reply.body == expected
    assert proxy_writes == [("write_eof", expected)]  # one write: the bytes with the end of the body
    record = _record(sink, records, call_id)
    assert record.stream and not record.is_error
    assert record.ttft_ms is not None and 0 < record.ttft_ms <= record.latency_ms
    choice = record.response["choices"][0]
    assert choice["message"]["content"] == "ls (you sent [redacted])" and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == [7, 8] and record.usage["total_tokens"] == 4
    assert UPSTREAM_KEY not in json.dumps(record.raw) and record.raw["response"] == expected.decode()


def test_a_captured_stream_ending_in_one_read_is_stripped_for_the_harness_and_kept_in_the_record(proxy, proxy_writes):
    base_url, sink, records = proxy
    call_id = new_call_id()

    reply = send(f"{base_url}/r/tok-capture/v1/chat/completions", call_id=call_id,
                 body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})

    assert reply.status == 200 and not reply.broken
    assert [kind for kind, _ in proxy_writes] == ["write_eof"]
    events = [json.loads(line[6:]) for line in reply.body.split(b"\n\n") if line.startswith(b"data: {")]
    assert len(events) == 3 and reply.body.endswith(b"data: [DONE]\n\n")
    assert all("prompt_token_ids" not in event for event in events)
    assert all("token_ids" not in choice and choice.get("logprobs") is None
               for event in events for choice in event["choices"])
    assert "logprobs" in events[0]["choices"][0]  # set back to null, as a server that was not asked sends it
    assert b"[redacted]" in reply.body and UPSTREAM_KEY.encode() not in reply.body
    record = _record(sink, records, call_id)
    choice = record.response["choices"][0]
    assert choice["token_ids"] == [7, 8] and record.response["prompt_token_ids"] == [1, 2]
    assert choice["logprobs"] == {"content": [{"token": "ls", "logprob": -0.5}]}
    assert record.token_capture == "vllm" and not record.is_error


def test_a_stream_that_came_whole_with_its_headers_reaches_the_harness_in_one_send(proxy, sends_to_harness):
    base_url, sink, records = proxy
    call_id = new_call_id()

    reply = send(f"{base_url}/r/tok-plain/v1/chat/completions", call_id=call_id,
                 body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})

    expected = STREAM.replace(UPSTREAM_KEY.encode(), b"[redacted]")
    assert reply.status == 200 and reply.body == expected
    [sent] = sends_to_harness  # headers, body and the chunked end together
    assert sent.startswith(b"HTTP/1.1 200") and sent.endswith(expected + b"\r\n0\r\n\r\n")
    assert reply.headers["Content-Type"] == "text/event-stream"
    assert not _record(sink, records, call_id).is_error
