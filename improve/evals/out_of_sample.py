"""Out of sample: a policy scored on plausible cases that no round has seen.

An environment may supply a generator of plausible cases (`Environment.cases`): each draw is a scenario
without an id, its input, world and people, and, when the environment knows its own rules (a handbook),
its label. A draw without a label is labelled by the reference: the first policy (`v0`, the model
deciding everything) run with the reference model (`careful`, the stand-in people trust), whose outcome
and effects become the label. The bundled desks label that way; a desk whose people wrote their rules
down labels its own.

Each policy then runs once per case with each model, seeded by the case, and a case *agrees* when its
outcome and effects are the label's and no rule is broken. With the reference model the agreement says
how often the policy's learned branches override an answer that was right (a branch answers first,
whatever the model would have said); with a weaker model it says how much of that model's gap the
branches close. The cases are drawn from a seeded generator, so two runs of the check read the same
cases; no round, diagnosis or proposer ever reads them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from improve.errors import PeopleScriptError, WorkspaceError
from improve.evals.outcome import Fallbacks, OutcomeRow, fallbacks, outcome_row
from improve.evals.scenarios import Expected, Scenario
from improve.evals.suite import run_scenario, suite_spec
from improve.evals.workspace import Workspace, policy_content, policy_label
from improve.llm import CacheMode, Meter
from improve.log import LogEntry, MemoryStore
from improve.machine import MachineConfig, canonical_json
from improve.runtime import (
    Decision,
    DecisionRequest,
    Environment,
    Model,
    ModelCallError,
    ModelFactory,
    PolicyDecider,
    compile_policy,
)

REFERENCE_MODEL = "careful"
"""The stand-in whose runs of the first policy label the cases a generator leaves unlabelled."""
GENERATED = "out-of-sample:"
"""How the thread id of a generated case's decision a round adds to its training decisions begins
(`Overridden.example`): what the rule miner knows them by."""


def is_generated(example: Mapping[str, Any]) -> bool:
    """Whether a training decision (as `loop.evidence` writes one) is a generated case's (`GENERATED`)."""
    return str(example.get("thread_id", "")).startswith(GENERATED)


CASES = 400
SEED = 20261130
UNNAMED = "generated"
"""The category of a case whose draw names none."""
MAX_DRAWS = 4
"""Draws per case at most: a draw the reference cannot finish is drawn again."""
PROGRESS = 10
"""Cases between two progress lines of `agreement` (a model behind an endpoint takes seconds a case)."""
SHOWN = 5
"""Disagreements kept per policy and model, for the report."""
DRAFTS = 10
"""Disagreements kept per policy and model as drafts of scenarios (`improve out-of-sample --scenarios`):
a person checks each label, so a few, not all."""


@dataclass(frozen=True)
class Overridden:
    """A decision a branch of the policy answered otherwise than the reference model (`careful`): its
    request, the branch's answer and the reference's, the right one where the case's label agrees."""

    name: str
    facts: Mapping[str, Any]
    options: Sequence[Mapping[str, Any]]
    answered: Any
    right: Any

    def example(self, case: str) -> dict[str, Any]:
        """The decision as a training decision reads (`loop.evidence`): labelled by the reference's answer,
        failed, in no cluster; `case` names the generated case it was asked in."""
        return {
            "thread_id": f"{GENERATED}{case}",
            "scenario": case,
            "name": self.name,
            "facts": dict(self.facts),
            "options": [dict(o) for o in self.options],
            "answered": self.answered,
            "correct": [self.right],
            "passed": False,
            "in_cluster": False,
        }


@dataclass(frozen=True)
class Disagreement:
    """A case whose run did not end as labelled: where it ended, where the label says, and who answered
    its decisions (`policy:<final>`: a branch's final, or the model's)."""

    case: str
    category: str
    expected: str
    got: str
    reason: str
    answered_by: tuple[str, ...]
    scenario: Scenario | None = None
    """The case itself (its input, world, people and label): what a scenario made of it holds."""
    branches: tuple[str, ...] = ()
    """The policy's own branches (their finals) that answered a decision of it otherwise than the
    reference model (`careful`) answers it: those that overrode a right answer (`_Overrides`)."""
    overrode: tuple[Overridden, ...] = ()
    """Those decisions, each with the branch's answer and the reference model's."""

    @property
    def by_rule(self) -> bool:
        return bool(self.branches)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "case": self.case,
            "category": self.category,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
            "answered_by": list(self.answered_by),
            "by_rule": self.by_rule,
        }
        if self.scenario is not None:
            found["input"] = self.scenario.input
            found["world"] = self.scenario.world
            if self.scenario.people:
                found["people"] = self.scenario.people
        return found


