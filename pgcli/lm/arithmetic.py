"""Countdown's arithmetic (docs/lm.md, "Tasks"): the value of an expression of non-negative integers with ``+ - *``
and brackets, and whether it uses only the given numbers; a small recursive-descent parser, no ``eval``."""

from __future__ import annotations

from collections.abc import Sequence


def _tokens(expr: str) -> list[str] | None:
    """Numbers, operators and brackets of ``expr`` (None on any other character or a number with a leading 0)."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isdigit():
            j = i
            while j < len(expr) and expr[j].isdigit():
                j += 1
            if expr[i] == "0" and j - i > 1:
                return None
            out.append(expr[i:j])
            i = j
        elif c in "+-*()":
            out.append(c)
            i += 1
        else:
            return None
    return out


def evaluate_expression(expr: str) -> int | None:
    """The integer value of an expression of non-negative integers, ``+ - *`` and parentheses with the usual
    precedence; None when it does not parse (no ``eval``: a small recursive-descent parser)."""
    tokens = _tokens(expr)
    if not tokens:
        return None
    parser = _Parser(tokens)
    value = parser.expression()
    return value if parser.pos == len(tokens) else None


class _Parser:
    """Recursive descent over :func:`_tokens`' output: expression = term (('+' | '-') term)*, term = factor ('*'
    factor)*, factor = number | '(' expression ')'. Each rule returns None when the input does not parse."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def factor(self) -> int | None:
        tok = self.peek()
        if tok == "(":
            self.pos += 1
            value = self.expression()
            if value is None or self.peek() != ")":
                return None
            self.pos += 1
            return value
        if tok is not None and tok.isdigit():
            self.pos += 1
            return int(tok)
        return None

    def term(self) -> int | None:
        value = self.factor()
        while value is not None and self.peek() == "*":
            self.pos += 1
            right = self.factor()
            value = None if right is None else value * right
        return value

    def expression(self) -> int | None:
        value = self.term()
        while value is not None and self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            right = self.term()
            value = None if right is None else (value + right if op == "+" else value - right)
        return value


def uses_given_numbers(expr: str, numbers: Sequence[int]) -> bool:
    """Every number in ``expr`` is one of ``numbers``, each used at most as often as it is given."""
    tokens = _tokens(expr)
    if tokens is None:
        return False
    left = list(numbers)
    for tok in tokens:
        if tok.isdigit():
            if int(tok) not in left:
                return False
            left.remove(int(tok))
    return True
