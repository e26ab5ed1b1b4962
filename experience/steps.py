"""Turning StepRecords into Step rows and back. ORM-free apart from the Step class it instantiates.

Short text stays inline in `payload`; text longer than INLINE_LIMIT and every model call's request
messages go to blobs (`blob_refs`), so repeated context is stored once. The mapping is lossless:
`step_record_from_parts(prepare_step(r)...) == r` for any record an importer or the API produced.

Two things Postgres refuses are kept anyway, in blobs (bytea holds any bytes): the NUL character and lone
UTF-16 surrogates (real logs carry both: binary command output, JSON written by JavaScript). When the
step's inline payload would hold one, the whole payload moves to a `payload` blob; texts and messages are
encoded with `surrogatepass`, which is plain UTF-8 for every ordinary string, so their hashes are unchanged.

A model call's context (`blob_refs["request_messages"]`) is stored either as the full list of its message
digests or, when written in bulk, as a delta on the previous model call of the same run:
`{"extends": <that step's id>, "keep": <how many of its digests come first>, "append": [the rest]}`. A run
whose context grows by two messages a call so stores each digest once instead of once per later call. The
delta names the base step by its primary key, which never changes (seq does: steps are renumbered when one
arrives late), and a base always has a smaller id than the steps that extend it. Readers turn deltas back
into full lists with `full_contexts` (given every base: whole runs) or `experience.services.stored.
step_contexts` (any rows: fetches the missing bases in one query); everything downstream sees full lists.
The dataset read path goes the other way first: it reads every context of whole runs as a delta where it
extends an earlier one (`contexts_as_deltas`), so each digest is fetched and looked up once, and rebuilds
the message lists from those (`ContextMessages.contexts`).
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from experience.records import MessageRecord, StepRecord

INLINE_LIMIT = 2048
PREVIEW_CHARS = 300
TEXT_FIELDS = ("text", "output", "response_text")
NAMED_FIELDS = ("command", "tool_calls", "model", "latency_ms", "ttft_ms")
PAYLOAD_BLOB = "payload"  # blob_refs key of a payload Postgres could not hold inline
CONTEXT = "request_messages"  # blob_refs key of a model call's context: a list of digests, or a delta


# Encoders built once: json.dumps with options builds a new encoder per call, a cost on the hot path.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# orjson, several times faster, where it writes what the encoders above write. It refuses lone surrogates,
# non-string keys and integers beyond 64 bits (TypeError: then `json` writes them); with these options it
# refuses datetimes and dataclasses too, as `json` does. It writes NaN as null, where `json` writes NaN
# (which Postgres refuses): validation lets no NaN through to a step's payload.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def canonical_json(value: Any) -> bytes:
    """Sorted-key compact UTF-8 JSON: the bytes a message blob is hashed on, so they must never change."""
    # orjson's strings are byte for byte `json`'s (ensure_ascii=False), but some floats are not (1e-07 / 1e-7),
    # so only a flat object of strings, a context message without tool calls (nearly all), takes it.
    if type(value) is dict and all(type(v) is str for v in value.values()):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | _ORJSON_OPTIONS)
        except TypeError:
            pass
    return _CANONICAL.encode(value).encode("utf-8", "surrogatepass")


def compact_json(value: Any) -> str:
    """Compact JSON text for a jsonb column: Postgres parses it, so any equivalent text will do."""
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS).decode()
    except TypeError:
        return _COMPACT.encode(value)


def encode_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def decode_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def storable(text: str) -> bool:
    """Whether Postgres can keep `text` in a text column: no NUL character, valid UTF-8 (no lone surrogate)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A JSON escape of NUL (\u0000 after an even number of backslashes): jsonb refuses it. A text holding a
# literal backslash-u0000 is escaped as \\u0000 and is fine.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_json(text: str) -> bool:
    """Whether Postgres can keep JSON `text` (as json.dumps wrote it) in a jsonb column."""
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        return False
    return storable(text)


def printable(text: str) -> str:
    """`text` made storable for display-only columns (the preview): NUL dropped, lone surrogates replaced."""
    if storable(text):
        return text
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def preview_of(record: StepRecord) -> str:
    return printable(_preview_source(record)[:PREVIEW_CHARS])


