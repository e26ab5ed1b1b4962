"""Token-exact RL samples: a rollout's model calls chained into the token sequences the policy saw and made.

A call extends the current sample when its prompt token ids begin with the sample so far (the previous
call's prompt plus its completion): the tokens in between (tool results, user turns, the next turn's
header) join the sample with loss mask 0, the call's completion with mask 1 and its logprobs. When the
prompt does not begin so, the harness changed what the policy had seen: a new sample starts and the
`Fork` says why (`fork_cause`), which message changed and the first token that differs.

Calls recorded without token ids are chained on the message level instead (`retokenised_samples`): each
new message is rendered with a ChatML-style template and tokenised once by a `tokenizers.Tokenizer` (a
local tokenizer.json), so the cost is linear in the rollout's length, never the whole history per turn.
Such samples are marked `exact=False`; a rollout is assembled one way or the other, never both.

Plain functions over dataclasses: no database here (the service is `experience.services.rl_samples`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import is_not
from typing import Any

import numpy as np

from experience.distill.errors import TokenizerUnavailable
from experience.records import MessageRecord, StepRecord

REMINDER_MARK = "<system-reminder>"
TOKEN_ID_PREFIX = "token_id:"  # how vLLM spells a logprob's token under return_tokens_as_token_ids
FORK_CAUSES = ("compaction", "system_reminder", "rerendered_turn", "edited_history", "truncated_prompt", "unknown")


@dataclass(frozen=True)
class ModelCall:
    """What assembly needs of one recorded model call. Ids are None when the server returned none.
    `messages` (the request) and `response` are None when not read: exact chaining needs them only to
    tell a fork's cause (`call_of_payload`). `messages` is the step's own list, not a copy (a run's calls
    would otherwise hold the sum of their contexts twice over), and is read, never changed."""

    seq: int
    messages: Sequence[MessageRecord] | None
    response: MessageRecord | None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float | None] | None = None
    policy_version: str | None = None

    @property
    def has_ids(self) -> bool:
        return self.prompt_ids is not None and self.completion_ids is not None


@dataclass(frozen=True)
class Fork:
    """Why a sample started instead of extending the last one: at call `seq`, `message_index` (into the
    call's request messages) is the first message that is not what the last sample carried, and
    `token_index` the first prompt token that differs (None on the message level)."""

    seq: int
    cause: str
    message_index: int | None
    token_index: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "cause": self.cause, "message_index": self.message_index,
                "token_index": self.token_index, "detail": self.detail}


@dataclass
class Sample:
    """One token sequence: ids, a loss mask (1 = the policy generated it), a logprob per token (None where
    the mask is 0, or where the server gave none), the calls (step seqs) it spans and their policy
    versions. `exact`: the ids are the server's own; False when re-tokenised from the messages."""

    index: int
    exact: bool
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    policy_versions: list[str | None] = field(default_factory=list)
    fork: Fork | None = None
    # The messages the sample carries (the last call's request plus its response): what the next call's
    # request must begin with to extend it, and what a fork's cause is judged against.
    history: list[MessageRecord] = field(default_factory=list)

    @property
    def policy_version(self) -> str | None:
        return self.policy_versions[-1] if self.policy_versions else None

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def _append(self, ids: Sequence[int], mask: int, logprobs: Sequence[float | None] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [None] * len(ids))

    def _took(self, call: ModelCall) -> None:
        self.calls.append(call.seq)
        self.policy_versions.append(call.policy_version)
        if call.messages is not None and call.response is not None:
            self.history = [*call.messages, call.response]


# --- reading recorded steps ----------------------------------------------------------------------------


def model_calls(steps: Iterable[StepRecord], *, seqs: Iterable[int] | None = None) -> list[ModelCall]:
    """The successful model calls among a run's steps, in order. `seqs`: each step's seq in the run
    (default: its position)."""
    numbered = zip(seqs, steps, strict=True) if seqs is not None else enumerate(steps)
    return [call_of(step, seq=seq) for seq, step in numbered if step.kind == "model_call" and not step.is_error]


def call_of(step: StepRecord, *, seq: int) -> ModelCall:
    response = MessageRecord(role="assistant", content=step.response_text or "", tool_calls=step.tool_calls)
    return call_of_payload(step.payload or {}, seq=seq, messages=step.request_messages or (), response=response)


def call_of_payload(
    payload: dict[str, Any], *, seq: int, messages: Sequence[MessageRecord] | None = None,
    response: MessageRecord | None = None,
) -> ModelCall:
    """A call from its step's payload (where the proxy keeps token ids, logprobs and the policy version).
    Completion ids are the server's `token_ids` (vLLM's `return_token_ids`), else read from logprob tokens
    spelled `token_id:<id>` (vLLM's `return_tokens_as_token_ids`)."""
    completion = _ids(payload.get("token_ids"))
    if completion is None:
        completion = _ids_in_logprobs(payload.get("logprobs"))
    return ModelCall(
        seq=seq,
        messages=messages,
        response=response,
        prompt_ids=_ids(payload.get("prompt_token_ids")),
        completion_ids=completion,
        logprobs=_logprobs(payload.get("logprobs"), len(completion) if completion is not None else None),
        policy_version=_text_or_none(payload.get("policy_version")),
    )


def _ids(value: Any) -> list[int] | None:
    """Token ids as a list of ints, or None for anything else (checked by numpy: an id list is long)."""
    if not isinstance(value, list):
        return None
    if value and np.asarray(value).dtype.kind not in "iu":  # bools, floats, strings, nested lists
        return None
    return value


def _ids_in_logprobs(entries: Any) -> list[int] | None:
    if not isinstance(entries, list) or not entries:
        return None
    ids = []
    for entry in entries:
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX) or not token[len(TOKEN_ID_PREFIX) :].isdigit():
            return None
        ids.append(int(token[len(TOKEN_ID_PREFIX) :]))
    return ids


