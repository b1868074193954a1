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

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
