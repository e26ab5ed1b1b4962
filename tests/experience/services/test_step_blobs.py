"""Splitting steps into inline fields and content-addressed blobs, and back (ORM-free: no database)."""

from __future__ import annotations

import json

from experience.records import MessageRecord, StepRecord
from experience.steps import (
    INLINE_LIMIT,
    PAYLOAD_BLOB,
    BlobSink,
    canonical_json,
    prepare_step,
    refs_json,
    step_record_from_parts,
    storable,
)


def round_trip(step: StepRecord) -> tuple[StepRecord, dict]:
    sink = BlobSink()
    prepared = prepare_step(step, sink)
    payload = json.loads(prepared.payload_json)
    back = step_record_from_parts(kind=step.kind, payload=payload, blob_refs=prepared.blob_refs, blobs=sink.contents,
                                  started_at=step.started_at, ended_at=step.ended_at, duration_ms=step.duration_ms,
                                  exit_code=step.exit_code, tokens_in=step.tokens_in, tokens_out=step.tokens_out,
                                  call_id=step.call_id, is_error=step.is_error)
    return back, prepared.blob_refs


def test_short_text_stays_inline_and_long_text_goes_to_a_blob():
    step = StepRecord(kind="command", command="cat big.log", output="x" * (INLINE_LIMIT + 1), text="short")

    back, refs = round_trip(step)

    assert back == step
    assert set(refs) == {"output"}


def test_an_empty_output_comes_back_empty_not_missing():
    step = StepRecord(kind="command", command="true", output="", exit_code=0)

    assert round_trip(step)[0].output == ""


def test_text_postgres_cannot_hold_moves_the_payload_to_a_blob_and_back():
    for awkward in ("NUL \x00 byte", "lone \ud83d surrogate"):
        step = StepRecord(kind="observation", text=awkward, payload={"source": awkward})

        back, refs = round_trip(step)

        assert back == step
        assert PAYLOAD_BLOB in refs
        assert not storable(awkward)


def test_a_literal_backslash_u0000_is_ordinary_text_and_stays_inline():
    step = StepRecord(kind="observation", text='printf "\\u0000"', payload={"note": "\\u0000"})

    back, refs = round_trip(step)

    assert back == step and refs == {}


def test_a_growing_context_is_hashed_once_per_message():
    system, task = MessageRecord("system", "be careful"), MessageRecord("user", "fix it")
    reply, output = MessageRecord("assistant", "ls"), MessageRecord("tool", "a.py")
    sink = BlobSink()

    first = prepare_step(StepRecord(kind="model_call", request_messages=[system, task]), sink)
    second = prepare_step(StepRecord(kind="model_call", request_messages=[system, task, reply, output]), sink)

    assert second.blob_refs["request_messages"][:2] == first.blob_refs["request_messages"]
    assert len(sink.contents) == 4
    assert sink.contents[first.blob_refs["request_messages"][0]] == canonical_json(system.as_openai())


def test_a_context_list_grown_in_place_is_not_mistaken_for_the_previous_one():
    context = [MessageRecord("system", "s")]
    sink = BlobSink()
    first = prepare_step(StepRecord(kind="model_call", request_messages=context), sink).blob_refs["request_messages"]
    context.append(MessageRecord("user", "u"))

    second = prepare_step(StepRecord(kind="model_call", request_messages=context), sink).blob_refs["request_messages"]

    assert len(first) == 1 and len(second) == 2 and second[0] == first[0]


def test_refs_json_is_the_json_of_the_refs():
    refs = {"output": "a" * 64, "request_messages": ["b" * 64, "c" * 64]}

    assert json.loads(refs_json(refs)) == refs
    assert json.loads(refs_json({})) == {}
