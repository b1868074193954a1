"""Rule evals: the environment's guards tested at the cheapest level, with no model, tool or person.

Each eval starts the machine from an input, sends events (tool answers included) straight to the
interpreter, and checks where it lands and which next events the rules accept or refuse. Each names
the states whose rules it covers, so coverage is visible: a guarded state no eval covers is a gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from improve.errors import ImproveError, did_you_mean
from improve.machine.interpreter import Machine, can, initial, transition
from improve.machine.walk import edges


@dataclass(frozen=True)
class RuleEval:
    name: str
    covers: tuple[str, ...]
    """The states whose rules this eval exercises."""
    input: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    """Sent in order from the initial snapshot; each must be accepted."""
    state: str | None = None
    """Where the machine must be after the events."""
    accepts: list[dict[str, Any]] = field(default_factory=list)
    """Events the rules must accept at that point."""
    refuses: list[dict[str, Any]] = field(default_factory=list)
    """Events the rules must refuse at that point."""


@dataclass(frozen=True)
class RuleResult:
    name: str
    covers: tuple[str, ...]
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "covers": list(self.covers), "ok": self.ok, "detail": self.detail}


def run_rule_eval(machine: Machine, rule: RuleEval) -> RuleResult:
    def result(ok: bool, detail: str) -> RuleResult:
        return RuleResult(rule.name, rule.covers, ok, detail)

    states = machine.config.states
    for name in (rule.state, *rule.covers):
        if name is not None and name not in states:
            return result(
                False,
                f"names state '{name}', which is no state of the machine"
                + (did_you_mean(name, states) or f"; its states: {', '.join(states)}"),
            )
    try:
        snapshot = initial(machine, rule.input)
        for number, event in enumerate(rule.events, start=1):
            nxt = transition(machine, snapshot, event)
            if nxt is snapshot:
                return result(False, f"event {number} {event} was refused in state '{snapshot.value}'")
            snapshot = nxt
        if rule.state is not None and snapshot.value != rule.state:
            return result(False, f"ended in '{snapshot.value}', expected '{rule.state}'")
        for event in rule.accepts:
            if not can(machine, snapshot, event):
                return result(False, f"{event} was refused in '{snapshot.value}'; the rules must accept it")
        for event in rule.refuses:
            if can(machine, snapshot, event):
                return result(False, f"{event} was accepted in '{snapshot.value}'; the rules must refuse it")
    except ImproveError as err:
        return result(False, f"the machine failed: {err}")
    return result(True, f"in '{snapshot.value}' as expected")


def run_rule_evals(machine: Machine, rules: list[RuleEval]) -> list[RuleResult]:
    return [run_rule_eval(machine, rule) for rule in rules]


def guarded_states(machine: Machine) -> list[str]:
    """States with at least one guarded transition: the rules an eval should cover."""
    names = []
    for name, state in machine.config.states.items():
        if any(edge.transition.guard is not None for edge in edges(name, state)):
            names.append(name)
    return names


def uncovered(machine: Machine, results: list[RuleResult]) -> list[str]:
    covered = {state for r in results for state in r.covers}
    return [s for s in guarded_states(machine) if s not in covered]
