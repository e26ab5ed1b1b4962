"""Assembling a chat-completions stream into the equivalent non-stream body."""

from __future__ import annotations

import json

from webapp.proxy.sse import assemble_stream


def _event(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


def _delta(delta: dict, index: int = 0, **choice) -> dict:
    return {"id": "c1", "model": "m", "created": 5, "choices": [{"index": index, "delta": delta, **choice}]}


def test_it_reassembles_lines_and_characters_split_across_chunks():
    data = _event(_delta({"role": "assistant", "content": "na\u00efve"})) + b"data: [DONE]\n\n"
    cut = data.index("\u00ef".encode()) + 1  # inside the two-byte character
    chunks = [data[:10], data[10:cut], data[cut:]]

    assembled = assemble_stream(chunks, [1.0, 1.1, 1.2], started=1.0)

    assert assembled.body is not None
    assert assembled.body["choices"][0]["message"] == {"role": "assistant", "content": "na\u00efve"}
    assert assembled.body["id"] == "c1" and assembled.body["object"] == "chat.completion"
    assert assembled.done and assembled.error is None
    # The first content event was completed by the last chunk.
    assert assembled.ttft_ms is not None and abs(assembled.ttft_ms - 200.0) < 1e-6


def test_time_to_first_token_skips_a_role_only_first_chunk():
    chunks = [_event(_delta({"role": "assistant", "content": ""})), _event(_delta({"content": "hi"}))]

    assembled = assemble_stream(chunks, [10.0, 10.5], started=10.0)

    assert assembled.ttft_ms is not None and abs(assembled.ttft_ms - 500.0) < 1e-6


def test_tool_call_fragments_merge_by_index():
    chunks = [
        _event(
            _delta(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "a",
                            "type": "function",
                            "function": {"name": "bash", "arguments": ""},
                        }
                    ]
                }
            )
        ),
        _event(
            _delta(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "b",
                            "type": "function",
                            "function": {"name": "edit", "arguments": "{}"},
                        }
                    ]
                }
            )
        ),
        _event(_delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd":'}}]})),
        _event(_delta({"tool_calls": [{"index": 0, "function": {"name": "bash", "arguments": ' "ls"}'}}]})),
        _event(_delta({}, finish_reason="tool_calls")),
    ]

    body = assemble_stream(chunks, [0.0] * len(chunks), started=0.0).body

    assert body is not None
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
        {"id": "b", "type": "function", "function": {"name": "edit", "arguments": "{}"}},
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_logprobs_token_ids_and_usage_are_kept():
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunks = [
        _event({**_delta({"reasoning_content": "think "}), "prompt_token_ids": [1, 2, 3]}),
        _event(
            _delta({"content": "A"}, logprobs={"content": [{"token": "A", "logprob": -1.0}]}, token_ids=[7])
        ),
        _event(
            _delta({"content": "B"}, logprobs={"content": [{"token": "B", "logprob": -2.0}]}, token_ids=[8])
        ),
        _event({"id": "c1", "choices": [], "usage": usage}),
    ]

    body = assemble_stream(chunks, [0.0] * len(chunks), started=0.0).body

    assert body is not None
    choice = body["choices"][0]
    assert choice["message"]["reasoning_content"] == "think " and choice["message"]["content"] == "AB"
    assert choice["logprobs"] == {
        "content": [{"token": "A", "logprob": -1.0}, {"token": "B", "logprob": -2.0}]
    }
    assert choice["token_ids"] == [7, 8]
    assert body["prompt_token_ids"] == [1, 2, 3]
    assert body["usage"] == usage


def test_several_choices_are_assembled_separately():
    chunks = [_event(_delta({"content": "x"}, index=0)), _event(_delta({"content": "y"}, index=1))]

    body = assemble_stream(chunks, [0.0, 0.0], started=0.0).body

    assert body is not None
    assert [c["message"]["content"] for c in body["choices"]] == ["x", "y"]


def test_an_error_event_inside_the_stream_is_reported():
    chunks = [_event(_delta({"content": "par"})), _event({"error": {"message": "overloaded"}})]

    assembled = assemble_stream(chunks, [0.0, 0.0], started=0.0)

    assert assembled.error is not None and "overloaded" in assembled.error
    assert assembled.body is not None and assembled.body["choices"][0]["message"]["content"] == "par"


def test_an_event_left_unterminated_at_the_end_is_still_read():
    chunks = [b'data: {"choices": [{"index": 0, "delta": {"content": "tail"}}]}']

    assembled = assemble_stream(chunks, [0.0], started=0.0)

    assert assembled.body is not None and assembled.body["choices"][0]["message"]["content"] == "tail"
    assert not assembled.done


def test_a_stream_with_no_chunk_gives_no_body():
    assembled = assemble_stream([b": ping\n\n"], [0.0], started=0.0)

    assert assembled.body is None and assembled.ttft_ms is None and assembled.error is None
