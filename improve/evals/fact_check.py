"""What a scenario's decisions see, checked against the facts the environment declares.

A value a scenario gives that its declared type does not allow (`category: harrassment` for an
enumeration of `harassment`, `spam`, ...; a number written as text) is accepted by the machine and the
run: the model reads it, a learned rule over the fact silently never matches it, and the scenario
teaches nothing about that rule. `improve scenarios check` runs each scenario once, in memory, with the
environment's `careful` stand-in deciding, and names every decision fact of those runs whose value is
not of its declared type, and a run that stops (a tool that crashes on the scenario's world, such as
`monthsInArrears: two` where the tool reads a number): `improve run` would stop the suite on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from improve.evals.out_of_sample import REFERENCE_MODEL
from improve.evals.scenarios import Scenario
from improve.evals.suite import run_scenario
from improve.log import MemoryStore
from improve.runtime import Decision, DecisionRequest, Environment, FactType, Model, split_unit


class _Seeing:
    """A decider that answers as the model does and keeps every request it was asked."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.requests: list[DecisionRequest] = []

    def decide(self, request: DecisionRequest) -> Decision:
        self.requests.append(request)
        return Decision(event=self.model.answer(request).event, source="model")


@dataclass(frozen=True)
class ReferenceCheck:
    """What one run of a scenario with `careful`, in memory, shows."""

    problems: list[str]
    """That the run stops, and each declared fact of its decisions whose value its type does not allow."""
    unreached: str | None = None
    """Why the run fails the scenario's label, when it ran through and does (the label is the person's:
    a warning, worth a second look before a round learns from it)."""


def reference_check(env: Environment, scenario: Scenario) -> ReferenceCheck:
    """One run of the scenario with `careful`: that it stops (`a run with careful stops: actor
    'accounts.lookup' crashed ...`), each declared fact of its decisions whose value its type does not
    allow (`decision 'moderate': post.category = 'harrassment' is not one of [...]`), and whether it
    ends as labelled. Nothing when the environment has no `careful` stand-in (the check of the input
    names a run that cannot start; the stand-in is what makes a run here without asking a model)."""
    from improve.evals.outcome import outcome_row

    factory = env.models.get(REFERENCE_MODEL)
    if factory is None:
        return ReferenceCheck([])
    seeing = _Seeing(factory(f"{scenario.id}:check"))
    store, thread = MemoryStore(), f"check:{scenario.id}"
    problems: list[str] = []
    try:
        run_scenario(env, scenario, seeing, store, thread, hashes=False)
    except Exception as err:  # a tool's own bug is the scenario's problem to name, whatever it raises
        said = str(err).removeprefix(f"thread {thread}: ") or repr(err)
        problems.append(
            f"a run with {REFERENCE_MODEL} stops: {said} (`improve run` would stop the suite on it)"
        )
    # The requests made before it stopped are checked all the same.
    for request in seeing.requests:
        for path, kind in env.fact_types.get(request.name, {}).items():
            found, value = _at(request.facts, path)
            why = _mistyped(value, kind) if found else None
            if why:
                problems.append(f"decision '{request.name}': {path} = {value!r} {why}")
    problems = list(dict.fromkeys(problems))
    if problems:
        return ReferenceCheck(problems)
    row = outcome_row(env, scenario, thread, store.read(thread))
    return ReferenceCheck([], None if row.passed else row.reason)


def _at(facts: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = facts
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _mistyped(value: Any, kind: FactType) -> str | None:
    """Why `value` is not of the declared `kind`, or None (a None value: the fact is absent here)."""
    if value is None:
        return None
    base, _ = split_unit(kind)
    if isinstance(base, tuple):
        return None if value in base else f"is not one of its declared values {list(base)}"
    expected = {
        "number": (int, float),
        "int": (int,),
        "bool": (bool,),
        "text": (str,),
        "string": (str,),
        "list": (list,),
    }.get(str(base))
    if expected is None:
        return None
    if isinstance(value, bool) and bool not in expected:
        return f"is a bool, declared {base}"
    return None if isinstance(value, expected) else f"is a {type(value).__name__}, declared {base}"


def reference_disagrees(env: Environment, scenario: Scenario) -> str | None:
    """`reference_check`'s `unreached`: why `careful` does not reach the scenario's label (a typo in an
    effect's id, the wrong final state), or None."""
    return reference_check(env, scenario).unreached
