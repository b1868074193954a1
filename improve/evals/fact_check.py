"""What a scenario's decisions see, checked against the facts the environment declares.

A value a scenario gives that its declared type does not allow (`category: harrassment` for an
enumeration of `harassment`, `spam`, ...; a number written as text) is accepted by the machine and the
run: the model reads it, a learned rule over the fact silently never matches it, and the scenario
teaches nothing about that rule. `improve scenarios check` runs each scenario once, in memory, with the
environment's `careful` stand-in deciding, and names every decision fact of those runs whose value is
not of its declared type, and a run that stops (a tool that crashes on the scenario's world, such as
`monthsInArrears: two` where the tool reads a number): `improve run` would stop the suite on it.
It also warns of a people script's answer that run never gave whose waiting state's rules refuse it
with every context the run passed through: a run of a model that takes another path there ends there,
failed (`improve run` says so, and goes on).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from improve.errors import MachineError, PeopleScriptError
from improve.evals.out_of_sample import REFERENCE_MODEL
from improve.evals.scenarios import Scenario, ScenarioLines
from improve.evals.suite import run_scenario
from improve.log import END_EVENT, INIT_EVENT, USAGE_EVENT, EntryView, MemoryStore
from improve.machine import JsonPath, Machine, Snapshot, can, initial, refusing_guard, transition
from improve.runtime import (
    Decision,
    DecisionRequest,
    Environment,
    FactType,
    Model,
    Refused,
    input_facts,
    split_unit,
)


class _Seeing:
    """A decider that answers as the model does and keeps every request it was asked."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.requests: list[DecisionRequest] = []

    def decide(self, request: DecisionRequest) -> Decision:
        self.requests.append(request)
        return Decision(event=self.model.answer(request).event, source="model")


@dataclass(frozen=True)
class Mistyped:
    """A declared fact of a decision whose value its type does not allow."""

    decision: str
    path: str
    """The fact's path in the decision's facts (`account.plan`)."""
    value: Any
    why: str

    def __str__(self) -> str:
        return f"decision '{self.decision}': {self.path} = {self.value!r} {self.why}"

    def field(self, lines: ScenarioLines, scenario: str) -> JsonPath:
        """The field of the scenario the value was most likely written in (`ScenarioLines.holding`): the
        fact's last name, holding the value."""
        return lines.holding(scenario, self.path.rsplit(".", 1)[-1], self.value)


@dataclass(frozen=True)
class ReferenceCheck:
    """What one run of a scenario with `careful`, in memory, shows."""

    stopped: str | None = None
    """That the run stops (a tool that crashes on the scenario's world)."""
    stopped_at: JsonPath = ()
    """The field of the scenario it stopped on, where known (a people script's answer the machine
    refuses: `("people", state, index)`); else the scenario itself."""
    mistyped: tuple[Mistyped, ...] = ()
    """Each declared fact of its decisions whose value its type does not allow."""
    unreached: str | None = None
    """Why the run fails the scenario's label, when it ran through and does (the label is the person's:
    a warning, worth a second look before a round learns from it)."""
    refusable: tuple[Refused, ...] = ()
    """Each state's first answer of the people script that the run never gave, where the state's rules
    refuse it with every context the run passed through: a run that waits there (a model taking another
    path) ends there, failed. A warning: the run that would show it is not careful's."""

    @property
    def problems(self) -> list[str]:
        """That the run stops, and each mistyped fact."""
        return list(dict.fromkeys(([self.stopped] if self.stopped else []) + [str(m) for m in self.mistyped]))


