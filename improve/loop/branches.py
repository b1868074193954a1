"""A policy's rules before the model, and how safe each answer is.

A policy the loop writes starts in a `choice` state: guarded branches, each to a final whose output is
one answer, tried in order, then an unguarded default (the model). Two questions about such branches
come up when a new one is added and when a candidate is checked:

- *Which answer is safer?* An answer leads, through the environment's machine, to final states; the
  environment ranks final states by `safety_order` (least safe lowest). An answer's rank is the lowest
  rank among the finals it can reach without an error (sentinels excluded: the guards keep them
  unreachable), so an answer is called safer only when even its worst outcome is.
- *Where does a branch go?* `insert_branch` puts it at a given position; `offered` is the condition a
  mined branch carries so that it never answers an option the environment does not offer (it falls
  through to the next branch, or the model, instead).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from improve.errors import ImproveError
from improve.machine import (
    DECIDE_SRC,
    Expr,
    MachineConfig,
    Scope,
    StateConfig,
    TransitionConfig,
    canonical_json,
    compile_expr,
)
from improve.runtime import Environment


@dataclass(frozen=True)
class Branch:
    """One branch of a policy's first `choice` state."""

    index: int
    guard: str | None
    """CEL source (None for the default branch, and for a named guard)."""
    target: str
    output: Mapping[str, Any] | None
    """The output tree of the final it leads to (CEL per field), None when it leads elsewhere."""

    @property
    def event(self) -> str | None:
        """The answer's event type, when the output names it as a literal (`'CLOSE'`)."""
        kind = (self.output or {}).get("type")
        if isinstance(kind, str) and len(kind) >= 2 and kind[0] == kind[-1] and kind[0] in "'\"":
            return kind[1:-1]
        return None

    def answer(self) -> str:
        """The output as written, for messages: `REFUND{amount: facts.order.refundable}`."""
        return answer_text(self.output) if self.output is not None else self.target


@dataclass(frozen=True)
class DiscardedBranch:
    """A branch a discarded candidate added against a policy, as its CHANGELOG entry wrote it (guard
    and answer), and the round that discarded it."""

    guard: str
    answer: str
    round: str


def answer_text(output: Mapping[str, Any]) -> str:
    """A final's output tree as one answer: `ROUTE{queue: 'billing'}`, `REFUND{amount: facts.x}`."""
    kind = str(output.get("type", "?"))
    name = kind[1:-1] if len(kind) >= 2 and kind[0] == kind[-1] and kind[0] in "'\"" else kind
    fields = ", ".join(f"{k}: {v}" for k, v in output.items() if k != "type")
    return f"{name}{{{fields}}}" if fields else name


def route(policy: MachineConfig) -> list[Branch]:
    """The branches of the policy's initial state when it is a `choice` (empty otherwise)."""
    state = policy.states.get(policy.initial)
    if state is None or state.type != "choice" or not state.choice:
        return []
    branches = []
    for index, transition in enumerate(state.choice):
        target = transition.target or ""
        final = policy.states.get(target)
        output = (
            final.output if final is not None and final.is_final and isinstance(final.output, dict) else None
        )
        guard = transition.guard if isinstance(transition.guard, str) else None
        branches.append(Branch(index, guard, target, output))
    return branches


@functools.lru_cache(maxsize=4096)
def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def fact_at(facts: Mapping[str, Any], path: str) -> Any:
    """The value at `path` (`facts.order.total`) in a decision's facts; None when absent."""
    parts = _parts(path)
    if parts[0] != "facts":
        return None
    node: Any = facts
    # The rule miner asks this of every decision for every condition it tries: a plain dict is taken
    # without `isinstance` against the Mapping ABC, which cost as much as the rest of the walk.
    for part in parts[1:]:
        if (type(node) is not dict and not isinstance(node, Mapping)) or part not in node:
            return None
        node = node[part]
    return node