@dataclass(frozen=True)
class Agreement:
    """One policy with one model on the generated cases."""

    policy: str
    model: str
    cases: int
    agreed: int
    by_category: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Category -> (agreed, cases)."""
    by_rule: int = 0
    """Disagreeing cases where one of the policy's own branches answered a decision otherwise than the
    reference model answers it (a branch that answered as it does overrode nothing)."""
    branches: dict[str, int] = field(default_factory=dict)
    """Of those, how many each branch answered (its final state's name), most first."""
    shown: tuple[Disagreement, ...] = ()
    fell_back: Fallbacks = field(default_factory=lambda: Fallbacks(0, 0, None))
    """Decisions asked of the model, and those the policy's onError answered because a call failed."""
    drafted: tuple[Disagreement, ...] = ()
    """`DRAFTS` disagreements, in the cases' order: those a branch of the policy answered (`by_rule`),
    then those the model answered, half of each where both are many (`_halves`)."""
    skipped: int = 0
    """Cases that could not run with this policy: the generator scripted a person's answer the machine
    refuses where the run waited (`PeopleScriptError`). Not counted in `cases`."""
    skipped_reason: str | None = None
    """The first of them, with its case: what to fix in the generator."""
    overrode: dict[str, tuple[Overridden, ...]] = field(default_factory=dict)
    """Each `by_rule` case by its id, with the decisions a branch answered otherwise than the reference
    model: which of them a branch newer than another policy's answered (`CandidateCheck`) is told case
    by case, not by their counts."""

    @property
    def rate(self) -> float:
        return self.agreed / self.cases if self.cases else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "model": self.model,
            "cases": self.cases,
            "agreed": self.agreed,
            "agreement": round(self.rate, 4),
            "disagreements_by_rule": self.by_rule,
            "by_branch": dict(self.branches),
            "model_decisions": self.fell_back.decisions,
            "fell_back": self.fell_back.fallbacks,
            "by_category": {c: {"agreed": a, "cases": n} for c, (a, n) in sorted(self.by_category.items())},
            "shown": [d.to_json() for d in self.shown],
            "skipped": self.skipped,
            "skipped_reason": self.skipped_reason,
        }


def _scenario(number: int, draw: Mapping[str, Any], expected: Expected) -> Scenario:
    return Scenario(
        id=f"generated-{number:04d}",
        category=str(draw.get("category") or UNNAMED),
        # Generated cases belong to no scenario file; like the sealed split, no round reads them.
        split="test",
        input=dict(draw.get("input") or {}),
        world=dict(draw.get("world") or {}),
        people={k: list(v) for k, v in (draw.get("people") or {}).items()},
        expected=expected,
    )


def generate_cases(
    env: Environment,
    n: int = CASES,
    seed: int = SEED,
    *,
    reference: MachineConfig | None = None,
    reference_model: ModelFactory | None = None,
    known: Sequence[Scenario] = (),
) -> list[Scenario]:
    """`n` cases from the environment's generator, labelled: by the generator, or by the reference
    policy's run with the reference model (both needed then; default model: `careful`). A draw whose
    input and world are those of a `known` scenario is drawn again: drafts a person labelled into the
    scenarios from this very seed are training or held-out cases now, not unseen ones."""
    if env.cases is None:
        raise WorkspaceError(
            f"environment {env.name!r} has no generator of cases (Environment.cases): nothing to check out "
            "of sample; give it one that draws plausible inputs and worlds (docs/extending.md, 'Plausible "
            "cases: checking a policy out of sample')"
        )
    rng = random.Random(seed)
    seen = {_case_key(s.input, s.world) for s in known}
    labelled = env.cases(rng)
    if labelled.get("expected"):
        draws: list[Mapping[str, Any]] = []
        draw: Mapping[str, Any] = labelled
        for attempt in range(MAX_DRAWS * n):
            if attempt:
                draw = env.cases(rng)
            if _case_key(draw.get("input"), draw.get("world")) not in seen:
                draws.append(draw)
                if len(draws) == n:
                    break
        else:
            raise WorkspaceError(
                f"environment {env.name!r}: only {len(draws)} of {MAX_DRAWS * n} drawn cases are not labelled "
                "scenarios already; draw fewer cases, or give the generator more to vary"
            )
        return [_scenario(i, d, Expected.model_validate(d["expected"])) for i, d in enumerate(draws, 1)]
    if reference is None:
        raise WorkspaceError(
            f"environment {env.name!r} draws cases without labels: name the reference policy that labels them"
        )
    model = reference_model if reference_model is not None else env.models.get(REFERENCE_MODEL)
    if model is None:
        raise WorkspaceError(
            f"environment {env.name!r} has no {REFERENCE_MODEL!r} stand-in to label its generated cases"
        )
    compiled = compile_policy(reference, env.judgments, env.policy_guards)
    cases: list[Scenario] = []
    draw = labelled
    for attempt in range(MAX_DRAWS * n):
        if attempt:
            draw = env.cases(rng)
        if _case_key(draw.get("input"), draw.get("world")) in seen:
            continue
        unlabelled = _scenario(len(cases) + 1, draw, Expected(outcome=""))
        try:
            row, _ = _run(env, compiled, model, unlabelled)
        except PeopleScriptError:
            continue  # a person's answer the machine refuses: the reference cannot decide it either

        # A run of the reference that does not finish (it waits for a person nobody scripted, it runs
        # out of budget) labels nothing: the case is drawn again.
        if row.status == "done" and not row.violations:
            label = Expected(outcome=row.final_state, effects=list(row.effects))
            cases.append(unlabelled.model_copy(update={"expected": label}))
            if len(cases) == n:
                return cases
    raise WorkspaceError(
        f"environment {env.name!r}: the reference finished only {len(cases)} of {MAX_DRAWS * n} drawn cases; "
        "its generator draws cases the reference cannot decide"
    )


