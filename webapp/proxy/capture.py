"""Token capture: ask a vLLM or SGLang server for token-level data, and keep it from the harness.

An endpoint registered with `token_capture` makes the proxy add, to each Chat Completions request it sends
upstream, the fields its kind of server reads for prompt and completion token ids and the completion's
logprobs. The record keeps what came back (`webapp/proxy/records.py` puts it in the step's payload, where
`experience.distill.rl_samples` reads it). The harness gets the answer without those fields unless its own
request asked for them, whole or streamed: a harness that never asked for logprobs must not start parsing
them, and the answer it gets stays the one the server would have given it.

Fields (vLLM's OpenAI-compatible server, `ChatCompletionRequest` extra parameters; SGLang's
`sglang/srt/entrypoints/openai/protocol.py`):
- vLLM: `logprobs: true` and `return_token_ids: true`; the answer carries top-level `prompt_token_ids` and
  per choice `token_ids` and `logprobs.content` (streamed: `prompt_token_ids` in the first chunk, each
  chunk's `token_ids` and `logprobs` for its delta).
- SGLang: `logprobs: true`, `return_prompt_token_ids: true` and `return_token_ids: true`; the answer
  carries per choice `prompt_token_ids`, `token_ids` and `logprobs.content`, and `metadata.weight_version`.

The policy version is read from where the endpoint says (`policy_version_from`): `header:NAME` (a response
header) or `body:a.b` (a field of the answer's JSON, e.g. SGLang's `body:metadata.weight_version`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webapp.proxy import jsonfast

OFF = "off"
# What each mode adds to the request, and the answer fields each request field turns on.
REQUEST_FIELDS: dict[str, dict[str, Any]] = {
    "vllm": {"logprobs": True, "return_token_ids": True},
    "sglang": {"logprobs": True, "return_prompt_token_ids": True, "return_token_ids": True},
}
_ANSWER_FIELDS = {
    "logprobs": ("logprobs",),
    "return_token_ids": ("token_ids", "prompt_token_ids"),  # vLLM's switch gives both
    "return_prompt_token_ids": ("prompt_token_ids",),
}
MAX_POLICY_VERSION = 200


@dataclass(frozen=True)
class Capture:
    """One call's capture: the fields added upstream and the answer fields the harness does not get."""

    mode: str
    added: Mapping[str, Any]
    hidden: frozenset[str]

    @property
    def strips(self) -> bool:
        return bool(self.hidden)


def capture_request(body: dict[str, Any], mode: str) -> tuple[dict[str, Any], Capture | None]:
    """The request to send upstream (a new dict; `body` is left as the harness sent it) and the capture,
    or (body, None) when the mode is off. A field the harness set truthy itself is left as it set it, and
    what it turns on stays in the answer the harness gets."""
    fields = REQUEST_FIELDS.get(mode)
    if not fields:
        return body, None
    added = {name: value for name, value in fields.items() if not body.get(name)}
    asked = {answer for name in fields if body.get(name) for answer in _ANSWER_FIELDS[name]}
    hidden = frozenset(answer for name in added for answer in _ANSWER_FIELDS[name]) - asked
    return {**body, **added}, Capture(mode=mode, added=added, hidden=hidden)


def strip_answer(data: bytes, hidden: frozenset[str]) -> bytes:
    """A whole chat answer without the hidden fields (the bytes unchanged when it is not a JSON object
    or carries none of them)."""
    try:
        answer = jsonfast.loads(data)
    except ValueError:
        return data
    if not isinstance(answer, dict) or not strip_fields(answer, hidden):
        return data
    return jsonfast.dumps(answer)


def strip_fields(answer: dict[str, Any], hidden: frozenset[str]) -> bool:
    """Remove the hidden fields from a chat answer or stream chunk in place (top level and per choice);
    True when any was there."""
    found = False
    for holder in (answer, *[c for c in answer.get("choices") or () if isinstance(c, dict)]):
        for name in hidden:
            if name in holder:
                found = True
                if name == "logprobs" and holder is not answer:
                    holder[name] = None  # the key stays, as a server that was not asked sends it
                else:
                    del holder[name]
    return found


class StreamStripper:
    """Rewrites a chat SSE stream's events without the hidden fields, as the bytes arrive. Whole events
    (up to a blank line) are rewritten; the tail of a chunk that ends inside an event is held for the next,
    so the harness gets each event once and whole, in order. Lines that are not `data: {json}` pass as
    they are (comments, `event:`, `[DONE]`)."""

    def __init__(self, hidden: frozenset[str]) -> None:
        self._hidden = hidden
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        end = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if end < 0:
            self._held = data
            return b""
        cut = end + (4 if data[end:end + 4] == b"\r\n\r\n" else 2)
        self._held = data[cut:]
        return b"".join(self._line(line) for line in data[:cut].splitlines(keepends=True))

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return b"".join(self._line(line) for line in held.splitlines(keepends=True))

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return line
        body = line[5:].strip()
        if not body.startswith(b"{"):
            return line
        try:
            event = jsonfast.loads(body)
        except ValueError:
            return line
        if not isinstance(event, dict) or not strip_fields(event, self._hidden):
            return line
        ending = line[len(line.rstrip(b"\r\n")):]
        return b"data: " + jsonfast.dumps(event) + ending


def policy_version(source: str, *, headers: Mapping[str, str], answer: dict[str, Any] | None) -> str | None:
    """The policy version the server gave for a call, from where `source` says; None when it gave none."""
    kind, _, name = source.partition(":")
    value: Any = None
    if kind == "header":
        value = headers.get(name)
    elif kind == "body" and isinstance(answer, dict):
        value = answer
        for key in name.split("."):
            value = value.get(key) if isinstance(value, dict) else None
    if value is None or isinstance(value, dict | list) or value == "":
        return None
    return str(value)[:MAX_POLICY_VERSION]
