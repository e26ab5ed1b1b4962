"""The re-tokenised path, incremental: each message tokenised once, and the samples exactly what re-tokenising
every call's whole request from scratch gives (tokens, loss mask, logprobs, calls, forks and their causes)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime

import pytest

from experience.distill.rl_samples import (
    Fork,
    ModelCall,
    Sample,
    assemble,
    chatml_segments,
    fork_cause,
    model_calls,
    tokenizer_encoder,
)
from experience.records import MessageRecord, TrajectoryRecord
from tests.experience.distill.rl_traffic import TokenServer, agent_run

TURNS = 30


@pytest.fixture
def server(tokenizer_path):
    return TokenServer(tokenizer_path)


class CountingEncoder:
    """The real tokenizer's encoder, keeping every text it was asked to tokenise."""

    def __init__(self, path):
        self.encode = tokenizer_encoder(str(path))
        self.texts: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.texts.append(text)
        return self.encode(text)


# --- rollouts as harnesses shape them ---------------------------------------------------------------------


def compacted_twice(turn, messages):
    if turn in (4, 17):
        return [messages[0], {"role": "user", "content": f"Summary of earlier turns, at turn {turn}."}]
    return messages


def reminder_inserted_then_edited(turn, messages):
    if turn == 3:  # a reminder inserted before the last assistant turn
        reminder = {"role": "system", "content": "<system-reminder>3 steps left</system-reminder>"}
        return [*messages[:-2], reminder, *messages[-2:]]
    if turn == 9:  # the same reminder edited in place
        return [{**m, "content": "<system-reminder>2 steps left</system-reminder>"}
                if "<system-reminder>" in m["content"] else m for m in messages]
    return messages


def earlier_turn_rerendered(turn, messages):
    if turn != 6:
        return messages
    edited = [dict(m) for m in messages]
    edited[2] = {**edited[2], "content": ""}  # the harness drops the text of its first assistant turn
    return edited


def arguments_reserialised(turn, messages):
    # The harness re-serialises its past tool calls' arguments: the same calls, other JSON text. On the
    # message level that still extends (the calls parse the same), though the echo renders differently.
    if turn != 5:
        return messages
    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
        json.loads(c["function"]["arguments"]), indent=1)}} for c in m["tool_calls"]]}
        if m.get("tool_calls") else m for m in messages]


def role_changed(turn, messages):
    if turn != 8:
        return messages
    return [*messages[:1], {**messages[1], "role": "assistant"}, *messages[2:]]


def reminder_appended(turn, messages):
    reminder = {"role": "user", "content": f"<system-reminder>{TURNS - turn} steps left</system-reminder>"}
    return [*messages, reminder] if turn % 7 == 3 else messages


def long_tool_outputs(turn, messages):
    return [{**m, "content": m["content"] + " ok" * 200}
            if m["role"] == "tool" and m.get("tool_call_id") == f"call_{turn - 1}" else m for m in messages]


ROLLOUTS = {
    "plain": (None, []),
    "compaction": (compacted_twice, ["compaction", "compaction"]),
    "system_reminder": (reminder_inserted_then_edited, ["system_reminder", "system_reminder"]),
    "rerendered_turn": (earlier_turn_rerendered, ["rerendered_turn"]),
    "arguments_reserialised": (arguments_reserialised, []),
    "edited_history": (role_changed, ["edited_history"]),
    "reminder_appended": (reminder_appended, []),
    "long_outputs": (long_tool_outputs, []),
}


def shared(calls: list[ModelCall]) -> list[ModelCall]:
    """The calls with each message one record shared by every call that holds it, as the store reads them."""
    records: dict[str, MessageRecord] = {}

    def one(message: MessageRecord) -> MessageRecord:
        return records.setdefault(json.dumps(asdict(message), sort_keys=True), message)

    return [ModelCall(seq=c.seq, messages=[one(m) for m in c.messages], response=c.response) for c in calls]


# --- the reference: every call's request re-tokenised from scratch ---------------------------------------