def _case_key(input: Any, world: Any) -> str:
    """A case's input and world as one comparable text (what a labelled draft keeps of its draw)."""
    return canonical_json({"input": input or {}, "world": world or {}})


def _run(
    env: Environment, compiled: Any, model: ModelFactory, case: Scenario
) -> tuple[OutcomeRow, list[LogEntry]]:
    """One run of the case (seeded by it), scored against its label."""
    return _scored(env, case, PolicyDecider(compiled, {"decider": model(f"{case.id}:r1")}, env.judgments))


def _scored(env: Environment, case: Scenario, decider: PolicyDecider) -> tuple[OutcomeRow, list[LogEntry]]:
    """The case run once with `decider`, in memory, and scored against its label."""
    store, thread = MemoryStore(), f"test:generated:{case.id}:r1"
    run_scenario(env, case, decider, store, thread)
    entries = store.read(thread)
    return outcome_row(env, case, thread, entries), entries


class _Overrides(PolicyDecider):
    """A `PolicyDecider` that notes each decision one of the policy's branches answered otherwise than
    the reference model (`careful`) answers the same request: the branches that overrode a right
    answer. A branch whose answer is the reference's did not, even in a run that ends otherwise than
    labelled (on a desk that decides twice, the model may go wrong at the next decision); without a
    reference, every branch that answered is noted."""

    def __init__(
        self, policy: MachineConfig, compiled: Any, model: Model, reference: Model | None, judgments: Any
    ) -> None:
        super().__init__(compiled, {"decider": model}, judgments)
        self.config = policy
        self.reference = reference
        self.overrides: list[str] = []
        self.overrode: list[Overridden] = []

    def decide(self, request: DecisionRequest) -> Decision:
        decision = super().decide(request)
        if not _by_rule(self.config, decision.source):
            return decision
        right: Any = None
        if self.reference is not None:
            try:
                right = self.reference.answer(request).event
            except ModelCallError:  # the reference gave no answer: the branch's cannot be called right
                right = None
        if self.reference is None or right != decision.event:
            self.overrides.append(decision.source.split(":", 1)[1])
            if right is not None:
                self.overrode.append(
                    Overridden(request.name, request.facts, request.options, decision.event, right)
                )
        return decision


def _checked_run(
    env: Environment, policy: MachineConfig, compiled: Any, model: ModelFactory, case: Scenario
) -> tuple[OutcomeRow, list[LogEntry], tuple[str, ...], tuple[Overridden, ...]]:
    """`_run`, the branches that answered a decision otherwise than the reference would (`_Overrides`),
    and those decisions."""
    reference = env.models.get(REFERENCE_MODEL)
    decider = _Overrides(
        policy,
        compiled,
        model(f"{case.id}:r1"),
        reference(f"{case.id}:reference") if reference is not None else None,
        env.judgments,
    )
    row, entries = _scored(env, case, decider)
    return row, entries, tuple(dict.fromkeys(decider.overrides)), tuple(decider.overrode)


