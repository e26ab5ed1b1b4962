"""Split an arithmetic expression into numbers (float) and operator strings."""

import re

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(.))")
OPERATORS = set("+-*/()")


def tokenize(text: str) -> list[float | str]:
    tokens: list[float | str] = []
    for number, op in _TOKEN.findall(text.strip()):
        if number:
            tokens.append(float(number))
        elif op in OPERATORS:
            tokens.append(op)
        else:
            raise SyntaxError(f"unexpected character {op!r}")
    return tokens
