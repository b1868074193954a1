"""Expressions: every CEL position holds CEL that compiles under the allowlist.

Codes: invalid-expression
"""

from __future__ import annotations

import re

from improve.errors import ExpressionError
from improve.machine.expr import ALLOWED_ROOTS, compile_expr
from improve.machine.lint.document import Document, relative
from improve.machine.walk import Expression, Position, expressions

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_CEL_CONSTANTS = frozenset({"true", "false", "null"})
_QUOTING = "every expression position holds CEL, so a literal string is quoted inside it (\"'text'\")"
_WHAT: dict[Position, str] = {
    "context": "context initialiser",
    "guard": "guard",
    "assign": "assign value",
    "invoke-input": "invoke input",
    "decision-input": "decision input",
    "output": "output",
}


def check(doc: Document) -> None:
    for expr in expressions(doc.config):
        _expression(doc, expr)


def _expression(doc: Document, expr: Expression) -> None:
    path, source, state = expr.path, expr.source, expr.state
    try:
        compile_expr(source, path)
    except ExpressionError as err:
        detail = str(err).removeprefix(f"{path}: ")
        what = _WHAT[expr.position]
        where = (
            f"In state '{state}', the {what} at {relative(path, state)}"
            if state is not None
            else f"The {what} at {path}"
        )
        hint = ""
        word = source.strip()
        if _IDENT.match(word) and word not in ALLOWED_ROOTS and word not in _CEL_CONSTANTS:
            # A bare word is most often an event name or outcome that lost its quotes.
            hint = f" If you meant the literal string, write \"'{word}'\"."
        doc.add(
            "invalid-expression",
            "error",
            path,
            f"{where} is not a valid expression: {detail}.{hint} Fix the CEL; {_QUOTING}.",
        )