def same_message(old: MessageRecord, new: MessageRecord) -> bool:
    """The rule for "the same message": equal, or equal but for tool-call arguments' JSON spelling."""
    def calls(message):
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.tool_calls or []]
    return old == new or ((old.role, old.content, old.tool_call_id) == (new.role, new.content, new.tool_call_id)
                          and calls(old) == calls(new))


def from_scratch(message: MessageRecord, encode, *, generated: bool = False) -> tuple[list[int], list[int]]:
    header, body = chatml_segments(message)
    head, rest = encode(header), encode(body)
    return head + rest, [0] * len(head) + [1 if generated else 0] * len(rest)


def reference_samples(calls: list[ModelCall], encode) -> list[Sample]:
    """Each call's whole request and its response rendered and tokenised anew; a call extends the last
    sample when its request begins, message by message, with what that sample carried, and the sample takes
    the tokens of the messages past those; else a sample starts with all of them, its fork's cause judged as
    `fork_cause` judges it. Quadratic on purpose: nothing is reused between calls."""
    samples: list[Sample] = []
    for call in calls:
        rendered = [from_scratch(m, encode) for m in call.messages]
        answer = from_scratch(call.response, encode, generated=True)
        last = samples[-1] if samples else None
        history = last.history if last else []
        extends = last is not None and len(call.messages) >= len(history) and all(
            same_message(old, new) for old, new in zip(history, call.messages, strict=False))
        if extends:
            fresh = rendered[len(history):]
        else:
            fork = None
            if last is not None:
                cause, index, detail = fork_cause(history, call.messages)
                fork = Fork(call.seq, cause, index, None, detail)
            last = Sample(index=len(samples), exact=False, fork=fork)
            samples.append(last)
            fresh = rendered
        for ids, mask in [*fresh, answer]:
            last.token_ids += ids
            last.loss_mask += mask
            last.logprobs += [None] * len(ids)
        last.calls.append(call.seq)
        last.policy_versions.append(None)
        last.history = [*call.messages, call.response]
    return samples


# --- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sharing", ["built_one_by_one", "shared_as_stored"])
@pytest.mark.parametrize("name", list(ROLLOUTS))
def test_the_incremental_samples_are_exactly_those_of_retokenising_every_request_from_scratch(
    server, tokenizer_path, name, sharing
):
    edit, causes = ROLLOUTS[name]
    calls = model_calls(agent_run(server, TURNS, with_ids=False, edit=edit))
    if sharing == "shared_as_stored":
        calls = shared(calls)
    assembly = assemble(calls, encode=tokenizer_encoder(str(tokenizer_path)))
    reference = reference_samples(calls, tokenizer_encoder(str(tokenizer_path)))
    assert [asdict(s) for s in assembly.samples] == [asdict(s) for s in reference]
    assert [fork.cause for fork in assembly.forks] == causes
    assert sum(len(s.calls) for s in assembly.samples) == TURNS


def test_forks_keep_their_step_message_and_detail(server, tokenizer_path):
    calls = model_calls(agent_run(server, TURNS, with_ids=False, edit=reminder_inserted_then_edited))
    forks = assemble(calls, encode=tokenizer_encoder(str(tokenizer_path))).forks
    assert [(f.seq, f.cause, f.message_index, f.token_index) for f in forks] == \
        [(3, "system_reminder", 6, None), (9, "system_reminder", 6, None)]
    assert ["inserted" in forks[0].detail, "edited" in forks[1].detail] == [True, True]


def test_the_reference_itself_forks_where_a_changed_earlier_message_is(server, tokenizer_path):
    # Guards the guard: from scratch, the rerendered turn starts a new sample at its call and no other.
    calls = model_calls(agent_run(server, TURNS, with_ids=False, edit=earlier_turn_rerendered))
    reference = reference_samples(calls, tokenizer_encoder(str(tokenizer_path)))
    assert [s.calls[0] for s in reference] == [0, 6]
    assert reference[1].fork.message_index == 2


