"""A run's decisions as a value set reads them, derived once: what the store keeps so that a build need not
read the run's steps again.

Everything in a value row that does not depend on the spec or on the run's outcome comes from the run's
steps alone: each decision's context (before truncation), the action, the rubric labels and counts before
it. `derive` works these out from a record (the expensive part of a build: steps rebuilt, commands parsed,
the rubric folded); `RunDigest.encode` packs them into a few kilobytes (each distinct message once, each
context as the previous one plus what it adds, zstd over JSON), which the store keeps per run
(`experience.models.RunDigest`) and `RunDigest.decode` unpacks. `RunDigest.inputs` then makes the value
rows' inputs for a spec: truncation to its budget, the stats of the cut. Every value row is made this way,
from a digest derived on the spot or read from the store, so both give the same rows.

Two things outside the steps go in: the run's instruction (a context rebuilt from the steps inserts the task
when the run never showed it), which the store checks by its hash, and DIGEST_VERSION, which names the
derivation (this format, the decision rules and the rubric): a digest of another version is derived again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import zstandard

from experience import zstd
from experience.distill import chat
from experience.distill.decisions import Decision, decision_points
from experience.distill.rubric import RUBRIC_VERSION, Rubric, RubricState, labels_of, rubric
from experience.records import MessageRecord, TrajectoryRecord
from experience.steps import json_loads

DIGEST_VERSION = f"digest-1+{RUBRIC_VERSION}"
ZSTD_LEVEL = 3

Row = dict[str, Any]
STATS_KEYS = (
    "actions_before",
    "errors_before",
    "test_runs_before",
    "passed_test_runs_before",
    "source_edits_before",
    "context_tokens",
    "context_dropped",
)


class DigestError(ValueError):
    """Bytes that are not a digest of this version."""


@dataclass(frozen=True)
class DecisionDigest:
    """One decision: the record step it starts at, its context as the previous decision's first `keep`
    messages plus `added` (indexes into the run's messages), the prompt token count if the call recorded
    it, the action (a message index) and the rubric state before it (an index into the run's states)."""

    record_step: int
    keep: int
    added: tuple[int, ...]
    known_total: int | None
    action: int
    state: int


@dataclass(frozen=True)
class RunDigest:
    """A run's decisions (`DecisionDigest`), the messages they refer to (each distinct message once) and
    the distinct rubric states before them: (labels, [errors, test runs, passed test runs, source edits])."""

    messages: tuple[chat.Message, ...]
    states: tuple[tuple[dict[str, bool], tuple[int, int, int, int]], ...]
    decisions: tuple[DecisionDigest, ...]

    def encode(self) -> bytes:
        document = {
            "version": DIGEST_VERSION,
            "messages": self.messages,
            "states": self.states,
            "decisions": [
                [d.record_step, d.keep, d.added, d.known_total, d.action, d.state] for d in self.decisions
            ],
        }
        return zstd.compress(_dumps(document), level=ZSTD_LEVEL)

    @classmethod
    def decode(cls, data: bytes) -> RunDigest:
        try:
            document = json_loads(zstd.decompress(data))
        except (zstandard.ZstdError, ValueError) as error:
            raise DigestError(f"not a run digest: {error}") from error
        if not isinstance(document, dict) or document.get("version") != DIGEST_VERSION:
            found = document.get("version") if isinstance(document, dict) else None
            raise DigestError(f"run digest version {found!r}, not {DIGEST_VERSION!r}")
        return cls(
            messages=tuple(document["messages"]),
            states=tuple((labels, tuple(counts)) for labels, counts in document["states"]),
            decisions=tuple(
                DecisionDigest(step, keep, tuple(added), known, action, state)
                for step, keep, added, known, action, state in document["decisions"]
            ),
        )

    def inputs(self, budget_tokens: int, instruction: str) -> Iterator[Row]:
        """What a value model sees at each decision (no targets): the context cut to the budget, the
        action, rubric labels and stats before it. The rows share their message dicts (writers encode each
        distinct message once: `writers.RowEncoder`); they must not be changed."""
        facts = chat.MessageFacts()
        context: list[chat.Message] = []
        count = len(self.decisions)
        for t, decision in enumerate(self.decisions, start=1):
            context = context[: decision.keep] + [self.messages[i] for i in decision.added]
            cut = chat.truncate(
                context, budget_tokens, instruction=instruction, known_total=decision.known_total, facts=facts
            )
            labels, counts = self.states[decision.state]
            yield {
                "step_index": t,
                "step_count": count,
                "record_step": decision.record_step,
                "messages": cut.messages,
                "action": self.messages[decision.action],
                "rubric": dict(labels),
                "stats": decision_stats(counts, cut, actions_before=t - 1),
            }


def derive(record: TrajectoryRecord, scored: Rubric | None = None) -> RunDigest:
    """The digest of a run's steps (`scored`: its rubric, when the caller has it)."""
    decisions = decision_points(record)
    scored = scored if scored is not None else rubric(record)
    table = _Table()
    states: dict[RubricState, int] = {}
    contexts = _DecisionContexts(record, decisions)
    previous: list[chat.Message] = []
    digests = []
    for decision in decisions:
        context, known_total = contexts.before(decision)
        keep = len(previous) if chat.extends(context, previous) else 0
        state = scored.state_before(decision.first_step)
        if state not in states:
            states[state] = len(states)
        digests.append(
            DecisionDigest(
                record_step=decision.first_step,
                keep=keep,
                added=tuple(table.index(message) for message in context[keep:]),
                known_total=known_total,
                action=table.index(chat.decision_message(record, decision)),
                state=states[state],
            )
        )
        previous = context
    return RunDigest(
        messages=tuple(table.messages),
        states=tuple((labels_of(state), rubric_counts(state)) for state in states),
        decisions=tuple(digests),
    )


def _shared_messages(records: list[MessageRecord], shared: dict[int, chat.Message]) -> list[chat.Message]:
    messages = []
    for record in records:
        message = shared.get(id(record))
        if message is None:
            message = shared[id(record)] = record.as_openai()
        messages.append(message)
    return messages


class _DecisionContexts:
    """What the model saw before each of a run's decisions, in order: (messages, the prompt token count if
    the call recorded it). A recorded request that starts with the
    previous one's message records (a harness growing its history) becomes the previous context plus
    the added messages; the conversation rebuilt from the steps is made only if a decision needs it."""

    def __init__(self, record: TrajectoryRecord, decisions: list[Decision]) -> None:
        self._record = record
        self._decisions = decisions
        self._shared: dict[int, chat.Message] = {}
        self._last: tuple[list[MessageRecord], list[chat.Message]] = ([], [])
        self._entries: tuple[list[chat.Entry], list[int]] | None = None

    def before(self, decision: Decision) -> tuple[list[chat.Message], int | None]:
        if decision.model_call is not None:
            call = self._record.steps[decision.model_call]
            if call.request_messages:
                return self._requested(call.request_messages), call.tokens_in
        # No recorded request: the conversation rebuilt from the steps, up to the decision's first step.
        entries, entry_steps = self._rebuilt()
        cut = bisect.bisect_left(entry_steps, decision.first_step)
        return [entry.message for entry in entries[:cut]], None

    def _requested(self, records: list[MessageRecord]) -> list[chat.Message]:
        previous, messages = self._last
        if chat.extends(records, previous):
            messages = messages + _shared_messages(records[len(previous) :], self._shared)
        else:
            messages = _shared_messages(records, self._shared)
        self._last = (records, messages)
        return messages

    def _rebuilt(self) -> tuple[list[chat.Entry], list[int]]:
        if self._entries is None:
            entries = chat.rebuild_conversation(self._record, self._decisions)
            self._entries = (entries, [entry.step_index for entry in entries])
        return self._entries


def instruction_hash(instruction: str) -> str:
    """What the store keeps of the instruction a digest was derived with."""
    return hashlib.sha256(instruction.encode("utf-8", "surrogatepass")).hexdigest()


class _Table:
    """Messages by identity, each given an index once (a run's contexts share their message objects)."""

    def __init__(self) -> None:
        self.messages: list[chat.Message] = []
        self._index: dict[int, int] = {}

    def index(self, message: chat.Message) -> int:
        found = self._index.get(id(message))
        if found is None:
            found = self._index[id(message)] = len(self.messages)
            self.messages.append(message)
        return found


def rubric_counts(state: RubricState) -> tuple[int, int, int, int]:
    """The counts of a rubric state a row's stats hold: errors, test runs, passed test runs, source edits."""
    return (state.errors, state.test_runs, state.passed_test_runs, state.source_edits)


def decision_stats(
    counts: tuple[int, int, int, int], cut: chat.Truncated, *, actions_before: int
) -> dict[str, int]:
    """Counts a value model may use (the keys of STATS_KEYS, in order): the rubric's before the action
    (`rubric_counts`; at the end, for outcome rows) and what truncation kept of the context."""
    errors, test_runs, passed, edits = counts
    return {
        "actions_before": actions_before,
        "errors_before": errors,
        "test_runs_before": test_runs,
        "passed_test_runs_before": passed,
        "source_edits_before": edits,
        "context_tokens": cut.tokens,
        "context_dropped": cut.dropped,
    }


def _dumps(document: Any) -> bytes:
    """JSON bytes; text orjson refuses (a lone surrogate from a harness's output) goes through json, which
    escapes it (and `json_loads` reads the escape back)."""
    try:
        return orjson.dumps(document)
    except TypeError:
        return json.dumps(document, separators=(",", ":")).encode("ascii")