def reference_check(env: Environment, scenario: Scenario) -> ReferenceCheck:
    """One run of the scenario with `careful`: that it stops (`a run with careful stops: actor
    'accounts.lookup' crashed ...`), each declared fact of its decisions whose value its type does not
    allow (`decision 'moderate': post.category = 'harrassment' is not one of [...]`), and whether it
    ends as labelled. Nothing when the environment has no `careful` stand-in (the check of the input
    names a run that cannot start; the stand-in is what makes a run here without asking a model)."""
    from improve.evals.outcome import outcome_row

    if REFERENCE_MODEL not in env.models:
        return ReferenceCheck()
    store, thread = MemoryStore(), f"check:{scenario.id}"
    stopped, at, mistyped = _reference_run(env, scenario, store, thread)
    if stopped or mistyped:
        return ReferenceCheck(stopped, at, tuple(mistyped))
    entries = store.read(thread)
    row = outcome_row(env, scenario, thread, entries)
    return ReferenceCheck(
        unreached=None if row.passed else row.reason, refusable=refusable_answers(env, scenario, entries)
    )


def refusable_answers(
    env: Environment, scenario: Scenario, entries: Sequence[EntryView]
) -> tuple[Refused, ...]:
    """`ReferenceCheck.refusable`: of each state's answers the run of `entries` never gave, the first, when
    the state's rules refuse it with the context of every snapshot the run passed through. A stand-in
    for the run that would wait there, which careful's does not make: the context a person's answer is
    judged on is built before the wait (a prescription looked up, expired), and a guard that refuses it
    everywhere on careful's path refuses it on a path past the same lookups. Over the bundled desks
    this flags no script, where merely naming the answers careful never gives would flag most of the
    moderation desk's."""
    given = sum(1 for e in entries if (e.metadata or {}).get("source") == "person")
    if given >= sum(len(answers) for answers in scenario.people.values()):
        return ()  # every answer was given: the run itself checked them (one refused stops it)
    machine = env.machine
    snapshots: list[Snapshot] = []
    answered: Counter[str] = Counter()
    snapshot: Snapshot | None = None
    for entry in entries:
        if entry.type == INIT_EVENT:
            snapshot = initial(machine, entry.event.get("input"))
        elif snapshot is None or entry.type in (USAGE_EVENT, END_EVENT):
            continue  # usage and the end entry move nothing
        else:
            if (entry.metadata or {}).get("source") == "person":
                answered[snapshot.value] += 1
            snapshot = transition(machine, snapshot, entry.event)
        snapshots.append(snapshot)
    found: list[Refused] = []
    for state, answers in scenario.people.items():
        index = answered[state]
        if index >= len(answers) or state not in machine.states:
            continue
        answer = dict(answers[index])
        guard = _refused_everywhere(machine, state, answer, snapshots)
        if guard is not None:
            found.append(Refused(state, index, answer, guard, tuple(sorted(machine.states[state].on))))
    return tuple(found)


def _refused_everywhere(
    machine: Machine, state: str, answer: dict[str, Any], snapshots: Sequence[Snapshot]
) -> str | None:
    """The guard that refuses `answer` in `state` with the context of every snapshot that can judge it,
    or None when one takes it (or none can judge it). A context its guards cannot read (a lookup not
    made yet: `context.account` still null) judges nothing: a run waiting with it would stop on the
    guard, which is another problem, said when a run meets it."""
    guard: str | None = None
    for snapshot in snapshots:
        # The state as if waiting there, in this context: its guards judge the answer.
        waiting = dataclasses.replace(snapshot, value=state, status="active", invoke=None)
        try:
            if can(machine, waiting, answer):
                return None
            guard = refusing_guard(machine, waiting, answer) or guard
        except Exception:  # people's expressions, on a context they were not written for
            continue
    return guard