def agreement(
    env: Environment,
    policy: MachineConfig,
    model_name: str,
    model: ModelFactory,
    cases: Sequence[Scenario],
    say: Callable[[str], None] | None = None,
    workers: int = 1,
) -> Agreement:
    """The policy with the model on every case: how many end as labelled (`say`: progress, every
    `PROGRESS` cases). `workers`: runs at once, for a model behind an endpoint whose waits overlap (its
    session keeps the calls in flight under its own cap); the figures do not depend on it."""
    compiled = compile_policy(policy, env.judgments, env.policy_guards)
    label = policy_label(policy)
    agreed = 0
    per: Counter[str] = Counter()
    total: Counter[str] = Counter()
    by_rule: dict[str, tuple[Overridden, ...]] = {}
    shown: list[Disagreement] = []
    ruled: list[Disagreement] = []
    unruled: list[Disagreement] = []
    overriders: Counter[str] = Counter()
    rows: list[OutcomeRow] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        # In the cases' order whatever order they finish in: the same figures and the same shown cases.
        runs = pool.map(lambda case: _runnable(env, policy, compiled, model, case), cases)
        skipped: list[str] = []
        for done, (case, ran) in enumerate(zip(cases, runs, strict=True), start=1):
            if say is not None and (done % PROGRESS == 0 or done == len(cases)):
                say(f"  {label} with {model_name}: {done}/{len(cases)} cases")
            if isinstance(ran, PeopleScriptError):
                skipped.append(f"{case.id}: {ran}")
                continue
            row, entries, branches, overrode = ran
            rows.append(row)
            total[case.category] += 1
            if row.passed:
                agreed += 1
                per[case.category] += 1
                continue
            sources = tuple(
                str(e.metadata.get("source", "")) for e in entries if e.metadata and "decision" in e.metadata
            )
            found = Disagreement(
                case.id,
                case.category,
                case.expected.outcome,
                row.final_state,
                row.reason,
                sources,
                case,
                branches,
                overrode,
            )
            if found.by_rule:
                by_rule[case.id] = overrode
            overriders.update(branches)
            if len(shown) < SHOWN:
                shown.append(found)
            kept = ruled if found.by_rule else unruled
            if len(kept) < DRAFTS:
                kept.append(found)
    return Agreement(
        label,
        model_name,
        len(cases) - len(skipped),
        agreed,
        {c: (per[c], total[c]) for c in total},
        len(by_rule),
        dict(overriders.most_common()),
        tuple(shown),
        fallbacks(rows),
        _halves(ruled, unruled, DRAFTS),
        len(skipped),
        skipped[0] if skipped else None,
        by_rule,
    )


def _runnable(
    env: Environment, policy: MachineConfig, compiled: Any, model: ModelFactory, case: Scenario
) -> tuple[OutcomeRow, list[LogEntry], tuple[str, ...], tuple[Overridden, ...]] | PeopleScriptError:
    """`_checked_run`, or the error of a case whose generated person's answer the machine refuses where
    the run waits: a mistake of the generator, not of the policy, which one such case used to turn into
    a round's exit 2 after every replay)."""
    try:
        return _checked_run(env, policy, compiled, model, case)
    except PeopleScriptError as error:
        return error


