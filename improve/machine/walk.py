"""One walk over a machine config: its transitions, its expressions and their literals, each with the JSON
path where it is written.

A path is a JSON path into the document as written, so a person or a model finds the spot by reading
it: `$.states.ask.on.GO[0].guard` when `GO` holds a list of transitions, `$.states.ask.on.GO.guard` when
it holds one, and keys that are not identifiers bracketed (`$.states['ask-model']`). Lint findings, gate
details and the overfit check all spell paths this way, because they all come from here.

    >>> for expr in expressions(config):
    ...     print(expr.path, expr.position, expr.source)
    $.states.route.choice[0].guard guard facts.requested > 100
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from improve.machine.config import (
    DECIDE_SRC,
    MachineConfig,
    StateConfig,
    TransitionConfig,
    TransitionSpec,
    transitions_of,
)
from improve.machine.expr import tokenize

__all__ = [
    "Constant",
    "Edge",
    "EdgeKind",
    "Expression",
    "Position",
    "TransitionList",
    "child_path",
    "edges",
    "expressions",
    "literals",
    "state_path",
    "transition_lists",
]

EdgeKind = Literal["choice", "on", "always", "onDone", "onError"]
Position = Literal["context", "guard", "assign", "invoke-input", "decision-input", "output"]
"""Where an expression sits: a context initialiser, a guard, an assign value, an actor's input, an
`agent.decide` request (its name, facts, payloads, prompt), or a final state's output."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def child_path(path: str, key: str) -> str:
    """`path.key`, or `path['key']` when the key is not an identifier (so the path stays unambiguous)."""
    if _IDENT.match(key):
        return f"{path}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{path}['{escaped}']"


def state_path(name: str) -> str:
    return child_path("$.states", name)


# --- transitions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Edge:
    """One transition, with the state it leaves, what kind of exit it is and where it is written."""

    state: str
    kind: EdgeKind
    path: str
    transition: TransitionConfig
    event: str | None = None
    """The event of an `on` transition."""

    @property
    def target(self) -> str | None:
        return self.transition.target

    @property
    def guarded(self) -> bool:
        """Whether it can be passed over: a guard other than the literal `true`."""
        guard = self.transition.guard
        return guard is not None and not (isinstance(guard, str) and guard.strip() == "true")


@dataclass(frozen=True, slots=True)
class TransitionList:
    """One list of transitions tried in order: `choice`, `on.EVENT`, `always`, `invoke.onDone` or
    `invoke.onError`."""

    path: str
    edges: tuple[Edge, ...]


def transition_lists(name: str, state: StateConfig) -> list[TransitionList]:
    """Every transition list of a state that is written, choice branches first (a choice state's exits),
    then `on` in document order, `always`, `invoke.onDone` and `invoke.onError`."""
    base = state_path(name)
    found: list[TransitionList] = []

    def add(
        kind: EdgeKind,
        path: str,
        spec: TransitionSpec | list[TransitionConfig] | None,
        event: str | None = None,
    ) -> None:
        if spec is None:
            return
        if isinstance(spec, list):
            items = [Edge(name, kind, f"{path}[{i}]", t, event) for i, t in enumerate(transitions_of(spec))]
        else:
            items = [Edge(name, kind, path, t, event) for t in transitions_of(spec)]
        found.append(TransitionList(path, tuple(items)))

    add("choice", f"{base}.choice", state.choice)
    for event, spec in state.on.items():
        add("on", child_path(f"{base}.on", event), spec, event)
    add("always", f"{base}.always", state.always)
    if state.invoke is not None:
        add("onDone", f"{base}.invoke.onDone", state.invoke.onDone)
        add("onError", f"{base}.invoke.onError", state.invoke.onError)
    return found


def edges(name: str, state: StateConfig) -> list[Edge]:
    """Every transition of a state, in the order of `transition_lists`."""
    return [edge for group in transition_lists(name, state) for edge in group.edges]


# --- expressions -----------------------------------------------------------------------------------


class Expression(NamedTuple):
    """One CEL string of a document."""

    path: str
    position: Position
    state: str | None
    """The state it belongs to; None for a context initialiser."""
    source: str