def _preview_source(record: StepRecord) -> str:
    if record.kind == "command" and record.command:
        return record.command
    for candidate in (record.response_text, record.text, record.output):
        if candidate:
            return candidate
    if record.tool_calls:
        return json.dumps(record.tool_calls, ensure_ascii=False)[:PREVIEW_CHARS]
    return ""


class BlobSink:
    """Collects the blob contents of many steps, each distinct content once, keyed by its sha256.

    Request messages are memoised by object: importers share one MessageRecord across every call whose
    context holds it, so a context that grows over 50 calls is serialised and hashed once per message,
    not 50 times. The sink keeps the messages alive, so their ids stay unique while it lives.
    """

    def __init__(self) -> None:
        self.contents: dict[str, bytes] = {}
        self._messages: dict[int, tuple[MessageRecord, str]] = {}
        self._last: tuple[list[MessageRecord], list[str]] = ([], [])

    def put(self, content: bytes) -> str:
        digest = hashlib.sha256(content).hexdigest()
        self.contents.setdefault(digest, content)
        return digest

    def put_messages(self, messages: list[MessageRecord]) -> list[str]:
        """The digests of a context, in order. A context that extends the previous one (the same objects,
        then more: the usual growth of an agent's context) reuses its digests and looks up only the rest."""
        last, last_digests = self._last
        shared = len(last) if len(last) <= len(messages) and all(map(operator.is_, last, messages)) else 0
        digests = last_digests[:shared]
        memo = self._messages
        for message in messages[shared:]:
            known = memo.get(id(message))
            if known is None or known[0] is not message:
                known = memo[id(message)] = (message, self.put(canonical_json(message.as_openai())))
            digests.append(known[1])
        self._last = (list(messages), digests)  # a copy: a caller may grow its list in place
        return digests


@dataclass
class PreparedStep:
    """A StepRecord split into inline fields and references to blob contents held by a BlobSink."""

    record: StepRecord
    payload: dict[str, Any]
    payload_json: str  # `payload` serialised once, for COPY
    blob_refs: dict[str, Any] = field(default_factory=dict)
    preview: str = ""


def prepare_step(record: StepRecord, sink: BlobSink) -> PreparedStep:
    payload: dict[str, Any] = dict(record.payload)
    refs: dict[str, Any] = {}
    for name in TEXT_FIELDS:
        value = getattr(record, name)
        if value is None or (name == "text" and value == ""):
            continue  # "" is the default of `text` only; an empty output is kept as ""
        if len(value) > INLINE_LIMIT:
            refs[name] = sink.put(encode_text(value))
        else:
            payload[name] = value
    for name in NAMED_FIELDS:
        value = getattr(record, name)
        if value is not None:
            payload[name] = value
    if record.request_messages is not None:
        refs[CONTEXT] = sink.put_messages(record.request_messages)
    if record.response_json is not None:
        refs["response_json"] = sink.put(canonical_json(record.response_json))
    payload_json = compact_json(payload)
    if not storable_json(payload_json):
        refs[PAYLOAD_BLOB] = sink.put(encode_text(payload_json))
        payload, payload_json = {}, "{}"
    return PreparedStep(record, payload, payload_json, refs, preview_of(record))


def refs_json(refs: dict[str, Any]) -> str:
    """`blob_refs` as JSON text, built directly: its values are hex digests, lists of them or a context
    delta, and this runs once per step on the bulk path, where json.dumps was a hot spot."""
    parts = []
    for name, value in refs.items():
        if isinstance(value, str):
            parts.append(f'"{name}":"{value}"')
        elif isinstance(value, list):
            parts.append(f'"{name}":{_digests_json(value)}')
        else:
            parts.append(f'"{name}":{{"extends":{int(value["extends"])},"keep":{int(value["keep"])},'
                         f'"append":{_digests_json(value["append"])}}}')
    return "{" + ",".join(parts) + "}"


def _digests_json(digests: list[str]) -> str:
    return '["' + '","'.join(digests) + '"]' if digests else "[]"


# ---------------------------------------------------------------- contexts stored as deltas