def _halves(
    first: Sequence[Disagreement], second: Sequence[Disagreement], n: int
) -> tuple[Disagreement, ...]:
    """`n` of both lists: half from each (the first's half rounded up), the rest from whichever has more."""
    take = max((n + 1) // 2, n - len(second))
    chosen = list(first[:take])
    return (*chosen, *second[: n - len(chosen)])


def _by_rule(policy: MachineConfig, source: str) -> bool:
    """The decision was answered by one of the policy's own finals with a fixed answer (a branch), not
    by a final that passes the model's answer on."""
    if not source.startswith("policy:"):
        return False
    state = policy.states.get(source.split(":", 1)[1])
    if state is None or not state.is_final:
        return False
    return not (isinstance(state.output, str) and "event.output" in state.output)


def out_of_sample(
    env: Environment,
    policies: Sequence[MachineConfig],
    models: Mapping[str, ModelFactory],
    *,
    n: int = CASES,
    seed: int = SEED,
    reference: MachineConfig | None = None,
) -> list[Agreement]:
    """Every policy with every model on the same `n` generated cases (labelled as `generate_cases`
    says, the reference being the first policy unless named)."""
    cases = generate_cases(env, n, seed, reference=reference or (policies[0] if policies else None))
    return [agreement(env, p, name, model, cases) for p in policies for name, model in models.items()]


@dataclass(frozen=True)
class AgainstReference:
    """A candidate and its baseline with the reference model (`careful`) on the same generated cases."""

    cases: int
    seed: int
    labelled_by: str
    baseline: Agreement
    candidate: Agreement

    @property
    def newly_overridden(self) -> list[str]:
        """The cases a branch of the candidate answered otherwise than the reference model, where the
        baseline's run agreed with the label or no branch of it overrode the model: what the candidate's
        own branches reach that they should not."""
        return sorted(self.candidate.overrode.keys() - self.baseline.overrode.keys())

    def counterexamples(self) -> list[dict[str, Any]]:
        """The decisions of `newly_overridden` cases a branch answered otherwise than the reference model,
        as training decisions read, labelled by the reference's answer (`Overridden.example`)."""
        return [
            o.example(case) for case in self.newly_overridden for o in self.candidate.overrode.get(case, ())
        ]


@dataclass(frozen=True)
class CandidateCheck:
    """The cases a round checks its candidates on, drawn and labelled once, and its baseline's
    agreement on them: each candidate (a repair's too) is then one pass of `careful` over the cases."""

    env: Environment
    careful: ModelFactory
    cases: tuple[Scenario, ...]
    seed: int
    labelled_by: str
    baseline: Agreement

    def against(self, candidate: MachineConfig) -> AgainstReference:
        found = agreement(self.env, candidate, REFERENCE_MODEL, self.careful, self.cases)
        return AgainstReference(len(self.cases), self.seed, self.labelled_by, self.baseline, found)


def candidate_check(
    env: Environment,
    reference: MachineConfig,
    baseline: MachineConfig,
    n: int,
    seed: int,
    known: Sequence[Scenario] = (),
) -> CandidateCheck | None:
    """`n` cases the environment's generator draws, labelled by it, or by careful's run of `reference`:
    the first policy of the line, the model deciding everything (labels from a baseline with learned
    branches would take their answers for right ones); and `baseline` with `careful` on them. None
    without a generator, a careful stand-in or a case to draw; `WorkspaceError` when the generator draws
    cases the reference cannot label."""
    careful = env.models.get(REFERENCE_MODEL)
    if env.cases is None or careful is None or n < 1:
        return None
    cases = generate_cases(env, n, seed, reference=reference, reference_model=careful, known=known)
    if not labels_own(env, seed) and policy_content(baseline) == policy_content(reference):
        # The baseline is the policy whose careful runs labelled the cases: its runs again would be those
        # very runs (a stand-in draws the same answers for the same case), so every case agrees.
        label = policy_label(baseline)
        base = Agreement(label, REFERENCE_MODEL, len(cases), len(cases), _categories(cases))
    else:
        base = agreement(env, baseline, REFERENCE_MODEL, careful, cases)
    by = labelled_by(env, seed, policy_label(reference))
    return CandidateCheck(env, careful, tuple(cases), seed, by, base)


def against_reference(
    env: Environment,
    reference: MachineConfig,
    baseline: MachineConfig,
    candidate: MachineConfig,
    n: int,
    seed: int,
    known: Sequence[Scenario] = (),
) -> AgainstReference | None:
    """`candidate` and `baseline` with `careful` on `n` generated cases (`candidate_check`)."""
    check = candidate_check(env, reference, baseline, n, seed, known)
    return check.against(candidate) if check is not None else None


def _categories(cases: Sequence[Scenario]) -> dict[str, tuple[int, int]]:
    """Each category's (agreed, cases) when every case agrees."""
    counts = Counter(c.category for c in cases)
    return {c: (n, n) for c, n in counts.items()}


@dataclass(frozen=True)
class OutOfSample:
    """`improve out-of-sample`: policies of one environment, each with each model, on the same
    generated cases."""

    environment: str
    cases: int
    seed: int
    labelled_by: str
    """The generator's own labels, or the reference policy's run with `careful`."""
    agreements: list[Agreement]

    def never_answered(self) -> list[Agreement]:
        """The policy and model pairs whose model answered none of the decisions it was asked: their
        agreement measures the policy's onError, not the model."""
        return [a for a in self.agreements if a.fell_back.never_answered]

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "cases": self.cases,
            "seed": self.seed,
            "labelled_by": self.labelled_by,
            "agreements": [a.to_json() for a in self.agreements],
        }

    def drafts(self) -> list[tuple[Scenario, str]]:
        """The cases the last policy checked (the one under review: the earlier versions are what it grew
        from) ended otherwise than labelled, each once (the first model to meet it says why), as
        scenarios to label: in the training split, so that the next round learns from them, an id that
        names the seed and the case, the category its draw named (else the label's outcome, so drafts sort
        by what they should end as); and a comment for the person
        who checks the label, naming who answered (a learned branch, or the model)."""
        seen: dict[str, tuple[Scenario, str]] = {}
        last = self.agreements[-1].policy if self.agreements else None
        for a in self.agreements:
            if a.policy != last or a.fell_back.never_answered:
                continue  # a model that never answered measured the policy's onError: nothing to label
            for d in a.drafted:
                if d.scenario is None or d.case in seen:
                    continue
                number = d.case.removeprefix("generated-")
                draft = d.scenario.model_copy(
                    update={
                        "id": f"generated-{self.seed}-{number}",
                        "category": d.expected if d.category == UNNAMED else d.category,
                        "split": "train",
                        "description": f"Drawn by {self.environment}'s case generator (seed {self.seed}, case "
                        f"{number}): {a.policy} with {a.model} ended it {d.got}.",
                    }
                )
                if d.by_rule:
                    who = f"{a.policy}'s learned {', '.join(sorted(d.branches))} answered it"
                else:
                    who = f"{a.model} answered it under {a.policy}"
                ended = f"ended {d.got}" + (f" ({d.reason})" if d.got == d.expected and d.reason else "")
                why = f"{who}: {ended}; labelled {d.expected} by {self.labelled_by}. Check the label."
                seen[d.case] = (draft, why)
        return list(seen.values())


