"""A tiny RFC 4180 CSV writer (rows end with CRLF)."""

from collections.abc import Iterable


def quote_field(value: object, *, delimiter: str = ",") -> str:
    text = "" if value is None else str(value)
    if delimiter in text or "\n" in text:
        return '"' + text + '"'
    return text


def format_row(values: Iterable[object], *, delimiter: str = ",") -> str:
    return delimiter.join(quote_field(v, delimiter=delimiter) for v in values)


def format_rows(rows: Iterable[Iterable[object]], *, delimiter: str = ",") -> str:
    return "".join(format_row(row, delimiter=delimiter) + "\r\n" for row in rows)