def decision_input(
    name: str, facts: Mapping[str, Any], options: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A recorded decision as a policy machine's `input` (what `DecisionRequest.to_input` gives)."""
    return {
        "name": name,
        "options": list(options),
        "facts": dict(facts),
        "attempts": [],
        "prompt": "",
        "allowedEvents": sorted({str(o.get("type")) for o in options}),
        "payloads": {},
    }


def holds_on(expr: Expr, example: Mapping[str, Any], facts: Mapping[str, Any] | None = None) -> bool | None:
    """The condition on a training decision (evidence.py's example), with its facts replaced by `facts`
    when given; None when CEL cannot evaluate it there (a missing fact, a type error)."""
    seen = dict(example.get("facts") or {}) if facts is None else dict(facts)
    request = decision_input(str(example.get("name", "")), seen, example.get("options") or [])
    try:
        value = expr.evaluate(Scope(input=request, facts=seen, context={}, event={}))
    except ImproveError:
        return None
    return value if isinstance(value, bool) else None


_PATTERN_MARKS = re.compile(r"\(\?i\)|\\b|\\s\+|\\s\*")


def pattern_words(pattern: str) -> str:
    """The words a text test's regular expression looks for (`(?i)\\bfree\\s+trial\\b` -> `free trial`)."""
    return " ".join(_PATTERN_MARKS.sub(" ", pattern).split())


def same_answer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two options are the same answer (numbers compared as numbers: 75 is 75.0)."""
    if a.get("type") != b.get("type") or set(a) != set(b):
        return False
    return all(_same_value(a[k], b[k]) for k in a)


def _same_value(x: Any, y: Any) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
    return bool(float(x) == float(y)) if numbers else bool(x == y)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> Expr:
    # answer_on runs over every held-out decision: each branch's guard and output compile once.
    return compile_expr(source, "branch")


def answer_on(branches: Sequence[Branch], example: Mapping[str, Any]) -> tuple[Branch, dict[str, Any]] | None:
    """The first guarded branch that answers the decision `example` (`name`, `facts`, `options`), with
    its answer evaluated there; None when an unguarded branch (the model) or nothing answers."""
    facts = example.get("facts") or {}
    request = decision_input(str(example.get("name", "")), facts, example.get("options") or [])
    scope = Scope(input=request, facts=dict(facts), context={}, event={})
    for branch in branches:
        if branch.guard is None:
            return None
        try:
            if _compiled(branch.guard).evaluate(scope) is not True:
                continue
            if branch.output is None:
                return None
            answer = {k: _compiled(str(v)).evaluate(scope) for k, v in branch.output.items()}
        except ImproveError:
            continue
        return branch, answer
    return None


def decision_key(name: Any, facts: Any, options: Any) -> str:
    """A decision (its name, facts and options) as canonical JSON: the key `answers` gives it."""
    return canonical_json([name, facts, options])


def answers(
    branches: Sequence[Branch], new: set[int], decisions: Iterable[Mapping[str, Any]]
) -> frozenset[tuple[str, str]]:
    """What the branches numbered `new` answer among `decisions` (`name`, `facts`, `options`): each
    decision they answer first, with the answer, both as canonical JSON. Two candidates with the same
    set answer the same decisions the same way: one candidate, whatever their guards say."""
    found = set()
    for example in decisions:
        fired = answer_on(branches, example)
        if fired is not None and fired[0].index in new:
            key = decision_key(example.get("name"), example.get("facts"), example.get("options"))
            found.add((key, canonical_json(fired[1])))
    return frozenset(found)


def offered(output: Mapping[str, Any]) -> str:
    """The CEL condition that the answer `output` (a final's output tree) is among the offered options."""
    fields = ", ".join(f"'{k}': {v}" for k, v in output.items())
    return "{" + fields + "} in input.options"


def _targets(spec: Any) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, TransitionConfig):
        return [spec.target] if spec.target else []
    if isinstance(spec, list):
        return [t for item in spec for t in _targets(item)]
    return []


def _next(state: StateConfig) -> list[str]:
    """The states a state leads to, error paths excluded."""
    found = [t for spec in state.on.values() for t in _targets(spec)]
    found += _targets(state.always) + _targets(state.choice or [])
    if state.invoke is not None:
        found += _targets(state.invoke.onDone)
    return found


def outcomes(env: Environment) -> dict[str, dict[str, frozenset[str]]]:
    """Per decision name, per event it allows: the final states reachable after that answer."""
    config = env.config
    found: dict[str, dict[str, frozenset[str]]] = {}
    for state in config.states.values():
        if state.invoke is None or state.invoke.src != DECIDE_SRC:
            continue
        raw = state.invoke.input or {}
        name = str(raw.get("name", "")).strip("'\"")
        for event in raw.get("allowedEvents", []):
            finals: set[str] = set()
            todo = _targets(state.on.get(event))
            seen: set[str] = set()
            while todo:
                current = todo.pop()
                if current in seen or current not in config.states:
                    continue
                seen.add(current)
                target = config.states[current]
                if target.is_final:
                    if not target.is_sentinel:
                        finals.add(current)
                    continue
                todo += _next(target)
            found.setdefault(name, {})[event] = frozenset(finals)
    return found


def answer_rank(env: Environment, event: str | None, decisions: Iterable[str] | None = None) -> int | None:
    """How safe answering `event` is: the lowest `safety_order` rank among the finals it can reach
    (over the given decisions, or all). None when unknown: no ranked final, or a final without a rank."""
    if event is None:
        return None
    reachable: set[str] = set()
    for name, events in outcomes(env).items():
        if decisions is None or name in decisions:
            reachable |= events.get(event, frozenset())
    if not reachable or any(state not in env.safety_order for state in reachable):
        return None
    return min(env.safety_order[state] for state in reachable)


def insert_branch(
    policy: Mapping[str, Any],
    guard: str,
    output: Mapping[str, Any],
    position: int,
    *,
    version: str,
    name: str,
    description: str,
) -> dict[str, Any]:
    """The policy document with one more branch at `position` of its initial `choice` state (made in
    front of the old initial state when there is none), leading to a new final that answers `output`."""
    doc = copy.deepcopy(dict(policy))
    doc["version"] = version
    states: dict[str, Any] = doc["states"]
    final = name
    n = 2
    while final in states:
        final = f"{name}_{n}"
        n += 1
    states[final] = {"type": "final", "description": description, "output": dict(output)}
    branch = {"guard": guard, "target": final}
    initial = states[doc["initial"]]
    if initial.get("type") == "choice" and isinstance(initial.get("choice"), list) and initial["choice"]:
        choices = initial["choice"]
        # Never after the default (last, unguarded) branch.
        limit = len(choices) - 1 if "guard" not in choices[-1] else len(choices)
        choices.insert(max(0, min(position, limit)), branch)
    else:
        route_name = "route" if "route" not in states else "route_rules"
        states[route_name] = {
            "type": "choice",
            "description": "Rules before the model.",
            "choice": [branch, {"target": doc["initial"]}],
        }
        doc["initial"] = route_name
    return doc


def added(baseline: MachineConfig, candidate: MachineConfig) -> list[Branch]:
    """The candidate's branches that the baseline does not have (by guard and answer)."""
    before = {(b.guard, b.answer()) for b in route(baseline)}
    return [b for b in route(candidate) if b.guard is not None and (b.guard, b.answer()) not in before]
