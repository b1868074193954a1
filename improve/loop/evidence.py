"""Training decisions as evidence: what the decider saw, what it answered, and what the labels imply.

For every decision in a training thread: the request (facts and offered options, replayed from the
log), the answer that landed, whether the run passed, and the options that would have made it pass.
That last part is a counterfactual: the scenario is run again offline against its own fixture world,
with the decision answered by each offered option in turn and everything else as in the baseline, and
scored against the labels. Ground truth, not the model's opinion, says which choice was right.

Held-out threads are never read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from improve.evals import OutcomeRow, Scenario, outcome_row, policy_label, run_scenario
from improve.log import MemoryStore, Store, ThreadId
from improve.loop.branches import added, answer_on, route, same_answer
from improve.loop.diagnose import Diagnosis, diagnose
from improve.loop.probes import requests_in
from improve.machine import MODEL_DECIDE, MachineConfig, canonical_json, initial
from improve.runtime import (
    Decision,
    DecisionRequest,
    Environment,
    ModelFactory,
    PolicyDecider,
    compile_policy,
)


@dataclass(frozen=True)
class DecisionExample:
    thread_id: str
    scenario: str
    category: str
    name: str
    facts: dict[str, Any]
    options: list[dict[str, Any]]
    answered: dict[str, Any] | None
    """The event that landed (None when every answer was refused)."""
    passed: bool
    """Whether the run passed."""
    correct: list[dict[str, Any]]
    """The offered options that make the run pass (counterfactual runs against the scenario's world)."""
    expected: str
    final_state: str
    reaches_model: bool = True
    """The current policy leaves this decision to the model (no rule of it answers first)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _key(request: DecisionRequest) -> str:
    return canonical_json([request.name, request.facts, request.options])


class _Counterfactual:
    """Answers one decision (matched by name, facts and options) with a fixed option; defers otherwise."""

    def __init__(self, key: str, option: dict[str, Any], inner: PolicyDecider) -> None:
        self.key = key
        self.option = option
        self.inner = inner

    def decide(self, request: DecisionRequest) -> Decision:
        if _key(request) == self.key:
            return Decision(event=dict(self.option), source="counterfactual")
        return self.inner.decide(request)


def decision_examples(
    env: Environment,
    scenarios: Sequence[Scenario],
    rows: Sequence[OutcomeRow],
    store: Store,
    policy: MachineConfig,
    models: ModelFactory,
) -> list[DecisionExample]:
    """Every decision of the given training rows, with its counterfactually correct options."""
    by_id = {s.id: s for s in scenarios}
    compiled = compile_policy(policy, env.judgments, env.policy_guards)
    correct_cache: dict[tuple[str, str], list[dict[str, Any]]] = {}
    examples: list[DecisionExample] = []
    for row in rows:
        if row.split != "train":
            continue
        scenario = by_id.get(row.scenario)
        if scenario is None:
            continue
        entries = store.read(row.thread_id)
        landed = [e for e in entries if e.metadata and "decision" in e.metadata]
        for request, entry in zip(requests_in(env, entries), landed, strict=False):
            key = _key(request)
            cache_key = (scenario.id, key)
            if cache_key not in correct_cache:
                correct_cache[cache_key] = _correct_options(env, scenario, request, compiled, models, row)
            answered = None if entry.type == "xstate.error.actor" else dict(entry.event)
            first = initial(compiled, request.to_input())
            reaches_model = first.invoke is not None and first.invoke.src == MODEL_DECIDE
            examples.append(
                DecisionExample(
                    thread_id=row.thread_id,
                    scenario=scenario.id,
                    category=scenario.category,
                    name=request.name,
                    facts=request.facts,
                    options=request.options,
                    answered=answered,
                    passed=row.passed,
                    correct=correct_cache[cache_key],
                    expected=row.expected_outcome,
                    final_state=row.final_state,
                    reaches_model=reaches_model,
                )
            )
    return examples


def _correct_options(
    env: Environment,
    scenario: Scenario,
    request: DecisionRequest,
    policy: Any,
    models: ModelFactory,
    row: OutcomeRow,
) -> list[dict[str, Any]]:
    parsed = ThreadId.parse(row.thread_id)
    # The run's own seed: a stand-in answers the other decisions as it did in the run, and a model
    # behind an endpoint answers the calls the run made from their recordings (the same samples).
    seed = f"{scenario.id}:r{parsed.run if parsed else 1}"
    good = []
    for option in request.options:
        store = MemoryStore()
        thread = f"counterfactual:v0:{scenario.id}:r1"
        decider = _Counterfactual(
            _key(request), option, PolicyDecider(policy, {"decider": models(seed)}, env.judgments)
        )
        run_scenario(env, scenario, decider, store, thread)
        if outcome_row(env, scenario, thread, store.read(thread)).passed:
            good.append(dict(option))
    return good


def diagnose_train(
    env: Environment,
    scenarios: Sequence[Scenario],
    rows: Sequence[OutcomeRow],
    store: Store,
    policy: MachineConfig,
    models: ModelFactory,
    skip: Sequence[str] = (),
) -> tuple[Diagnosis, list[dict[str, Any]]]:
    """The diagnosis of the training rows and the training decisions it was made from: when a training
    run failed, every training decision with the answers its labels imply were right, so failures are
    clustered by the answer that would have fixed them (empty when nothing failed)."""
    label = policy_label(policy)
    train = [r for r in rows if r.split == "train"]
    if all(r.passed for r in train):
        return diagnose(rows, label, skip=skip), []
    examples = [e.to_json() for e in decision_examples(env, scenarios, train, store, policy, models)]
    return diagnose(rows, label, skip=skip, examples=examples), examples


@dataclass(frozen=True)
class Override:
    """A held-out decision a new branch answers, and whether the labels agree with its answer."""

    scenario: str
    branch: str
    answer: dict[str, Any]
    correct: list[dict[str, Any]]

    @property
    def right(self) -> bool:
        return not self.correct or any(same_answer(self.answer, c) for c in self.correct)


def held_out_overrides(
    env: Environment,
    scenarios: Sequence[Scenario],
    rows: Sequence[OutcomeRow],
    store: Store,
    baseline: MachineConfig,
    candidate: MachineConfig,
    models: ModelFactory,
) -> list[Override]:
    """Every held-out decision of the baseline's runs where one of the branches the candidate adds
    would answer, with the options the labels say are right there (counterfactual runs, as for the
    training decisions).

    This reads held-out to judge a change, never to shape one: a branch is a claim that its answer is
    right wherever its condition holds, and the held-out decisions test that claim whatever the model
    answered there (a branch that replaces one wrong answer by another costs the pass rate nothing
    today, and overrides the right answer of a better model tomorrow)."""
    new = {b.index for b in added(baseline, candidate)}
    if not new:
        return []
    branches = route(candidate)
    by_id = {s.id: s for s in scenarios}
    compiled = compile_policy(baseline, env.judgments, env.policy_guards)
    seen: dict[tuple[str, str], Override] = {}
    for row in rows:
        scenario = by_id.get(row.scenario)
        if row.split != "held-out" or scenario is None:
            continue
        for request in requests_in(env, store.read(row.thread_id)):
            example = {"name": request.name, "facts": request.facts, "options": request.options}
            fired = answer_on(branches, example)
            if fired is None or fired[0].index not in new:
                continue
            key = (scenario.id, _key(request))
            if key not in seen:
                correct = _correct_options(env, scenario, request, compiled, models, row)
                seen[key] = Override(scenario.id, fired[0].answer(), fired[1], correct)
    return list(seen.values())
