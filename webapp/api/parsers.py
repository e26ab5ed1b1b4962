"""The API's JSON body parser: DRF's, with the importers' nesting limit (experience.importers.limits).

DRF's JSONParser turns a ValueError into a 400 but lets the RecursionError of a deeply nested body through as a
500; and a body a little under Python's recursion limit parses, then fails later wherever it is walked again
(`json.dumps` on the way to the database). Both are refused here with a 400 that says why.
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from experience.importers.limits import MAX_JSON_DEPTH, nesting_exceeds


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_too_deep()) from None
        if nesting_exceeds(data, MAX_JSON_DEPTH):
            raise ParseError(_too_deep())
        return data


def _too_deep() -> str:
    return f"JSON parse error - the body nests deeper than {MAX_JSON_DEPTH} levels"