def _logprobs(entries: Any, count: int | None) -> list[float | None] | None:
    """The completion's logprobs, one per token id; None when absent or not one per token (a server that
    split tokens differently from its ids must not shift every logprob by one)."""
    if not isinstance(entries, list) or count is None or len(entries) != count:
        return None
    values = [entry.get("logprob") if isinstance(entry, dict) else entry for entry in entries]
    return [float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None for v in values]


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


# --- exact samples ---------------------------------------------------------------------------------------


def exact_samples(calls: Sequence[ModelCall]) -> list[Sample]:
    """Chain calls that all carry token ids (`ModelCall.has_ids`) into samples, forking where a prompt does
    not begin with the sample so far. Each prompt is compared once against the sample it may extend: cost
    linear in the tokens recorded."""
    samples: list[Sample] = []
    for call in calls:
        assert call.prompt_ids is not None and call.completion_ids is not None  # noqa: S101 - caller checks
        current = samples[-1] if samples else None
        if current is not None and _extends(call.prompt_ids, current.token_ids):
            current._append(call.prompt_ids[len(current.token_ids) :], 0)
        else:
            fork = None if current is None else _exact_fork(call, current)
            current = Sample(index=len(samples), exact=True, fork=fork)
            samples.append(current)
            current._append(call.prompt_ids, 0)
        current._append(call.completion_ids, 1, call.logprobs)
        current._took(call)
    return samples


def _extends(prompt: list[int], sample: list[int]) -> bool:
    # A list slice compared in C: one pass over the prompt's shared part.
    return len(prompt) >= len(sample) and prompt[: len(sample)] == sample


def _exact_fork(call: ModelCall, previous: Sample) -> Fork:
    assert call.prompt_ids is not None  # noqa: S101
    token = first_difference(call.prompt_ids, previous.token_ids)
    if call.messages is None:
        return Fork(seq=call.seq, cause="unknown", message_index=None, token_index=token, detail="messages not read")
    cause, message, detail = fork_cause(previous.history, call.messages)
    if cause is None:
        # Every message the sample carried is still there, unchanged: the server rendered them to other
        # tokens (a template that re-renders an earlier turn: tool-call arguments re-serialised, thinking
        # dropped from past turns).
        cause, message = "rerendered_turn", _message_holding(previous)
        detail = f"the same messages rendered to other tokens from prompt token {token}"
        if token == len(call.prompt_ids):
            cause, detail = "truncated_prompt", f"the prompt ends at token {token}, inside the last sample"
    return Fork(seq=call.seq, cause=cause, message_index=message, token_index=token, detail=detail)


