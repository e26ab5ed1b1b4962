"""The call record: what the recording proxy knows about one model call.

A `CallRecord` is plain data. It crosses a queue (Redis stream, spool file) as JSON and becomes an
`experience.records.StepRecord` at the writer. It never holds the upstream API key: the request recorded
is the body the client sent (with the model override applied), and the client never sees the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from experience.records import MessageRecord, StepRecord
from webapp.proxy import jsonfast

ERROR_KINDS = (
    "invalid_request",  # the client's body was not a JSON object
    "upstream_status",  # the upstream answered 4xx / 5xx (passed through as given)
    "upstream_timeout",  # no byte from the upstream within the timeout (504)
    "upstream_connect",  # the upstream could not be reached or dropped before answering (502)
    "stream_broken",  # the upstream dropped the connection mid-stream
    "malformed_stream",  # a `data:` line that is not JSON, or an error event inside the stream
    "malformed_body",  # a non-stream body that is not JSON
    "untranslatable",  # a field with no equivalent in the endpoint's protocol (named in the error)
    "client_disconnected",  # the client went away before the answer was delivered
    "proxy_error",  # the proxy itself failed or was shut down mid-call
)


@dataclass
class CallRecord:
    """One model call that went through the proxy.

    `call_id` is the idempotency key: the writer keeps the first record it sees for a call id and ignores
    later ones (a redelivered queue entry, a replayed spool segment, a client retry that reused its
    `X-Trove-Call-Id`). `request` and `response` are normalised to Chat Completions whatever the protocol
    (`protocol`: the client's; `upstream_protocol`: the endpoint's, different when the call was translated);
    for a stream, `response` is the equivalent non-stream body assembled from the chunks. `raw` keeps the
    bytes as they went (the client's request and answer, and the upstream's when translated) so the call
    can be replayed exactly; None for a whole chat pass-through, whose request and response are its bytes.
    """

    call_id: str
    rollout_id: str
    trajectory_id: str
    started_at: datetime
    ended_at: datetime
    latency_ms: float
    ttft_ms: float | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    status_code: int
    usage: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str | None = None
    stream: bool = False
    protocol: str = "chat"
    upstream_protocol: str = "chat"
    raw: dict[str, Any] | None = None
    # The endpoint's token capture mode when the proxy asked the server for token ids (webapp/proxy/
    # capture.py), and the policy version the server gave, read where the endpoint says.
    token_capture: str | None = None
    policy_version: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error is not None or self.status_code >= 400

    def to_dict(self) -> dict[str, Any]:
        # Shallow: the values are plain JSON data already, and dataclasses.asdict's deep copy of the
        # request and response was most of the cost of sending a record on.
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["started_at"] = self.started_at.isoformat()
        data["ended_at"] = self.ended_at.isoformat()
        return data

    def to_json(self) -> bytes:
        # The datetimes are left to the encoder (isoformat, the same text as to_dict's): one pass.
        return jsonfast.dumps({name: getattr(self, name) for name in _FIELD_NAMES})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallRecord:
        values = {key: value for key, value in data.items() if key in _FIELD_NAMES}
        values["started_at"] = datetime.fromisoformat(values["started_at"])
        values["ended_at"] = datetime.fromisoformat(values["ended_at"])
        return cls(**values)

    @classmethod
    def from_json(cls, raw: bytes | str) -> CallRecord:
        return cls.from_dict(jsonfast.loads(raw))

    def to_step_record(self) -> StepRecord:
        message = _first_message(self.response)
        response_text = _text_of(message.get("content")) if "content" in message else None
        usage = self.usage or {}
        return StepRecord(
            kind="model_call",
            started_at=self.started_at,
            ended_at=self.ended_at,
            duration_ms=self.latency_ms,
            text=response_text or self.error or "",
            request_messages=[message_record(m) for m in self.request.get("messages") or []],
            response_text=response_text,
            # The normalised body, and beside it the raw exchange: both in the response blob, off the row.
            response_json={**(self.response or {}), "raw_exchange": self.raw} if self.raw else self.response,
            tool_calls=message.get("tool_calls") or None,
            model=(self.response or {}).get("model") or self.request.get("model"),
            tokens_in=usage.get("prompt_tokens"),
            tokens_out=usage.get("completion_tokens"),
            latency_ms=self.latency_ms,
            ttft_ms=self.ttft_ms,
            call_id=self.call_id,
            is_error=self.is_error,
            payload=self._step_payload(message),
        )

    def _step_payload(self, message: dict[str, Any]) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "trajectory_id": self.trajectory_id,
            "status_code": self.status_code,
            "stream": self.stream,
            # tools, temperature, max_tokens...: what shaped the answer besides the messages
            "params": {key: value for key, value in self.request.items() if key != "messages"},
        }
        if self.protocol != "chat" or self.upstream_protocol != "chat":
            payload["protocol"] = self.protocol
            payload["upstream_protocol"] = self.upstream_protocol
        choice = _first_choice(self.response)
        optional = {
            "finish_reason": choice.get("finish_reason"),
            "usage": self.usage,
            "error": self.error,
            "error_kind": self.error_kind,
            "reasoning": message.get("reasoning_content") or message.get("reasoning"),
            "logprobs": (choice.get("logprobs") or {}).get("content") or None,
            "token_ids": choice.get("token_ids"),
            # vLLM puts the prompt's ids at the top level, SGLang in the choice.
            "prompt_token_ids": (self.response or {}).get("prompt_token_ids") or choice.get("prompt_token_ids"),
            "token_capture": self.token_capture,
            "policy_version": self.policy_version,
        }
        payload.update({key: value for key, value in optional.items() if value is not None})
        return payload


_FIELD_NAMES = tuple(f.name for f in fields(CallRecord))


def message_record(message: dict[str, Any]) -> MessageRecord:
    """An OpenAI chat message as a MessageRecord; content parts are flattened to text."""
    return MessageRecord(
        role=str(message.get("role") or ""),
        content=_text_of(message.get("content")) or "",
        name=message.get("name"),
        tool_calls=message.get("tool_calls") or None,
        tool_call_id=message.get("tool_call_id"),
    )


def _text_of(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        # Non-text parts (images, audio) keep a marker so the text does not silently read as complete.
        return "\n".join(_part_text(part) for part in content)
    return json.dumps(content)


def _part_text(part: Any) -> str:
    if isinstance(part, dict):
        if isinstance(part.get("text"), str):
            return part["text"]
        return f"[{part.get('type', 'part')}]"
    return str(part)


def _first_choice(response: dict[str, Any] | None) -> dict[str, Any]:
    choices = (response or {}).get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _first_message(response: dict[str, Any] | None) -> dict[str, Any]:
    message = _first_choice(response).get("message")
    return message if isinstance(message, dict) else {}
