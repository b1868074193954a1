"""CEL expressions: compiled once, checked against an allowlist, evaluated against a scope.

The allowlist (docs/contracts.md, machine config):

- at most `MAX_EXPRESSION_LENGTH` characters;
- variables only from `ALLOWED_ROOTS` (`context`, `event`, `input`, `facts`);
- no comprehension macros (`all`, `exists`, `exists_one`, `map`, `filter`): a policy cannot loop;
- functions only from CEL's standard library (CEL itself has no I/O, so there is nothing else to reach).

Result types are checked where the position needs one: a guard must return a bool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from improve.errors import EvaluationError, ExpressionError, FastCelError, FastCelFallback, did_you_mean
from improve.machine import cel_library, celfix
from improve.machine.fastcel import compile_fast

MAX_EXPRESSION_LENGTH = 512
ALLOWED_ROOTS = frozenset({"context", "event", "input", "facts"})
COMPREHENSION_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

_TOKEN = re.compile(
    r"""
    (?P<string>[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?)
  | (?P<space>\s+)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_POSITION = re.compile(r"<input>:(\d+):(\d+)")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    start: int


def tokenize(source: str) -> list[Token]:
    """Split CEL source into tokens, string literals kept whole so their contents are never names."""
    return [
        Token(m.lastgroup or "punct", m.group(), m.start())
        for m in _TOKEN.finditer(source)
        if m.lastgroup != "space"
    ]


def referenced_paths(tokens: list[Token]) -> list[tuple[str, ...]]:
    """Dotted selections such as `facts.customer.refundsLast90d`, as tuples; method names excluded."""
    paths: list[tuple[str, ...]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == "ident" and not (i > 0 and tokens[i - 1].text == "."):
            parts = [tok.text]
            j = i + 1
            while (
                j + 1 < len(tokens)
                and tokens[j].text == "."
                and tokens[j + 1].kind == "ident"
                and not (j + 2 < len(tokens) and tokens[j + 2].text == "(")
            ):
                parts.append(tokens[j + 1].text)
                j += 2
            if not (j < len(tokens) and tokens[j].text == "(" and len(parts) == 1):
                paths.append(tuple(parts))
            i = j
        else:
            i += 1
    return paths


BOUND_SHOWN = 6
"""Values an evaluation error names at most (`Expr._bound`)."""
_ABSENT = object()


def _cel_type(value: Any) -> str:
    """The CEL type name of a Python value as the CEL extension converts it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class Expr:
    """A compiled CEL expression and the place it came from (for error messages)."""

    source: str
    where: str
    program: Any = field(repr=False, compare=False)
    roots: frozenset[str]
    paths: tuple[tuple[str, ...], ...]
    # Fast path (machine/fastcel/): converting the scope into a cel.Context costs ~1 µs per value, so
    # expressions in the supported subset run on the Python values directly, with cel's results.
    fast: Callable[[Mapping[str, Any]], Any] | None = field(default=None, repr=False, compare=False)

    def evaluate(self, scope: Scope) -> Any:
        if self.fast is not None:  # fast path, see `fast` above
            try:
                return self.fast(scope.values)
            except FastCelError as err:
                raise EvaluationError(
                    f"{self.where}: `{self.source}` failed{self._bound(scope)}: {err}"
                ) from None
            except FastCelFallback:
                pass  # a value outside the fast path's domain (a tuple, a uint...): cel decides
        try:
            return self.program.execute(scope.cel_context(self.roots))
        except Exception as err:  # the CEL extension raises KeyError, TypeError, ValueError, RuntimeError
            detail = cel_error_detail(err)
            raise EvaluationError(
                f"{self.where}: `{self.source}` failed{self._bound(scope)}: {detail}"
            ) from None

    def _bound(self, scope: Scope) -> str:
        """` with a.b = 1000 (int), ...`: the values the expression read, with their CEL types, so a
        failure says which input made it (an int probe beside a double fact), not only where."""
        shown = []
        for path in list(dict.fromkeys(self.paths))[:BOUND_SHOWN]:
            value: Any = scope.values
            why = ""
            for depth, part in enumerate(path):
                parent = value
                value = value.get(part, _ABSENT) if isinstance(value, Mapping) else _ABSENT
                if value is _ABSENT:
                    if isinstance(parent, Mapping):
                        # A key misspelt in the expression: the keys the map has say which was meant.
                        why = did_you_mean(part, [k for k in parent if isinstance(k, str)])
                    elif depth:  # a field selected on a value that has none
                        why = f" ({'.'.join(path[:depth])} is a {_cel_type(parent)}, which has no fields)"
                    break
            if value is _ABSENT:
                shown.append(f"{'.'.join(path)} absent{why}")
            else:
                text = json.dumps(value, default=str)
                text = text if len(text) <= 40 else text[:37] + "..."
                shown.append(f"{'.'.join(path)} = {text} ({_cel_type(value)})")
        return f" with {', '.join(shown)}" if shown else ""

    def check_bool(self, scope: Scope) -> bool:
        value = self.evaluate(scope)
        if not isinstance(value, bool):
            raise EvaluationError(
                f"{self.where}: guard `{self.source}` returned {type(value).__name__} {value!r}, "
                "expected a bool"
            )
        return value


def cel_error_detail(err: Exception) -> str:
    """The first line of a `cel` error, as improve reports it (a helper of `celfix` in its own words)."""
    if isinstance(err, KeyError):
        return f"no such key {err}"
    return celfix.unwrap(str(err).split("\n")[0])


def compile_cel(source: str) -> Any:
    """`source` compiled by `cel`, rewritten where cel departs from the CEL specification (`celfix`);
    raises what `cel.compile` raises on the source as written."""
    cel = cel_library.cel()  # imported here: only commands that compile a guard pay for it

    program = cel.compile(source)
    fixed = celfix.rewrite(source)
    if fixed != source:
        try:
            return cel.compile(fixed)
        except Exception:  # the rewrite is not valid CEL: keep cel's own reading
            return program
    return program


def compile_expr(source: str, where: str, roots: Iterable[str] = ALLOWED_ROOTS) -> Expr:
    """Compile one CEL expression, enforcing the allowlist; errors name `where` and the column."""
    allowed = frozenset(roots)
    if not isinstance(source, str):
        raise ExpressionError(f"{where}: expected a CEL expression (a string), got {type(source).__name__}")
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(
            f"{where}: expression is {len(source)} characters; at most {MAX_EXPRESSION_LENGTH} are allowed"
        )
    if not source.strip():
        raise ExpressionError(f"{where}: empty expression")
    tokens = tokenize(source)
    for i, tok in enumerate(tokens):
        if (
            tok.kind == "ident"
            and tok.text in COMPREHENSION_MACROS
            and i > 0
            and tokens[i - 1].text == "."
            and i + 1 < len(tokens)
            and tokens[i + 1].text == "("
        ):
            raise ExpressionError(
                f"{where}: column {tok.start + 1}: comprehension macro `{tok.text}` is not allowed "
                "(policies cannot loop); compare fields directly instead"
            )
    try:
        program = compile_cel(source)
    except Exception as err:
        message = str(err)
        pos = _POSITION.search(message)
        column = f"column {pos.group(2)}: " if pos else ""
        first = message.split("\n")[0]
        detail = first.split("ERROR: <input>:")[-1]
        detail = re.sub(r"^\d+:\d+: ", "", detail)
        raise ExpressionError(f"{where}: CEL syntax error at {column}{detail} in `{source}`") from None
    used = set(program.variables())
    unknown = sorted(used - allowed)
    if unknown:
        raise ExpressionError(
            f"{where}: unknown variable {', '.join(repr(u) for u in unknown)} in `{source}`; "
            f"expressions may read only {', '.join(sorted(allowed))}"
        )

    paths = tuple(p for p in referenced_paths(tokens) if p[0] in allowed)
    return Expr(
        source=source,
        where=where,
        program=program,
        roots=frozenset(used),
        paths=paths,
        fast=compile_fast(source),  # None outside the subset: cel evaluates it
    )


class Scope:
    """The variables an expression sees during one step; converted to CEL lazily, root by root.

    Converting Python values into CEL is the expensive part of evaluation, so a root is converted at
    most once per step and only when an expression reads it.
    """

    __slots__ = ("_ctx", "_have", "values")

    def __init__(self, **values: Any) -> None:
        self.values: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        self._ctx: Any = None
        self._have: set[str] = set()

    @classmethod
    def of(cls, values: dict[str, Any]) -> Scope:
        """A scope over `values` as given (roots that are None must already be left out): the
        interpreter's hot path, without keyword packing."""
        scope = cls.__new__(cls)
        scope.values = values
        scope._ctx = None
        scope._have = set()
        return scope

    def cel_context(self, roots: frozenset[str]) -> Any:
        if self._ctx is None:
            self._ctx = cel_library.cel().Context()
            celfix.register(self._ctx)
        for root in roots:
            if root not in self._have and root in self.values:
                self._ctx.add_variable(root, self.values[root])
                self._have.add(root)
        return self._ctx


# An expression tree compiled: an Expr at each string, dicts and lists kept, literals as they are.
CompiledTree = Any


def compile_tree(tree: Any, where: str, roots: Iterable[str] = ALLOWED_ROOTS) -> CompiledTree:
    allowed = frozenset(roots)
    if isinstance(tree, str):
        return compile_expr(tree, where, allowed)
    if isinstance(tree, Mapping):
        return {key: compile_tree(value, f"{where}.{key}", allowed) for key, value in tree.items()}
    if isinstance(tree, list):
        return [compile_tree(value, f"{where}[{i}]", allowed) for i, value in enumerate(tree)]
    return tree


def evaluate_tree(tree: CompiledTree, scope: Scope) -> Any:
    if isinstance(tree, Expr):
        return tree.evaluate(scope)
    if isinstance(tree, dict):
        return {key: evaluate_tree(value, scope) for key, value in tree.items()}
    if isinstance(tree, list):
        return [evaluate_tree(value, scope) for value in tree]
    return tree


def tree_exprs(tree: CompiledTree) -> list[Expr]:
    """Every expression in a compiled tree, in document order."""
    if isinstance(tree, Expr):
        return [tree]
    if isinstance(tree, dict):
        return [e for value in tree.values() for e in tree_exprs(value)]
    if isinstance(tree, list):
        return [e for value in tree for e in tree_exprs(value)]
    return []