def check_out_of_sample(
    space: Workspace,
    env_name: str | None,
    versions: Sequence[str],
    models: Sequence[str],
    *,
    n: int = CASES,
    seed: int | None = None,
    say: Callable[[str], None] | None = None,
    meter: Meter | None = None,
    cache: CacheMode = "record",
) -> OutOfSample:
    """The workspace's policies `versions` (the first labels unlabelled cases) with each of `models` (a
    stand-in, or a model behind an endpoint) on `n` cases from the environment's generator. `cache`: how a
    model behind an endpoint is asked (`record`: a request recorded before, by an earlier check of the
    same cases, is answered from its recording)."""
    seed = SEED if seed is None else seed
    if not versions:
        raise WorkspaceError("name at least one policy version to check (v0, v3, ...)")
    if n < 1:
        raise WorkspaceError(f"--cases must be at least 1, not {n}")
    name = space.env_name(env_name)
    env = space.environment(name)
    policies = [space.load_policy(name, v) for v in versions]
    # A stand-in by name; a model behind an endpoint (`openai:MODEL`, a `[models.NAME]`) through the
    # workspace's spec of it, its calls counted by `meter`: it is asked every case of every policy.
    specs = {m: suite_spec(space, env, policies[0], m, cache=cache) for m in models if m not in env.models}
    factories = {m: env.models[m] if m in env.models else specs[m].model_factory(env, meter) for m in models}
    # A stand-in answers at once; a model behind an endpoint is waited on, its runs overlapping up to its cap.
    workers = {m: spec.model_spec.in_flight() if spec.model_spec else 1 for m, spec in specs.items()}
    # The workspace's labelled scenarios are not unseen: drafts of an earlier check, labelled since.
    known = space.scenarios(name).scenarios if space.scenarios_path(name).is_file() else []
    cases = generate_cases(env, n, seed, reference=policies[0], known=known)
    labelled = labelled_by(env, seed, policy_label(policies[0]))
    found = [
        agreement(env, p, m, factories[m], cases, say if m in specs else None, workers.get(m, 1))
        for p in policies
        for m in models
    ]
    return OutOfSample(name, len(cases), seed, labelled, found)


def labels_own(env: Environment, seed: int) -> bool:
    """Whether the generator labels the cases it draws with `seed` (its first draw has a label, as
    `generate_cases` reads it), rather than leaving them to `careful`'s run of a reference policy."""
    assert env.cases is not None
    return bool(env.cases(random.Random(seed)).get("expected"))


def labelled_by(env: Environment, seed: int, reference: str) -> str:
    """Who labels the cases the generator draws with `seed`: the generator itself, or `careful`'s run of
    the `reference` policy."""
    if labels_own(env, seed):
        return "the environment's generator (its rules)"
    return f"{REFERENCE_MODEL}'s run of {reference}"
