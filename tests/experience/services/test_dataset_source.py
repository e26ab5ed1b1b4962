"""The read path's parsing of step rows' blob_refs (no database: texts as Postgres or SQLite render them)."""

from __future__ import annotations

import json

from experience.services.dataset_source import _refs_parsed
from experience.steps import CONTEXT

A, B, C, D, X = (letter * 64 for letter in "abcdx")


def refs(**values) -> str:
    return json.dumps(values)  # spaced as Postgres renders jsonb


def test_blob_refs_parse_as_json_and_a_context_that_grows_shares_the_digests_already_parsed():
    texts = [
        refs(request_messages=[A, B]),
        "{}",
        refs(output=X),
        refs(request_messages=[A, B, C, D]),  # grew by two
        refs(request_messages=[A, B, C, D, X], response_json=X),  # more than a context: parsed whole
        refs(request_messages=[A, X]),  # not an extension
        refs(request_messages=[A, X], k=[C]),  # the list ends where the last one did
        refs(request_messages=[A, X + "y"]),  # a digest the last one ended with, longer
        refs(request_messages=[A, X, C], k=[D]),  # an extension, then another key
        refs(request_messages=[A, X + "y", B]),  # extends the one before last
    ]

    parsed = _refs_parsed(texts)

    assert parsed == [json.loads(text) for text in texts]
    assert parsed[3][CONTEXT][1] is parsed[0][CONTEXT][1], "the first two digests parsed once"
    assert parsed[9][CONTEXT][1] is parsed[7][CONTEXT][1]
    assert parsed[4][CONTEXT][1] is not parsed[3][CONTEXT][1]


def test_text_after_a_context_that_is_not_a_list_of_digests_is_parsed_whole():
    first = refs(request_messages=[A])
    texts = [first, first[:-2] + ', "' + B + '"], "k": ["' + C + '"]}', first[:-2] + ', ["' + B + '"]]}']

    assert _refs_parsed(texts) == [json.loads(text) for text in texts]