def _tree(tree: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every expression (a string) in an expression tree, with its path; other leaves are literals."""
    if isinstance(tree, str):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tree(value, child_path(path, str(key)))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _tree(value, f"{path}[{i}]")


def expressions(config: MachineConfig) -> Iterator[Expression]:
    """Every CEL string of `config` in document order: context, then per state its transitions' guards
    and assigns, its invoke input and its output."""
    for path, source in _tree(config.context, "$.context"):
        yield Expression(path, "context", None, source)
    for name, state in config.states.items():
        for edge in edges(name, state):
            if isinstance(edge.transition.guard, str):
                yield Expression(f"{edge.path}.guard", "guard", name, edge.transition.guard)
            for path, source in _tree(edge.transition.assign, f"{edge.path}.assign"):
                yield Expression(path, "assign", name, source)
        if state.invoke is not None:
            yield from _invoke_input(name, state)
        for path, source in _tree(state.output, f"{state_path(name)}.output"):
            yield Expression(path, "output", name, source)


def _invoke_input(name: str, state: StateConfig) -> Iterator[Expression]:
    assert state.invoke is not None
    path = f"{state_path(name)}.invoke.input"
    raw = state.invoke.input
    if state.invoke.src != DECIDE_SRC or not isinstance(raw, dict):
        for where, source in _tree(raw, path):
            yield Expression(where, "invoke-input", name, source)
        return
    for key, value in raw.items():
        if key == "allowedEvents":
            continue  # event names, not CEL
        if key == "payloads" and not isinstance(value, dict):
            continue  # not a decision request: lint's invalid-decide-input says so
        for where, source in _tree(value, child_path(path, key)):
            yield Expression(where, "decision-input", name, source)


# --- literals --------------------------------------------------------------------------------------


class Constant(NamedTuple):
    """A literal inside an expression: a quoted string (without its quotes) or a number."""

    path: str
    value: str | float


def literals(config: MachineConfig) -> Iterator[Constant]:
    """Every string and number literal written inside the expressions of `config`, with its path."""
    for expr in expressions(config):
        for token in tokenize(expr.source):
            if token.kind == "string" and token.text[:1] in "'\"":
                yield Constant(expr.path, token.text[1:-1])
            elif token.kind == "number":
                try:
                    yield Constant(expr.path, float(token.text.rstrip("uU")))
                except ValueError:
                    continue


class Comparison(NamedTuple):
    """A number an expression compares a selection with: `context.order.deliveredDaysAgo <= 30` is
    (`context.order.deliveredDaysAgo`, 30.0)."""

    path: str
    operand: str
    value: float


_COMPARISON_OPS = frozenset({"<", "<=", ">", ">=", "==", "!="})
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "."})


def _operators(tokens: list[Any]) -> list[tuple[int, int, str]]:
    """Where each operator is, as (first token, last token, text): `<=` is written as two tokens."""
    found: list[tuple[int, int, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        pair = tok.text + tokens[i + 1].text if i + 1 < len(tokens) else ""
        if (
            tok.kind == "punct"
            and pair in _COMPARISON_OPS
            and tokens[i + 1].start == tok.start + 1
            and tokens[i + 1].kind == "punct"
        ):
            found.append((i, i + 1, pair))
            i += 2
            continue
        if tok.kind == "punct":
            found.append((i, i, tok.text))
        i += 1
    return found


def compared(config: MachineConfig) -> Iterator[Comparison]:
    """Every number written as one side of a comparison whose other side is a plain selection
    (`a.b.c < 30`, `30 >= a.b.c`): the numbers a machine's guards compare each of its values with. A
    number inside arithmetic (`a + 1 >= b`) is compared with no selection of its own."""
    for expr in expressions(config):
        tokens = tokenize(expr.source)
        ops = _operators(tokens)
        for first, last, text in ops:
            if text not in _COMPARISON_OPS or first == 0 or last + 1 >= len(tokens):
                continue
            left = _selection_before(tokens, first)
            right = _selection_after(tokens, last + 1)
            before, after = tokens[first - 1], tokens[last + 1]
            # A number is alone when no arithmetic binds it to more (`a + 1 >= b` compares `a + 1`).
            number_after = after.kind == "number" and (
                last + 2 >= len(tokens) or tokens[last + 2].text not in _ARITHMETIC
            )
            number_before = before.kind == "number" and (
                first < 2 or tokens[first - 2].text not in _ARITHMETIC
            )
            sides = ((left, after if number_after else None), (right, before if number_before else None))
            for operand, number in sides:
                if operand is None or number is None:
                    continue
                try:
                    yield Comparison(expr.path, operand, float(number.text.rstrip("uU")))
                except ValueError:
                    continue


_MEASURED = frozenset({"<", "<=", ">", ">="})
"""Operators whose two sides measure one thing (with `+` and `-`): a count of days against a count of
days, an amount less an amount."""


def related(config: MachineConfig) -> Iterator[tuple[str, str]]:
    """Every two plain selections an expression compares (`<`, `<=`, `>`, `>=`) or adds or subtracts
    (`context.amount - context.policy.deductible`): quantities the machine itself treats as measuring
    one thing, in one unit. Equality is left out (an id equal to an id says nothing of units), and so
    are products and quotients (a price times months is neither)."""
    for expr in expressions(config):
        tokens = tokenize(expr.source)
        for first, last, text in _operators(tokens):
            if (text not in _MEASURED and text not in ("+", "-")) or first == 0 or last + 1 >= len(tokens):
                continue
            # Whatever else binds them: `a - b - c` relates `b` and `c` too.
            left = _selection_before(tokens, first, frozenset())
            right = _selection_after(tokens, last + 1, frozenset({"(", "["}))
            if left is not None and right is not None and left != right:
                yield left, right


_CALLED = frozenset({".", ")"})
"""What before a selection makes it a field of a call's result."""


def _selection_before(tokens: list[Any], end: int, bound: frozenset[str] = _ARITHMETIC) -> str | None:
    """The dotted selection ending just before token `end`, unless the token before it is in `bound`
    (by default: arithmetic binds it to more)."""
    parts: list[str] = []
    i = end - 1
    while i >= 0 and tokens[i].kind == "ident":
        parts.append(tokens[i].text)
        if i >= 2 and tokens[i - 1].text == "." and tokens[i - 2].kind == "ident":
            i -= 2
            continue
        i -= 1
        break
    if not parts or (i >= 0 and tokens[i].text in bound | _CALLED):
        return None
    return ".".join(reversed(parts))


def _selection_after(
    tokens: list[Any], start: int, bound: frozenset[str] = _ARITHMETIC | {"("}
) -> str | None:
    """The dotted selection starting at token `start`, unless the token after it is in `bound` (by
    default: arithmetic or a call binds it to more)."""
    parts: list[str] = []
    i = start
    while i < len(tokens) and tokens[i].kind == "ident":
        parts.append(tokens[i].text)
        if i + 2 < len(tokens) and tokens[i + 1].text == "." and tokens[i + 2].kind == "ident":
            i += 2
            continue
        i += 1
        break
    if not parts or (i < len(tokens) and tokens[i].text in bound):
        return None
    return ".".join(parts)