def context_delta(base_id: int, base: list[str], digests: list[str]) -> list[str] | dict[str, Any]:
    """How to store context `digests` after a model call of the same run (step `base_id`, context `base`):
    a delta keeping the prefix the two share, or the full list when they share nothing."""
    keep = _shared_prefix(base, digests)
    if keep == 0:
        return digests
    return {"extends": base_id, "keep": keep, "append": digests[keep:]}


def _shared_prefix(base: list[str], digests: list[str]) -> int:
    n = len(base)
    if n <= len(digests) and digests[:n] == base:  # the usual case: the context grew
        return n
    n = min(n, len(digests))
    for index in range(n):
        if base[index] != digests[index]:
            return index
    return n


def is_context_delta(value: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict)


def context_length(value: list[str] | dict[str, Any]) -> int:
    """How many messages a stored context holds, without resolving a delta."""
    if isinstance(value, dict):
        return value["keep"] + len(value["append"])
    return len(value)


def context_bases(refs_by_step: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """The steps the contexts among `refs_by_step` extend that are not among them."""
    bases = {refs[CONTEXT]["extends"] for refs in refs_by_step.values() if is_context_delta(refs.get(CONTEXT))}
    return bases - refs_by_step.keys()


def full_contexts(
    refs_by_step: Mapping[int, Mapping[str, Any]], wanted: Iterable[int] | None = None
) -> dict[int, list[str]]:
    """The full context (a list of message digests) of each step in `wanted` (default: every step of
    `refs_by_step`, step id -> blob_refs, that has one), by step id. Every delta's base, and its bases, must
    be among `refs_by_step`: whole runs qualify; complete a page with `experience.services.stored.step_contexts`.

    Linear in the contexts asked for: a base not asked for is not built on its own (a page late in a long run
    walks the run's earlier deltas once, into the first context it needs)."""
    if wanted is None:
        wanted = (step_id for step_id, refs in refs_by_step.items() if CONTEXT in refs)
    full: dict[int, list[str]] = {}
    for step_id in sorted(wanted):  # ascending: a base has a smaller id, so later chains stop at earlier results
        if step_id not in full:
            full[step_id] = _resolve(step_id, refs_by_step, full)
    return full


def _resolve(step_id: int, refs_by_step: Mapping[int, Mapping[str, Any]], known: dict[int, list[str]]) -> list[str]:
    """`step_id`'s full context: walk its deltas down to a full list or a context in `known`, then replay them."""
    chain: list[dict[str, Any]] = []
    current = step_id
    while current not in known:
        refs = refs_by_step.get(current)
        if refs is None or CONTEXT not in refs:
            raise KeyError(f"step {step_id}: the context it extends (step {current}) was not given")
        value = refs[CONTEXT]
        if not is_context_delta(value):
            base = value
            break
        chain.append(value)
        current = value["extends"]
    else:
        base = known[current]
    context = list(base)
    for delta in reversed(chain):
        del context[delta["keep"] :]
        context.extend(delta["append"])
    return context


def contexts_as_deltas(
    step_ids: Sequence[int], refs: Sequence[Mapping[str, Any]]
) -> dict[int, list[str] | dict[str, Any]]:
    """The contexts among rows (step ids and blob_refs in the same order), by step id, each full list that
    shares a prefix with the full list before it (an earlier step: a run's context grows) turned into a
    delta on that one, as ingest's bulk path stores them. Read this way, a run's contexts name each digest
    once: what they share is neither fetched nor looked up again (`ContextMessages.contexts`)."""
    contexts: dict[int, list[str] | dict[str, Any]] = {}
    last_id, last = 0, None  # the last full list seen
    for step_id, step_refs in zip(step_ids, refs, strict=True):
        value = step_refs.get(CONTEXT)
        if value is None:
            continue
        if not is_context_delta(value):
            full = value
            if last is not None and last_id < step_id:  # a base has a smaller id (see full_contexts)
                value = context_delta(last_id, last, full)
            last_id, last = step_id, full
        contexts[step_id] = value
    return contexts


class ContextMessages(dict[str, MessageRecord]):
    """Context messages by digest, each parsed from `blobs` once and shared by every model call whose context
    holds it, as importers share them (the inverse of `BlobSink.put_messages`). The records are read-only
    downstream. A dict, so a known message is a plain lookup."""

    def __init__(self, blobs: Mapping[str, bytes]) -> None:
        super().__init__()
        self._blobs = blobs

    def __missing__(self, digest: str) -> MessageRecord:
        message = self[digest] = MessageRecord(**json_loads(self._blobs[digest]))
        return message

    def contexts(self, stored: Mapping[int, list[str] | dict[str, Any]]) -> dict[int, list[MessageRecord]]:
        """Each context's messages by step id, from contexts as stored (full lists or deltas, whose bases
        must be among them: whole runs), each in a list of its own. A delta copies its base's messages
        and looks up only those it appends: linear in the messages the contexts add."""
        built: dict[int, list[MessageRecord]] = {}
        for step_id in sorted(stored):  # ascending: a base has a smaller id, so it is built first
            value = stored[step_id]
            if is_context_delta(value):
                base = built.get(value["extends"])
                if base is None:
                    raise KeyError(f"step {step_id}: the context it extends (step {value['extends']}) was not given")
                messages = base[: value["keep"]]
                messages += [self[digest] for digest in value["append"]]
            else:
                messages = [self[digest] for digest in value]
            built[step_id] = messages
        return built


def json_loads(text: str | bytes) -> Any:
    """JSON text parsed by orjson (several times faster on the read paths, which parse every step row and
    context message), or by json for what orjson refuses and json reads (lone surrogate escapes, NaN)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def step_record_from_parts(
    *, kind: str, payload: dict[str, Any], blob_refs: dict[str, Any], blobs: Mapping[str, bytes],
    context: list[MessageRecord] | None = None, own_payload: bool = False, **columns: Any
) -> StepRecord:
    """The inverse of prepare_step: rebuild a StepRecord from a row's fields and its fetched blobs.

    `context`: the request messages, already rebuilt by the caller (`ContextMessages.contexts`: shared
    with its other rows); else a context in `blob_refs` is parsed from `blobs` here.
    `own_payload`: the payload dict is the caller's to consume (fresh from a parser), so its fields are taken
    from it in place instead of from a copy."""
    if PAYLOAD_BLOB in blob_refs:
        payload = json.loads(blobs[blob_refs[PAYLOAD_BLOB]])
    elif not own_payload:
        payload = dict(payload)
    take = payload.pop
    # TEXT_FIELDS and NAMED_FIELDS each by name, not through dicts of them: this runs for every step read.
    text, output, response_text = take("text", None), take("output", None), take("response_text", None)
    request_messages, response_json = context, None
    if blob_refs:  # most steps (short commands, messages) refer to no blob at all
        if "text" in blob_refs:
            text = decode_text(blobs[blob_refs["text"]])
        if "output" in blob_refs:
            output = decode_text(blobs[blob_refs["output"]])
        if "response_text" in blob_refs:
            response_text = decode_text(blobs[blob_refs["response_text"]])
        if CONTEXT in blob_refs and context is None:
            request_messages = _request_messages(blob_refs[CONTEXT], blobs)
        if "response_json" in blob_refs:
            response_json = json.loads(blobs[blob_refs["response_json"]])
    return StepRecord(
        kind=kind, text=text or "", output=output, response_text=response_text,
        request_messages=request_messages, response_json=response_json, command=take("command", None),
        tool_calls=take("tool_calls", None), model=take("model", None), latency_ms=take("latency_ms", None),
        ttft_ms=take("ttft_ms", None), payload=payload, **columns,
    )  # fmt: skip


def _request_messages(digests: Any, blobs: Mapping[str, bytes]) -> list[MessageRecord]:
    if is_context_delta(digests):
        raise ValueError("a context stored as a delta: resolve it first (full_contexts, stored.step_contexts)")
    return [MessageRecord(**json.loads(blobs[h])) for h in digests]


def referenced_hashes(blob_refs: dict[str, Any], *, context: bool = True) -> list[str]:
    """Every blob a step's row names; without the request context when `context` is False. Of a context
    stored as a delta, only the digests it appends: the rest are named by the steps it extends."""
    hashes: list[str] = []
    for name, value in blob_refs.items():
        if name == CONTEXT and not context:
            continue
        if isinstance(value, str):
            hashes.append(value)
        else:
            hashes.extend(value["append"] if is_context_delta(value) else value)
    return hashes
