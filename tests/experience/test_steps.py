"""Rebuilding model-call contexts on the read path: full lists read as deltas, messages shared (ORM-free)."""

from __future__ import annotations

import hashlib
import json

import pytest

from experience.records import MessageRecord
from experience.steps import (
    CONTEXT,
    ContextMessages,
    canonical_json,
    contexts_as_deltas,
    full_contexts,
    step_record_from_parts,
)


def message_blobs(count: int) -> tuple[list[str], dict[str, bytes]]:
    blobs = {}
    for n in range(count):
        content = canonical_json(MessageRecord("user" if n % 2 else "assistant", f"message {n}").as_openai())
        blobs[hashlib.sha256(content).hexdigest()] = content
    return list(blobs), blobs


def test_a_full_list_that_extends_the_one_before_reads_as_a_delta_on_it():
    h, _ = message_blobs(6)
    ids = [10, 11, 12, 13, 14]
    refs = [
        {CONTEXT: h[:2]},
        {"output": h[5]},  # not a model call
        {CONTEXT: h[:4]},  # grew by two
        {CONTEXT: [h[0], h[4]]},  # truncated: shares the first message
        {CONTEXT: [h[5]]},  # shares nothing
    ]

    contexts = contexts_as_deltas(ids, refs)

    assert contexts == {
        10: h[:2],
        12: {"extends": 10, "keep": 2, "append": h[2:4]},
        13: {"extends": 12, "keep": 1, "append": [h[4]]},
        14: [h[5]],
    }


def test_stored_deltas_are_kept_and_a_base_with_a_larger_id_is_not_used():
    h, _ = message_blobs(4)
    stored_delta = {"extends": 7, "keep": 2, "append": [h[2]]}

    rows = [(7, {CONTEXT: h[:2]}), (9, {CONTEXT: stored_delta}), (12, {CONTEXT: h[:3]}), (11, {CONTEXT: h[:4]})]

    contexts = contexts_as_deltas([step_id for step_id, _ in rows], [refs for _, refs in rows])

    assert contexts == {
        7: h[:2],
        9: stored_delta,
        12: {"extends": 7, "keep": 2, "append": [h[2]]},
        11: h[:4],  # it follows 12 in the rows, but a base comes before the steps that extend it
    }


def test_each_context_is_rebuilt_in_full_with_each_message_parsed_once_and_shared():
    h, blobs = message_blobs(8)
    ids = [1, 2, 3, 4, 5]
    refs = [{CONTEXT: h[:2]}, {CONTEXT: h[:4]}, {CONTEXT: {"extends": 2, "keep": 4, "append": h[4:6]}},
            {CONTEXT: [h[0], h[6]]}, {CONTEXT: h[:7]}]  # fmt: skip
    cache = ContextMessages(blobs)

    built = cache.contexts(contexts_as_deltas(ids, refs))

    expected = full_contexts(dict(zip(ids, refs, strict=True)))
    for step_id, digests in expected.items():
        assert built[step_id] == [MessageRecord(**json.loads(blobs[d])) for d in digests]
        assert all(message is cache[d] for message, d in zip(built[step_id], digests, strict=True))
    assert len(cache) == 7, "each distinct message parsed once"
    assert len({id(messages) for messages in built.values()}) == len(built), "each context a list of its own"


def test_a_delta_whose_base_was_not_given_is_named():
    h, blobs = message_blobs(2)

    with pytest.raises(KeyError, match="step 5: the context it extends \\(step 4\\) was not given"):
        ContextMessages(blobs).contexts({5: {"extends": 4, "keep": 1, "append": [h[1]]}})


def test_a_context_rebuilt_by_the_caller_is_taken_as_it_is():
    h, blobs = message_blobs(2)
    context = [MessageRecord("user", "from the caller")]

    record = step_record_from_parts(
        kind="model_call", payload={"response_text": "ok"}, blob_refs={CONTEXT: h}, blobs=blobs, context=context
    )

    assert record.request_messages is context and record.response_text == "ok"
