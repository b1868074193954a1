"""A guard's boolean structure: its atoms joined by `&&`, `||` and `!`.

`parse_formula("facts.a > 3 && !(facts.b || facts.t.matches('x'))")` gives the tree of `and`, `or`
and `not` over three atoms, each the source text of a condition that is not itself a conjunction,
disjunction or negation (`facts.a > 3`, `facts.b`, `facts.t.matches('x')`). Checks that reason about
where two guards overlap (which combinations of conditions both accept) evaluate the atoms one by one
and recombine them with `holds`.

Only the boolean layer is parsed (over `expr.tokenize`, so string literals stay whole): anything
inside an atom is left to CEL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from improve.machine.expr import Token, tokenize


@dataclass(frozen=True)
class Formula:
    op: str
    """`atom`, `not`, `and` or `or`."""
    parts: tuple[Formula, ...] = ()
    source: str = ""
    """The atom's CEL source (for `atom`)."""

    def atoms(self) -> list[str]:
        """The distinct atoms, in order of first appearance."""
        if self.op == "atom":
            return [self.source]
        seen: list[str] = []
        for part in self.parts:
            for atom in part.atoms():
                if atom not in seen:
                    seen.append(atom)
        return seen

    def holds(self, truth: Callable[[str], bool | None]) -> bool | None:
        """The formula's value from its atoms' (None where an atom's value is unknown and it matters)."""
        if self.op == "atom":
            return truth(self.source)
        if self.op == "not":
            inner = self.parts[0].holds(truth)
            return None if inner is None else not inner
        values = [p.holds(truth) for p in self.parts]
        decisive = self.op == "or"  # a true part decides an `or`, a false one an `and`
        if decisive in values:
            return decisive
        return None if None in values else not decisive


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos].text if self.pos < len(self.tokens) else None

    def formula(self) -> Formula:
        parts = [self.conjunction()]
        while self.peek() == "|" and self._pair("|"):
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Formula("or", tuple(parts))

    def conjunction(self) -> Formula:
        parts = [self.unary()]
        while self.peek() == "&" and self._pair("&"):
            parts.append(self.unary())
        return parts[0] if len(parts) == 1 else Formula("and", tuple(parts))

    def _pair(self, char: str) -> bool:
        """Consume `&&` or `||` (the tokenizer yields each character as its own token)."""
        nxt = self.tokens[self.pos + 1] if self.pos + 1 < len(self.tokens) else None
        if nxt is None or nxt.text != char:
            return False
        self.pos += 2
        return True

    def unary(self) -> Formula:
        if self.peek() == "!" and not self._is_not_equal():
            self.pos += 1
            return Formula("not", (self.unary(),))
        if self.peek() == "(":
            close = self._matching(self.pos)
            if close is not None and self._ends_operand(close + 1):
                self.pos += 1
                inner = self.formula()
                self.pos = close + 1
                return inner
        return self.atom()

    def _is_not_equal(self) -> bool:
        nxt = self.tokens[self.pos + 1] if self.pos + 1 < len(self.tokens) else None
        return nxt is not None and nxt.text == "=" and nxt.start == self.tokens[self.pos].start + 1

    def _matching(self, start: int) -> int | None:
        depth = 0
        for i in range(start, len(self.tokens)):
            text = self.tokens[i].text
            if text in "([{":
                depth += 1
            elif text in ")]}":
                depth -= 1
                if depth == 0:
                    return i
        return None

    def _ends_operand(self, index: int) -> bool:
        """After a parenthesized group: the end, `)`, `&&` or `||` (else the group is part of an atom,
        as in `(a + b) > c`)."""
        if index >= len(self.tokens):
            return True
        text = self.tokens[index].text
        if text == ")":
            return True
        nxt = self.tokens[index + 1].text if index + 1 < len(self.tokens) else ""
        return text in "&|" and nxt == text

    def atom(self) -> Formula:
        start = self.pos
        depth = 0
        while self.pos < len(self.tokens):
            tok = self.tokens[self.pos]
            if tok.text in "([{":
                depth += 1
            elif tok.text in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and tok.text in "&|" and self._doubled(self.pos):
                break
            self.pos += 1
        if self.pos == start:
            raise ValueError(f"expected a condition at {self._where(start)}")
        return Formula("atom", source=self._text(start, self.pos))

    def _doubled(self, index: int) -> bool:
        nxt = self.tokens[index + 1] if index + 1 < len(self.tokens) else None
        return nxt is not None and nxt.text == self.tokens[index].text

    def _text(self, start: int, end: int) -> str:
        last: Token = self.tokens[end - 1]
        return self.source[self.tokens[start].start : last.start + len(last.text)].strip()

    def _where(self, index: int) -> str:
        return f"character {self.tokens[index].start + 1}" if index < len(self.tokens) else "the end"


def parse_formula(source: str) -> Formula:
    """The boolean structure of a guard; the whole source as one atom when it has none (or cannot
    be split, such as a `?:` at the top)."""
    parser = _Parser(source)
    if any(t.text == "?" for t in parser.tokens):
        return Formula("atom", source=source.strip())  # `?:` binds loosest: not split here
    try:
        formula = parser.formula()
    except ValueError:
        return Formula("atom", source=source.strip())
    if parser.pos != len(parser.tokens):
        return Formula("atom", source=source.strip())
    return formula