def _reference_run(
    env: Environment, scenario: Scenario, store: MemoryStore, thread: str
) -> tuple[str | None, JsonPath, list[Mistyped]]:
    """One run of the scenario with `careful` into `store`: that it stops (or None) and on which field of
    the scenario, where known, and each declared fact of its decisions whose value its type does not
    allow (those made before it stopped too)."""
    seeing = _Seeing(env.models[REFERENCE_MODEL](f"{scenario.id}:check"))
    stopped: str | None = None
    at: JsonPath = ()
    try:
        run_scenario(env, scenario, seeing, store, thread, hashes=False)
    except Exception as err:  # a tool's own bug is the scenario's problem to name, whatever it raises
        said = str(err).removeprefix(f"thread {thread}: ") or repr(err)
        stopped = f"a run with {REFERENCE_MODEL} stops: {said} (`improve run` would stop the suite on it)"
        if isinstance(err, PeopleScriptError):
            # `improve run` ends such a run there, failed, and goes on: this is careful's own path, so
            # every run that follows it fails there.
            stopped = (
                f"a run with {REFERENCE_MODEL} stops: {said} (each run of `improve run` that waits there "
                "ends there, failed)"
            )
            at = ("people", err.state, err.index)
    mistyped: dict[str, Mistyped] = {}  # by what it says: a decision asked twice names it once
    for request in seeing.requests:
        for path, kind in env.fact_types.get(request.name, {}).items():
            found, value = _at(request.facts, path)
            why = _mistyped(value, kind) if found else None
            if why:
                wrong = Mistyped(request.name, path, value, why)
                mistyped.setdefault(str(wrong), wrong)
    return stopped, at, list(mistyped.values())


def mistyped_warnings(
    env: Environment, scenarios: Sequence[Scenario], path: Path, most: int = 5
) -> list[str]:
    """`mistyped_facts` as the warnings `improve run` and a round print before they run: the first
    `most`, then how many more and where they are all named."""
    found = mistyped_facts(env, scenarios, path)
    said = [
        f"warning: {problem} (a rule over the fact never matches the value, and the run reads it as given)"
        for problem in found[:most]
    ]
    if len(found) > most:
        said.append(
            f"warning: {len(found) - most} more such value(s); `improve scenarios check` names them all"
        )
    return said


def mistyped_facts(env: Environment, scenarios: Sequence[Scenario], path: Path) -> list[str]:
    """`file:line: scenario 'id': decision 'd': path = value is not ...` for every declared fact of the
    scenarios' decisions whose value its type does not allow, as `improve scenarios check` finds them
    (one run each with `careful`, in memory; none without it), the line that of the field the value is
    written in. What `improve run` and a round say before they run: a rule over such a fact silently
    never matches the value, and the scenario teaches nothing about it."""
    if REFERENCE_MODEL not in env.models:
        return []
    found: list[str] = []
    lines: ScenarioLines | None = None
    for scenario in scenarios:
        try:
            initial(env.machine, scenario.input)
        except MachineError:
            continue  # the run names a scenario its machine cannot start with
        # The run's own stop, if any, is the run's to say (it stops there, naming the scenario).
        _, _, mistyped = _reference_run(env, scenario, MemoryStore(), f"check:{scenario.id}")
        if mistyped:
            lines = ScenarioLines.read(path) if lines is None else lines
            found += [
                f"{lines.where(scenario.id, wrong.field(lines, scenario.id))}: scenario '{scenario.id}': {wrong}"
                for wrong in mistyped
            ]
    return found


def _at(facts: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = facts
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def input_problems(env: Environment, scenario: Scenario) -> list[tuple[JsonPath, str]]:
    """(field, problem) for each value of the scenario's input that a decision's declared fact is, as
    given (`runtime.input_facts`), and whose type it does not allow: `refundRequested: "yes"` where the
    fact is declared a bool stops a run inside a guard (`No such overload`), said at the scenario's first
    line; the field is a path into the scenario, for the input's own line."""
    found: list[tuple[JsonPath, str]] = []
    for path, facts in input_facts(env).items():
        present, value = _at(scenario.input, ".".join(path))
        if not present:
            continue
        for fact in facts:
            why = _mistyped(value, fact.kind)
            if why:
                found.append(
                    (
                        ("input", *path),
                        f"input.{'.'.join(path)} = {value!r} {why} (it is fact {fact.fact} of decision "
                        f"'{fact.decision}', whose fact_types declare it)",
                    )
                )
                break
    return found


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
