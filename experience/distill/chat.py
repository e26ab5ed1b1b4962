"""A run as OpenAI chat messages, and cutting a context down to a token budget.

Where a model call recorded its request, that request is the context verbatim: it is exactly what the
model saw. Otherwise the conversation is rebuilt from the steps: message steps as they were, each
decision's reply (or, with no model call, the command itself) as an assistant message, and each action's
output as a user message (or a `tool` message answering a tool call with an id). Evals, file changes,
sandbox events and notes were never shown to the agent and are left out.

Every rebuilt message is tagged with the decision it belongs to (None for messages before the first
decision), so SFT can weight the assistant turns of each decision.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experience.distill.decisions import Decision, model_tool_calls
from experience.records import StepRecord, TrajectoryRecord

Message = dict[str, Any]
CHARS_PER_TOKEN = 4
_TASK_PROBE_CHARS = 200


@dataclass(frozen=True)
class Entry:
    """One rebuilt message, the step it came from and the decision it belongs to."""

    step_index: int
    message: Message
    decision: int | None


def rebuild_conversation(record: TrajectoryRecord, decisions: list[Decision]) -> list[Entry]:
    """The run as tagged chat messages, from its steps. When no message step carries the task, it is
    added as a user message after any leading system messages."""
    owner = {step: d for d in decisions for step in range(d.first_step, d.last_step + 1)}
    entries: list[Entry] = []
    for index, step in enumerate(record.steps):
        entries.extend(_step_entries(record, index, step, owner.get(index)))
    if record.instruction and not _carries_task(entries, record.instruction):
        at = next((i for i, e in enumerate(entries) if e.message["role"] != "system"), len(entries))
        # It takes the step index of the system message before it, so entries stay sorted by step.
        step_index = entries[at - 1].step_index if at else -1
        entries.insert(at, Entry(step_index, {"role": "user", "content": record.instruction}, None))
    return entries


def _step_entries(
    record: TrajectoryRecord, index: int, step: StepRecord, decision: Decision | None
) -> list[Entry]:
    t = decision.t if decision else None
    if step.kind == "message":
        role = str(step.payload.get("role") or "user")
        return [Entry(index, {"role": role, "content": step.text}, None)]
    if step.kind == "model_call" and decision is not None:
        return [Entry(index, reply_message(step), t)]
    if step.kind in ("command", "tool_call") and decision is not None:
        entries = [] if decision.model_call is not None else [Entry(index, action_message(step), t)]
        call_id = _answered_call_id(record, decision, index, step)
        return entries + [
            Entry(index, message, t) for message in _output_messages(record, index, step, call_id)
        ]
    if step.kind == "observation" and not _is_consumed_observation(record, index):
        return [Entry(index, {"role": "user", "content": step.text}, None)]
    return []


def reply_message(step: StepRecord) -> Message:
    """The assistant message a model call returned."""
    message: Message = {"role": "assistant", "content": step.response_text or ""}
    calls = model_tool_calls(step)
    if calls:
        message["tool_calls"] = calls
    return message


def action_message(step: StepRecord) -> Message:
    """An action step written as the assistant message that would have issued it."""
    if step.tool_calls:
        return {"role": "assistant", "content": step.command or "", "tool_calls": step.tool_calls}
    return {"role": "assistant", "content": step.command or step.text}


def decision_message(record: TrajectoryRecord, decision: Decision) -> Message:
    """The action taken at a decision, as an assistant message."""
    if decision.model_call is not None:
        return reply_message(record.steps[decision.model_call])
    return action_message(record.steps[decision.actions[0]])


def _answered_call_id(
    record: TrajectoryRecord, decision: Decision, index: int, step: StepRecord
) -> str | None:
    """The tool call id an action's output answers: its own call's id, else, when the decision's model
    call returned tool calls, the one in the same position as this action (so the chat stays valid)."""
    own = [call.get("id") for call in step.tool_calls or [] if call.get("id")]
    if own:
        return str(own[0])
    if decision.model_call is None:
        return None
    ids = [call.get("id") for call in model_tool_calls(record.steps[decision.model_call])]
    position = decision.actions.index(index)
    return str(ids[position]) if position < len(ids) and ids[position] else None


def _output_messages(
    record: TrajectoryRecord, index: int, step: StepRecord, call_id: str | None
) -> list[Message]:
    output = step.output
    if output is None and _next_is_observation(record, index):
        output = record.steps[index + 1].text
    if output is None:
        return []
    if call_id:
        return [{"role": "tool", "tool_call_id": call_id, "content": output}]
    return [{"role": "user", "content": output}]


def _next_is_observation(record: TrajectoryRecord, index: int) -> bool:
    return index + 1 < len(record.steps) and record.steps[index + 1].kind == "observation"


def _is_consumed_observation(record: TrajectoryRecord, index: int) -> bool:
    """An observation that is the output of the action step right before it (already emitted)."""
    if index == 0:
        return False
    previous = record.steps[index - 1]
    return previous.kind in ("command", "tool_call") and previous.output is None


def _carries_task(entries: list[Entry], instruction: str) -> bool:
    return task_index([entry.message for entry in entries], instruction, strict=True) is not None


def conversation(record: TrajectoryRecord, decisions: list[Decision]) -> list[Entry]:
    """The whole run as tagged messages.

    When the last decision's model call recorded its request, the conversation is that request plus the
    final reply and its outputs, with the request's assistant messages after the task tagged 1..T-1 in
    order. If their number is not T-1 (the harness rewrote its history), tagging would be a guess, so the
    conversation is rebuilt from the steps instead.
    """
    entries = rebuild_conversation(record, decisions)
    if not decisions:
        return entries
    last = decisions[-1]
    call = record.steps[last.model_call] if last.model_call is not None else None
    if call is None or not call.request_messages:
        return entries
    request = [message.as_openai() for message in call.request_messages]
    start = task_index(request, record.instruction)
    assistants = [
        i for i, m in enumerate(request) if m["role"] == "assistant" and (start is None or i > start)
    ]
    if len(assistants) != len(decisions) - 1:
        return entries
    tags = {index: t for t, index in enumerate(assistants, start=1)}
    tagged = [Entry(-1, message, tags.get(i)) for i, message in enumerate(request)]
    return tagged + [entry for entry in entries if entry.decision == last.t]


# --- token budget --------------------------------------------------------------------------------------


def message_chars(message: Message) -> int:
    chars = len(str(message.get("content") or ""))
    if message.get("tool_calls"):
        chars += len(json.dumps(message["tool_calls"], sort_keys=True))
    return chars


def extends(items: Sequence[Any], previous: Sequence[Any]) -> bool:
    """Whether `items` starts with the very objects of `previous` (non-empty), compared by identity."""
    return 0 < len(previous) <= len(items) and all(map(operator.is_, items, previous))


class MessageFacts:
    """What truncation reads of each message (its characters, whether it holds the task), worked out once
    per message object rather than once per context holding it: a run's contexts share their messages
    (`values.decision_inputs`), so without this a run costs O(decisions x context) text scans. Keyed by
    identity, holding the messages; use one per run, whose messages must not change meanwhile.

    A context that starts with the previous one (a run's growing context) also carries on that one's
    running figures (total characters, tokens at CHARS_PER_TOKEN, leading system messages, the task), so
    `truncate` can tell in O(added messages) that the whole context fits (`whole`)."""

    def __init__(self) -> None:
        self._chars: dict[int, tuple[Message, int]] = {}
        self._holds: dict[tuple[int, str], bool] = {}
        self._last = _Profile()

    def profile(self, messages: Sequence[Message]) -> tuple[list[int], list[Any]]:
        """(characters, role) of each message."""
        profile = self._profile(messages)
        return profile.chars, profile.roles

    def _profile(self, messages: Sequence[Message]) -> _Profile:
        previous = self._last
        if extends(messages, previous.messages):
            if len(messages) == len(previous.messages):
                return previous
            profile = previous.extended(messages, self)
        else:
            profile = _Profile().extended(messages, self)
        self._last = profile
        return profile

    def chars(self, message: Message) -> int:
        known = self._chars.get(id(message))
        if known is None:
            known = self._chars[id(message)] = (message, message_chars(message))
        return known[1]

    def holds(self, message: Message, probe: str) -> bool:
        """Whether the message's normalised content contains `probe` (its `_chars` entry keeps it alive)."""
        self.chars(message)
        key = (id(message), probe)
        known = self._holds.get(key)
        if known is None:
            known = self._holds[key] = probe in _normalised(str(message.get("content") or ""))
        return known

    def whole(
        self, messages: Sequence[Message], budget: int, instruction: str, known_total: int | None
    ) -> Truncated | None:
        """`truncate`'s answer when it keeps every message, else None (it must cut, or may drop a leading
        `tool` message): the context's tokens within the budget and no `tool` message first after the
        kept head. O(added messages) for a growing context, but for a recorded prompt token count, whose
        share per message changes with every context (one pass in C)."""
        profile = self._profile(messages)
        tokens = profile.tokens(known_total)
        if tokens > budget:
            return None
        first_free = profile.first_after_head(instruction, self)
        if first_free < len(messages) and profile.roles[first_free] == "tool":
            return None
        return Truncated(messages=list(messages), dropped=0, tokens=tokens)


class _Profile:
    """The figures `MessageFacts` keeps of one context, each extended by the messages added to it."""

    def __init__(self) -> None:
        """The empty context's; `extended` gives every other."""
        self.messages: tuple[Message, ...] = ()
        self.chars: list[int] = []
        self.roles: list[Any] = []
        self.total_chars = 0
        self.plain_tokens = 0
        self.leading_system = 0  # how many messages from the front are system messages
        self._task: tuple[str, int | None, int | None] | None = None  # (instruction, task, first user)

    def tokens(self, known_total: int | None) -> int:
        """sum(`token_counts`), the shares of a known total summed in C (`_token_counts`' arithmetic)."""
        if not (known_total and self.total_chars):
            return self.plain_tokens
        scaled = map(operator.mul, self.chars, itertools.repeat(known_total))
        return sum(map(math.ceil, map(operator.truediv, scaled, itertools.repeat(self.total_chars))))

    def extended(self, messages: Sequence[Message], facts: MessageFacts) -> _Profile:
        added = messages[len(self.messages) :]
        chars = [facts.chars(m) for m in added]
        profile = _Profile()
        profile.messages = tuple(messages)
        profile.chars = self.chars + chars
        profile.roles = self.roles + [m.get("role") for m in added]
        profile.total_chars = self.total_chars + sum(chars)
        profile.plain_tokens = self.plain_tokens + sum(math.ceil(count / CHARS_PER_TOKEN) for count in chars)
        profile.leading_system = self.leading_system
        if self.leading_system == len(self.messages):
            while (
                profile.leading_system < len(profile.roles)
                and profile.roles[profile.leading_system] == "system"
            ):
                profile.leading_system += 1
        profile._task = self._task
        profile._carry_task(len(self.messages), facts)
        return profile

    def _carry_task(self, start: int, facts: MessageFacts) -> None:
        """The previous context's task search, carried over the messages from `start` on: a probe match
        found before stays the task; otherwise only the added user messages are searched."""
        if self._task is None:
            return
        instruction, task, first_user = self._task
        if task is None:
            probe = _task_probe(instruction)
            added_users = [i for i in range(start, len(self.roles)) if self.roles[i] == "user"]
            if first_user is None and added_users:
                first_user = added_users[0]
            if probe:
                task = next((i for i in added_users if facts.holds(self.messages[i], probe)), None)
        self._task = (instruction, task, first_user)

    def task(self, instruction: str, facts: MessageFacts) -> int | None:
        """`task_index` (not strict) of this context."""
        if self._task is None or self._task[0] != instruction:
            self._task = (instruction, None, None)
            self._carry_task(0, facts)
        _, task, first_user = self._task
        return task if task is not None else first_user

    def first_after_head(self, instruction: str, facts: MessageFacts) -> int:
        """Index of the first message `truncate` does not keep as head (system messages before the task,
        and the task): the first message that is not a leading system message, or the one after the task
        when only system messages precede it."""
        task = self.task(instruction, facts)
        if task is None or self.leading_system < task:
            return self.leading_system
        return task + 1


def token_counts(
    messages: Sequence[Message], known_total: int | None = None, facts: MessageFacts | None = None
) -> list[int]:
    """Estimated tokens per message: characters / 4, or, when the model call recorded its prompt token
    count, that count shared out in proportion to characters."""
    chars = facts.profile(messages)[0] if facts else [message_chars(m) for m in messages]
    return _token_counts(chars, known_total)


def _token_counts(chars: list[int], known_total: int | None) -> list[int]:
    if known_total and (total_chars := sum(chars)):
        return [math.ceil(known_total * count / total_chars) for count in chars]
    return [math.ceil(count / CHARS_PER_TOKEN) for count in chars]


def _normalised(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=64)
def _task_probe(instruction: str) -> str:
    return _normalised(instruction)[:_TASK_PROBE_CHARS]


def task_index(
    messages: Sequence[Message], instruction: str, *, strict: bool = False, facts: MessageFacts | None = None
) -> int | None:
    """Index of the task message: the first user message containing the start of the instruction, else
    (unless strict) the first user message. Agents often put a demonstration before the task, so "first
    user message" alone would keep the demonstration and lose the task."""
    roles = facts.profile(messages)[1] if facts else [message.get("role") for message in messages]
    return _task_index(messages, roles, instruction, strict=strict, facts=facts)


def _task_index(
    messages: Sequence[Message],
    roles: list[Any],
    instruction: str,
    *,
    strict: bool = False,
    facts: MessageFacts | None = None,
) -> int | None:
    probe = _task_probe(instruction)
    users = [i for i, role in enumerate(roles) if role == "user"]
    if probe:
        for index in users:
            message = messages[index]
            if (
                facts.holds(message, probe)
                if facts
                else probe in _normalised(str(message.get("content") or ""))
            ):
                return index
    if strict:
        return None
    return users[0] if users else None


@dataclass(frozen=True)
class Truncated:
    messages: list[Message]
    dropped: int  # messages removed from the front
    tokens: int  # estimated tokens kept


def truncate(
    messages: Sequence[Message],
    budget: int,
    *,
    instruction: str = "",
    known_total: int | None = None,
    facts: MessageFacts | None = None,
) -> Truncated:
    """Fit messages into `budget` tokens by dropping whole messages from the front.

    Always kept, even over budget: the system messages before the task and the task message itself.
    After them come the most recent messages that fit. A `tool` message whose assistant call was dropped
    is dropped too, so the result is still a valid chat. `facts`: a per-run `MessageFacts`, when the
    caller truncates many contexts sharing their messages.
    """
    if facts is not None:
        whole = facts.whole(messages, budget, instruction, known_total)
        if whole is not None:
            return whole
        chars, roles = facts.profile(messages)
    else:
        chars, roles = [message_chars(m) for m in messages], [m.get("role") for m in messages]
    counts = _token_counts(chars, known_total)
    task = _task_index(messages, roles, instruction, facts=facts)
    head = [i for i, role in enumerate(roles) if role == "system" and (task is None or i < task)]
    if task is not None:
        head.append(task)
    head_set = set(head)
    room = budget - sum(counts[i] for i in head)
    tail: list[int] = []
    for index in range(len(messages) - 1, -1, -1):
        if index in head_set:
            continue
        if counts[index] > room:
            break
        room -= counts[index]
        tail.append(index)
    tail.reverse()
    while tail and roles[tail[0]] == "tool":
        tail.pop(0)
    if len(tail) + len(head_set) == len(messages):  # nothing dropped: the usual case under the budget
        return Truncated(messages=list(messages), dropped=0, tokens=sum(counts))
    kept = sorted(head_set.union(tail))
    return Truncated(
        messages=[messages[i] for i in kept],
        dropped=len(messages) - len(kept),
        tokens=sum(counts[i] for i in kept),
    )