def _message_holding(previous: Sample) -> int | None:
    """The last message a sample carries (its last response): where a re-render most often starts."""
    return len(previous.history) - 1 if previous.history else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where the sequences differ (the shorter one's length when one begins the other)."""
    shared = min(len(a), len(b))
    differs = np.flatnonzero(np.asarray(a[:shared]) != np.asarray(b[:shared]))
    return int(differs[0]) if differs.size else shared


# --- fork causes -----------------------------------------------------------------------------------------


def fork_cause(history: Sequence[MessageRecord], request: Sequence[MessageRecord]) -> tuple[str | None, int | None, str]:
    """Why `request` does not continue `history` (the messages the last sample carried): (cause, index of
    the first message that differs, detail), or (None, None, "") when it does continue it.

    - `system_reminder`: the first differing message is (or replaces) a system message or carries a
      `<system-reminder>` (inserted or edited);
    - `compaction`: the request carries fewer messages than the history it should extend (turns summarised
      or dropped);
    - `rerendered_turn`: an earlier turn is there with the same role but other content or tool calls;
    - `edited_history`: anything else (a message of another role where one was).
    """
    index = _first_message_difference(history, request)
    if index is None:
        return None, None, ""
    old = history[index] if index < len(history) else None
    new = request[index] if index < len(request) else None
    if _is_reminder(old) or _is_reminder(new):
        inserted = new is not None and index + 1 < len(request) and old is not None and _same(request[index + 1], old)
        verb = "inserted" if inserted or old is None else "edited"
        return "system_reminder", index, f"a system reminder {verb} at message {index}"
    if len(request) < len(history):
        return "compaction", index, f"{len(history)} messages became {len(request)} from message {index}"
    if old is not None and new is not None and old.role == new.role:
        return "rerendered_turn", index, f"the {old.role} message {index} changed"
    return "edited_history", index, f"message {index} is not the one the last sample carried"


def _first_message_difference(history: Sequence[MessageRecord], request: Sequence[MessageRecord]) -> int | None:
    # A check in C first (`_begins_with`); the walk that names the first different message runs only
    # when it fails.
    if len(request) >= len(history) and _begins_with(request, history):
        return None
    for index, old in enumerate(history):
        if index >= len(request) or not _same(old, request[index]):
            return index
    return None


def _begins_with(request: Sequence[MessageRecord], history: Sequence[MessageRecord]) -> bool:
    """Whether `request` (no shorter) begins with `history`, message for message as `==` has it. Each call's
    request repeats the whole history, so this reads it once per call, in C rather than by a Python
    `__eq__` per message: records shared between calls (the store shares them) match by identity, and from
    the first one not shared (calls built one by one share none) messages compare by their attribute
    dicts, which hold exactly the fields the dataclass's `==` compares."""
    unshared = next(compress(count(), map(is_not, request, history)), None)
    if unshared is None:
        return True
    return list(map(vars, request[unshared : len(history)])) == list(map(vars, history[unshared:]))


def _same(a: MessageRecord, b: MessageRecord) -> bool:
    if a == b:  # the common case, compared field by field in C; tool calls are parsed only when it fails
        return True
    return (a.role, a.content, a.tool_call_id) == (b.role, b.content, b.tool_call_id) and _calls(a) == _calls(b)


def _calls(message: MessageRecord) -> list[tuple[str, Any]]:
    """Tool calls by name and parsed arguments: the same call re-serialised is the same message (its
    tokens may still differ, which the exact path sees)."""
    calls = []
    for call in message.tool_calls or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = arguments
        calls.append((str(function.get("name")), parsed))
    return calls


def _is_reminder(message: MessageRecord | None) -> bool:
    return message is not None and (message.role == "system" or REMINDER_MARK in message.content)


# --- re-tokenised samples --------------------------------------------------------------------------------

Encode = Callable[[str], list[int]]


def chatml_segments(message: MessageRecord) -> tuple[str, str]:
    """A message as ChatML text: (header, body). The header (`<|im_start|>role\\n`) of an assistant turn is
    the generation prompt the model was given; its body is what the model generated."""
    body = message.content
    for call in message.tool_calls or []:
        function = call.get("function") or {}
        body += f"<tool_call>{json.dumps({'name': function.get('name'), 'arguments': function.get('arguments')})}</tool_call>"
    return f"<|im_start|>{message.role}\n", f"{body}<|im_end|>\n"


def tokenizer_encoder(path: str) -> Encode:
    """The encoder of a local tokenizer.json (Hugging Face `tokenizers`); special tokens are not added, the
    template's markers are encoded as the tokenizer's own specials where it has them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def retokenised_samples(calls: Sequence[ModelCall], encode: Encode) -> list[Sample]:
    """Chain calls on the message level: a call whose request begins with the last sample's history (its
    last request plus response) extends it with the new messages only; any other call forks, with its
    cause, and its sample holds its whole request. No text is tokenised twice in a rollout (`_once`): a
    role's header once, a forked sample's unchanged messages from the ids they had. Completion logprobs
    are not carried over (the server's tokens are not these)."""
    samples: list[Sample] = []
    encode = _once(encode)
    for call in calls:
        assert call.messages is not None and call.response is not None  # noqa: S101 - read with the steps
        current = samples[-1] if samples else None
        request = call.messages
        cause, message, detail = (None, None, "") if current is None else fork_cause(current.history, request)
        if current is not None and cause is None:
            new_messages = request[len(current.history):]
        else:
            fork = None if current is None else Fork(call.seq, cause or "edited_history", message, None, detail)
            current = Sample(index=len(samples), exact=False, fork=fork)
            samples.append(current)
            new_messages = request
        for each in new_messages:
            header, body = chatml_segments(each)
            current._append(encode(header) + encode(body), 0)
        header, body = chatml_segments(call.response)
        current._append(encode(header), 0)
        current._append(encode(body), 1)
        current._took(call)
    return samples


def _once(encode: Encode) -> Encode:
    """`encode`, remembering each text's ids: a tokenizer gives a text the same ids every time, so a
    repeated text (a header, a message a fork carries again) costs a lookup, not a tokenisation. The
    ids returned are shared: callers copy them (`Sample._append` extends)."""
    known: dict[str, list[int]] = {}

    def encoded(text: str) -> list[int]:
        ids = known.get(text)
        if ids is None:
            ids = known[text] = encode(text)
        return ids

    return encoded


# --- a rollout -------------------------------------------------------------------------------------------


@dataclass
class Assembly:
    """A rollout's samples, how they were made (`exact`), and why none were when there are none."""

    samples: list[Sample]
    exact: bool
    calls: int
    note: str = ""

    @property
    def forks(self) -> list[Fork]:
        return [sample.fork for sample in self.samples if sample.fork is not None]


def assemble(calls: Sequence[ModelCall], *, encode: Encode | None = None) -> Assembly:
    """The samples of one rollout's calls: exact when every call carries token ids; else re-tokenised with
    `encode` (every call, so exact and re-tokenised tokens never share a rollout); else none, with a note."""
    if not calls:
        return Assembly([], exact=True, calls=0, note="no model calls")
    if all(call.has_ids for call in calls):
        return Assembly(exact_samples(calls), exact=True, calls=len(calls))
    missing = sum(1 for call in calls if not call.has_ids)
    note = f"{missing} of {len(calls)} calls have no token ids"
    if encode is None:
        return Assembly([], exact=False, calls=len(calls), note=f"{note} and the endpoint names no tokenizer")
    return Assembly(retokenised_samples(calls, encode), exact=False, calls=len(calls), note=f"{note}: re-tokenised")


def configured_encoder(endpoint: str) -> Encode | None:
    """The encoder of the tokenizer the operator named for a model endpoint (`TROVE_RL_TOKENIZERS`), or
    None. Loaded once per process and path."""
    from django.conf import settings

    path = getattr(settings, "TROVE_RL_TOKENIZERS", {}).get(endpoint)
    if not path:
        return None
    try:
        return _cached_encoder(path)
    except Exception as error:  # tokenizers raises a bare Exception ("No such file or directory (os error 2)")
        raise TokenizerUnavailable(
            f"TROVE_RL_TOKENIZERS: the tokenizer for endpoint {endpoint!r} cannot be loaded from {path}: {error}"
        ) from error


@functools.lru_cache(maxsize=8)
def _cached_encoder(path: str) -> Encode:
    return tokenizer_encoder(path)
