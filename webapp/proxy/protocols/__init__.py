"""The protocols the proxy speaks, one module each: its routes, how a stream of it is assembled, and its
translation to and from OpenAI Chat Completions (the hub and the normalised form of every record).

A module provides: NAME, ROUTES, upstream_path(body, stream), is_stream(body, path), set_model(body, m),
auth_headers(key), to_chat_request / from_chat_request, to_chat_response / from_chat_response(chat,
request), assemble(chunks) -> base.Assembled, Writer(request) (chat chunks in, its SSE bytes out),
error_body(code, message) and error_message(body); optionally upstream_body(body) (what is sent, when the
body carries keys of the proxy's own). Adding a protocol is adding a module here and its name below.
"""

from __future__ import annotations

from types import ModuleType

from webapp.proxy.protocols import chat, gemini, messages, responses
from webapp.proxy.protocols.base import Untranslatable

PROTOCOLS: dict[str, ModuleType] = {m.NAME: m for m in (chat, responses, messages, gemini)}

__all__ = ["PROTOCOLS", "Untranslatable"]
