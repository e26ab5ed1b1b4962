"""Recursive-descent evaluator.

expr   := term (("+" | "-") term)*
term   := factor (("*" | "/") factor)*
factor := "-" factor | "(" expr ")" | number
"""

from .lexer import tokenize


class _Parser:
    def __init__(self, tokens: list[float | str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> float | str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> float | str | None:
        token = self.peek()
        self.pos += 1
        return token

    def expr(self) -> float:
        left = self.term()
        if self.peek() in ("+", "-"):
            op = self.take()
            right = self.expr()
            return left + right if op == "+" else left - right
        return left

    def term(self) -> float:
        left = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.factor()
            left = left * right if op == "*" else left / right
        return left

    def factor(self) -> float:
        token = self.take()
        if token == "-":
            return -self.factor()
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise SyntaxError("expected )")
            return value
        if isinstance(token, float):
            return token
        raise SyntaxError(f"unexpected {token!r}")


def evaluate(text: str) -> float:
    parser = _Parser(tokenize(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise SyntaxError(f"unexpected {parser.peek()!r}")
    return value