@pytest.mark.parametrize("name", list(ROLLOUTS))
def test_no_text_of_a_rollout_is_tokenised_twice(server, tokenizer_path, name):
    edit, _ = ROLLOUTS[name]
    calls = model_calls(agent_run(server, TURNS, with_ids=False, edit=edit))
    counting = CountingEncoder(tokenizer_path)
    assembly = assemble(calls, encode=counting)
    repeated = sorted({text for text in counting.texts if counting.texts.count(text) > 1})
    assert repeated == []
    # Each distinct message once: its body, and its role's header once per rollout.
    messages = {json.dumps(asdict(m), sort_keys=True): m for c in calls for m in [*c.messages, c.response]}
    assert len(counting.texts) <= len(messages) + len({m.role for m in messages.values()})
    assert assembly.samples


def test_a_call_that_extends_tokenises_only_the_messages_it_adds(server, tokenizer_path):
    calls = model_calls(agent_run(server, TURNS, with_ids=False))
    counting = CountingEncoder(tokenizer_path)
    assemble(calls[:-1], encode=counting)
    before = len(counting.texts)
    counting.texts.clear()
    assemble(calls, encode=counting)
    # One more call: its new tool result and its response, each a body (headers are known by then).
    assert len(counting.texts) - before == 2
    assert set(counting.texts[-2:]) == {chatml_segments(calls[-1].messages[-1])[1], chatml_segments(calls[-1].response)[1]}


@pytest.mark.django_db
def test_stored_runs_without_ids_give_the_from_scratch_samples(server, tokenizer_path, settings):
    # The store's path: contexts read back as deltas, their messages shared between calls.
    from experience.distill import rl_samples
    from experience.services.ingest import trajectory_ingest
    from experience.services.rl_samples import run_samples

    settings.TROVE_RL_TOKENIZERS = {"no-ids": str(tokenizer_path)}
    rl_samples._cached_encoder.cache_clear()
    ids = {}
    for name in ("compaction", "system_reminder", "rerendered_turn", "arguments_reserialised"):
        steps = agent_run(server, TURNS, with_ids=False, edit=ROLLOUTS[name][0])
        record = TrajectoryRecord(source="rollout", source_format="trove-rollout", source_ref=f"inc:{name}",
                                  task_key="task-0", status="completed", reward=1.0, started_at=datetime.now(UTC),
                                  steps=steps, metadata={"model_endpoint": "no-ids"})
        ids[name] = trajectory_ingest(record=record, rollout_runner=True)[0].pk
    assemblies = run_samples(trajectory_ids=list(ids.values()))
    for name, trajectory_id in ids.items():
        calls = model_calls(agent_run(TokenServer(tokenizer_path), TURNS, with_ids=False, edit=ROLLOUTS[name][0]))
        reference = reference_samples(calls, tokenizer_encoder(str(tokenizer_path)))
        assert [asdict(s) for s in assemblies[trajectory_id].samples] == [asdict(s) for s in reference], name
        assert [f.cause for f in assemblies[trajectory_id].forks] == ROLLOUTS[name][1]


@pytest.mark.parametrize(
    ("change", "forks"),
    [
        ({"content": "Fix the other failing test."}, True),
        ({"role": "system"}, True),
        ({"tool_call_id": "call_x"}, True),
        ({"tool_calls": [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}, True),
        ({"name": "harness"}, False),  # a name is not part of "the same message" (`fork_cause`)
        ({}, False),
    ],
)
def test_a_change_in_any_field_of_an_earlier_unshared_message_is_seen(server, tokenizer_path, change, forks):
    calls = model_calls(agent_run(server, 6, with_ids=False))
    last = calls[-1]
    copied = [MessageRecord(**asdict(m)) for m in last.messages]  # nothing shared with the call before
    copied[1] = MessageRecord(**{**asdict(copied[1]), **change})
    calls[-1] = ModelCall(seq=last.seq, messages=copied, response=last.response)
    assembly = assemble(calls, encode=tokenizer_encoder(str(tokenizer_path)))
    assert [asdict(s) for s in assembly.samples] == \
        [asdict(s) for s in reference_samples(calls, tokenizer_encoder(str(tokenizer_path)))]
    assert [(f.seq, f.message_index) for f in assembly.forks] == ([(5, 1)] if forks else [])
