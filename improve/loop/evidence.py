"""Training decisions as evidence: what the decider saw, what it answered, and what the labels imply.

For every decision in a training thread: the request (facts and offered options, replayed from the
log), the answer that landed, whether the run passed, and the options that would have made it pass.
That last part is a counterfactual: the scenario is run again offline against its own fixture world,
with the decision answered by each offered option in turn and everything else as in the baseline, and
scored against the labels. Ground truth, not the model's opinion, says which choice was right. When a
later decision fails the run whatever this one answers, the next decision is answered by each of its
options too (`DOWNSTREAM`): an option is right if some answer there makes the run pass.

Counterfactual runs start from the thread they vary (replay-first, `improve.runtime.replay_first`):
wherever one asks the model what the thread asked, the thread's answer is the answer, so only the
decisions after the varied one ask the model. They run `concurrency` at a time: a slow model is
waited on in parallel.

A counterfactual run with a stand-in model is a function of what it is run from: a loop of rounds
remembers them (`improve.loop.counterfactuals`) and answers the ones it asks again from there.

Held-out threads are read only to judge a change (`Evidence.overrides`), never to shape one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from improve.evals import (
    Check,
    Ledger,
    OutcomeRow,
    Quarantined,
    Scenario,
    Workspace,
    compare_effects,
    every,
    kept_aside,
    outcome_row,
    policy_label,
    refused_scripts,
    run_scenario,
    suite_spec,
    write_threads,
)
from improve.llm import CacheMode
from improve.log import LogEntry, RunBuffer, ThreadId
from improve.loop.branches import added, answer_on, decision_key, route, same_answer
from improve.loop.counterfactuals import Counterfactuals, StandIn, digest
from improve.loop.diagnose import Diagnosis, diagnose
from improve.loop.inputs import locate
from improve.loop.probes import Reads, first_train_threads, probe_requests, requests_in
from improve.machine import MODEL_DECIDE, MachineConfig, canonical_bytes, initial
from improve.runtime import (
    Decision,
    DecisionOffers,
    DecisionRequest,
    Environment,
    ModelFactory,
    PolicyDecider,
    RecordedRun,
    ReplayFirstDecider,
    answer_text,
    compile_policy,
    payload_offers,
    runs_overlap,
)

Say = Callable[[str], None]


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
    """The offered options that make the run pass (counterfactual runs against the scenario's world), with
    the next decision answered otherwise too where the run needs it (`DOWNSTREAM`)."""
    expected: str
    final_state: str
    reaches_model: bool = True
    """The current policy leaves this decision to the model (no rule of it answers first)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _key(request: DecisionRequest) -> str:
    return canonical_bytes([request.name, request.facts, request.options]).decode("utf-8")


class _Counterfactual:
    """Answers the decisions it fixes (matched by name, facts and options) with their fixed options;
    defers otherwise."""

    def __init__(self, fixed: dict[str, dict[str, Any]], inner: PolicyDecider) -> None:
        self.fixed = fixed
        self.inner = inner

    def decide(self, request: DecisionRequest) -> Decision:
        option = self.fixed.get(_key(request))
        if option is not None:
            return Decision(event=dict(option), source="counterfactual")
        return self.inner.decide(request)


DOWNSTREAM = 1
"""How many decisions after the varied one a counterfactual run may answer otherwise too. A run can fail
at a later decision whatever the varied one answers (an agent that decides, then tells the customer):
without this, no option of the earlier decision makes it pass, and its right and wrong answers are
unknown, so a rule for it is learned blind to the cases it must not answer. With it, for a decision no
option fixes alone, an option is right when it makes the run pass with the next decision answered by
another of its options; wrong when none does. One level: each option costs at most one run per option
of the next decision, and only at a decision no option fixes alone."""


class Evidence:
    """The decisions of a policy's recorded runs, each thread read once, with the answers the labels
    imply were right there (counterfactual runs against each scenario's world).

    `store` is where the threads are read (a round's `KeptReads`: each decoded once per round).
    `models` makes the model of a counterfactual
    run, seeded as the run was; `replay_first`: a counterfactual run takes the thread's answers where it
    asks what the thread asked; `concurrency`: counterfactual runs at once; `memo`: where counterfactual
    runs are remembered, with `stand_in` saying the model is a stand-in (`Counterfactuals`); `pool`: the
    threads they run on (a round's, `evals.Slots`; default a pool for each call, started then)."""

    def __init__(
        self,
        env: Environment,
        scenarios: Sequence[Scenario],
        store: Reads,
        models: ModelFactory,
        *,
        replay_first: bool = True,
        concurrency: int = 1,
        memo: Counterfactuals | None = None,
        stand_in: StandIn | None = None,
        pool: Executor | None = None,
    ) -> None:
        self.env = env
        self.by_id = {s.id: s for s in scenarios}
        self.store = store
        self.models = models
        self.replay_first = replay_first
        # Counterfactual runs of a stand-in that answers at once gain nothing from threads (`runs_overlap`).
        self.concurrency = max(1, concurrency) if stand_in is None or runs_overlap(models) else 1
        self._decisions: dict[str, list[tuple[DecisionRequest, LogEntry]]] = {}
        self._recorded: dict[str, RecordedRun] = {}
        self._asked: dict[tuple[str, str], frozenset[str]] = {}
        """The decisions a thread's run asks with one of its decisions answered rightly, by the thread and
        that decision (`_follows_a_wrong_answer`: every later decision of the thread asks the same)."""
        self.memo = memo if stand_in is not None else None  # a model behind an endpoint is asked again
        self._memo_base = (
            digest([env.name, dict(stand_in.env_hashes), env.config.model_dump(mode="json"), stand_in.model])
            if stand_in
            else None
        )
        self.pool = pool
        self._digests: dict[tuple[str, str], str | None] = {}
        """Digests of scenarios and recorded runs, each computed once."""

    def decisions(self, thread_id: str) -> list[tuple[DecisionRequest, LogEntry]]:
        """Every decision of the thread: its request (replayed from the log) and the entry that answered it."""
        if thread_id not in self._decisions:
            entries = self.store.read(thread_id)
            self._decisions[thread_id] = _decisions_in(self.env, entries)
            self._recorded[thread_id] = RecordedRun.of(thread_id, entries)
        return self._decisions[thread_id]

    def correct(
        self, cases: Sequence[tuple[Scenario, DecisionRequest, OutcomeRow]], policy: Any
    ) -> list[list[dict[str, Any]]]:
        """For each (scenario, decision, the row of the thread it is in): the offered options that make
        the run pass, from counterfactual runs (`concurrency` at once), each in the order offered."""
        memo = self.memo
        policy_digest = digest(policy.config.model_dump(mode="json", by_alias=True)) if memo else None

        def distance(run: tuple[int, dict[str, Any], int]) -> float:
            i, option, more = run
            scenario, request, row = cases[i]
            recorded = self._recorded.get(row.thread_id) if self.replay_first else None
            key = (
                self._memo_key(scenario, request, option, policy_digest, row, recorded, more)
                if memo
                else None
            )
            found = memo.get(key) if memo is not None and key is not None else None
            if found is None:
                found = _distance(
                    self.env, scenario, request, option, policy, self.models, row, recorded, more
                )
                if memo is not None and key is not None:
                    memo.put(key, found)
            return found

        def run_all(runs: list[tuple[int, dict[str, Any], int]]) -> list[float]:
            if self.concurrency > 1 and len(runs) > 1 and self.pool is not None:
                return list(self.pool.map(distance, runs))
            if self.concurrency > 1 and len(runs) > 1:
                with ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix="improve-counterfactual"
                ) as pool:
                    return list(pool.map(distance, runs))
            return [distance(run) for run in runs]

        correct: list[list[dict[str, Any]]] = [[] for _ in cases]
        runs = [(i, option, 0) for i, (_, request, _) in enumerate(cases) for option in request.options]
        apart: list[list[float]] = [[] for _ in cases]  # each option's distance, in the order offered
        for (i, option, _), far in zip(runs, run_all(runs), strict=True):
            apart[i].append(far)
            if far == 0:
                correct[i].append(dict(option))
        # A decision no option fixes alone: the next decision answered otherwise too (`DOWNSTREAM`). Only
        # then: where an option fixes the run alone, a later decision that could make up for a wrong one
        # (a loop that asks again) must not make the wrong one look right.
        again = [(i, option, DOWNSTREAM) for i, option, _ in runs if not correct[i]] if DOWNSTREAM else []
        for (i, option, _), far in zip(again, run_all(again), strict=True):
            if far == 0:
                correct[i].append(dict(option))
        # A decision no option makes pass, even with the next answered otherwise: another decision fails
        # the run whatever it answers (an order of two missing items, the other one answered wrongly). Its
        # answers are told apart by the labels still: the options whose run comes closest to the labelled
        # effects and outcome are right there, where some option's run is further (`_apart`). Not where
        # its facts follow from a wrong answer before it (`_follows_a_wrong_answer`: an incident's
        # severity, graded wrongly, then read to choose whom to notify): the answer closest to the labels
        # is then the one for the facts it should have had.
        # In the order the decisions were met (a run's earlier ones first): how each was judged.
        judged = ["passing" if c else "open" for c in correct]
        at = {(scenario.id, _key(request)): i for i, (scenario, request, _) in enumerate(cases)}
        for i, (scenario, request, row) in enumerate(cases):
            if correct[i]:
                continue
            distances = apart[i]
            if not distances or min(distances) == max(distances):
                judged[i] = "indifferent"  # every answer ends as far from the labels: none is wrong
                continue
            if self._follows_a_wrong_answer(scenario, request, row, at, correct, judged, policy):
                judged[i] = "unknown"
                continue
            closest = min(distances)
            correct[i] = [dict(o) for o, d in zip(request.options, distances, strict=True) if d == closest]
            judged[i] = "closest"
        return correct

    def _follows_a_wrong_answer(
        self,
        scenario: Scenario,
        request: DecisionRequest,
        row: OutcomeRow,
        at: dict[tuple[str, str], int],
        correct: Sequence[Sequence[dict[str, Any]]],
        judged: Sequence[str],
        policy: Any,
    ) -> bool:
        """Whether the facts of `request` may follow from a wrong answer before it in its run: a decision
        before it was answered otherwise than its right answers (those that make the run pass, or end it
        closest to the labels), and the run with it answered rightly does not ask `request` as it is (its
        facts changed: the decision read what the wrong answer made); or a decision before it whose right
        answer is not known (not judged, or itself after a wrong answer), which may have been wrong."""
        key = _key(request)
        recorded = self._recorded.get(row.thread_id) if self.replay_first else None
        for earlier, entry in self.decisions(row.thread_id):
            if _key(earlier) == key:
                return False
            j = at.get((scenario.id, _key(earlier)))
            if j is None or judged[j] in ("open", "unknown"):
                return True
            answered = None if entry.type == "xstate.error.actor" else dict(entry.event)
            if judged[j] == "indifferent" or (
                answered is not None and any(same_answer(answered, c) for c in correct[j])
            ):
                continue
            asked = self._asked.get((row.thread_id, _key(earlier)))
            if asked is None:
                fixed = {_key(earlier): dict(correct[j][0])}
                again = _counterfactual_run(self.env, scenario, fixed, policy, self.models, row, recorded)
                asked = frozenset(_key(r) for r, _ in _decisions_in(self.env, again.entries))
                self._asked[(row.thread_id, _key(earlier))] = asked
            if key not in asked:
                return True
        return True

    def _memo_key(
        self,
        scenario: Scenario,
        request: DecisionRequest,
        option: dict[str, Any],
        policy_digest: str | None,
        row: OutcomeRow,
        recorded: RecordedRun | None,
        more: int,
    ) -> str | None:
        """The digest of everything a counterfactual run is a function of (`Counterfactuals`), and of how
        many later decisions it may vary; None when some of it is not JSON-like data."""
        parts = [self._memo_base, policy_digest, self._digest("scenario", scenario.id, scenario.model_dump)]
        if recorded is not None:
            parts.append(self._digest("recorded", row.thread_id, lambda: asdict(recorded)))
        if None in parts:
            return None
        return digest([*parts, recorded is not None, _key(request), option, _seed(scenario, row), more])

    def _digest(self, kind: str, name: str, value: Callable[[], Any]) -> str | None:
        if (kind, name) not in self._digests:
            self._digests[kind, name] = digest(value())
        return self._digests[kind, name]

    def requests(self, thread_id: str) -> list[DecisionRequest]:
        """The requests of the thread's decisions, the thread read at most once."""
        return [request for request, _ in self.decisions(thread_id)]

    def probes(self, scenarios: Sequence[Scenario]) -> list[DecisionRequest]:
        """The explore gate's probe requests (`probe_requests`), from the threads read here."""
        recorded = first_train_threads(self.store)
        train = [s for s in scenarios if s.split == "train" and s.id in recorded]
        return probe_requests(
            self.env, scenarios, requests={s.id: self.requests(recorded[s.id]) for s in train}
        )

    def examples(self, rows: Sequence[OutcomeRow], policy: MachineConfig) -> list[DecisionExample]:
        """Every decision of the given training rows, with its counterfactually correct options."""
        compiled = compile_policy(policy, self.env.judgments, self.env.policy_guards)
        train = [
            (row, scenario, self.decisions(row.thread_id))
            for row in rows
            if row.split == "train" and (scenario := self.by_id.get(row.scenario)) is not None
        ]
        cases: dict[tuple[str, str], tuple[Scenario, DecisionRequest, OutcomeRow]] = {}
        for row, scenario, decisions in train:
            for request, _ in decisions:
                cases.setdefault((scenario.id, _key(request)), (scenario, request, row))
        correct = dict(zip(cases, self.correct(list(cases.values()), compiled), strict=True))
        examples: list[DecisionExample] = []
        for row, scenario, decisions in train:
            for request, entry in decisions:
                key = (scenario.id, _key(request))
                first = initial(compiled, request.to_input())
                examples.append(
                    DecisionExample(
                        thread_id=row.thread_id,
                        scenario=scenario.id,
                        category=scenario.category,
                        name=request.name,
                        facts=request.facts,
                        options=request.options,
                        answered=None if entry.type == "xstate.error.actor" else dict(entry.event),
                        passed=row.passed,
                        correct=correct[key],
                        expected=row.expected_outcome,
                        final_state=row.final_state,
                        reaches_model=first.invoke is not None and first.invoke.src == MODEL_DECIDE,
                    )
                )
        return examples

    def diagnose(
        self, rows: Sequence[OutcomeRow], policy: MachineConfig, skip: Sequence[str] = ()
    ) -> tuple[Diagnosis, list[dict[str, Any]]]:
        """The diagnosis of the training rows and the training decisions it was made from: when a
        training run failed, every training decision with the answers its labels imply were right, so
        failures are clustered by the answer that would have fixed them (empty when nothing failed)."""
        label = policy_label(policy)
        train = [r for r in rows if r.split == "train"]
        if all(r.passed for r in train):
            return diagnose(rows, label, skip=skip), []
        examples = [e.to_json() for e in self.examples(train, policy)]
        return diagnose(rows, label, skip=skip, examples=examples, offers=self.offers), examples

    @functools.cached_property
    def offers(self) -> dict[str, DecisionOffers]:
        """Where each payload value the environment's decisions offer comes from (`payload_offers`)."""
        return payload_offers(self.env.config)

    def branches_hold(
        self, rows: Sequence[OutcomeRow], baseline: MachineConfig, candidate: MachineConfig
    ) -> tuple[Check | None, tuple[str, ...]]:
        """The promotion check that the branches the candidate adds answer right wherever they answer
        on held-out (`overrides`), None when they answer no held-out decision; and the keys
        (`decision_key`) of the held-out decisions they answer wrongly."""
        overrides = self.overrides(rows, baseline, candidate)
        if not overrides:
            return None, ()
        wrong = [o for o in overrides if not o.right]
        keys = tuple(sorted({o.key for o in wrong}))
        scenarios = len({o.scenario for o in overrides})
        # A decision whose right answer the labels do not tell (its run fails whatever it answers, and
        # its facts may follow from a wrong answer before it) neither holds nor refutes the branch: said
        # apart, or "each as the labels say" counted it as confirmed.
        untold = sum(1 for o in overrides if not o.correct)
        apart = (
            f"; {untold} of them the labels do not tell (their runs fail whatever they answer)"
            if untold
            else ""
        )
        if not wrong:
            return Check(
                "branches hold",
                True,
                f"the new branch answers {len(overrides)} held-out decision(s) of {scenarios} scenario(s), "
                + ("each as the labels say" if not untold else f"{len(overrides) - untold} as the labels say")
                + apart,
            ), keys
        shown = "; ".join(
            f"{o.scenario}: {answer_text(o.answer)} where the labels say "
            f"{' or '.join(answer_text(c) for c in o.correct)}"
            for o in wrong[:5]
        )
        return Check(
            "branches hold",
            False,
            f"the new branch answers {len(wrong)} of the {len(overrides)} held-out decision(s) it takes wrongly "
            f"({shown}): its condition holds where its answer is not right, whatever the model answered there"
            + apart,
        ), keys

    def overrides(
        self, rows: Sequence[OutcomeRow], baseline: MachineConfig, candidate: MachineConfig
    ) -> list[Override]:
        """Every held-out decision of the baseline's runs where one of the branches the candidate adds
        would answer, with the options the labels say are right there.

        This reads held-out to judge a change, never to shape one: a branch is a claim that its answer
        is right wherever its condition holds, and the held-out decisions test that claim whatever the
        model answered there (a branch that replaces one wrong answer by another costs the pass rate
        nothing today, and overrides the right answer of a better model tomorrow)."""
        new = {b.index for b in added(baseline, candidate)}
        if not new:
            return []
        branches = route(candidate)
        compiled = compile_policy(baseline, self.env.judgments, self.env.policy_guards)
        fired_at: dict[tuple[str, str], tuple[Scenario, DecisionRequest, OutcomeRow, Any]] = {}
        for row in rows:
            scenario = self.by_id.get(row.scenario)
            if row.split != "held-out" or scenario is None:
                continue
            for request in self.requests(row.thread_id):
                example = {"name": request.name, "facts": request.facts, "options": request.options}
                fired = answer_on(branches, example)
                if fired is not None and fired[0].index in new:
                    fired_at.setdefault((scenario.id, _key(request)), (scenario, request, row, fired))
        found = fired_at.values()
        correct = self.correct([(scenario, request, row) for scenario, request, row, _ in found], compiled)
        return [
            Override(
                scenario.id,
                fired[0].answer(),
                fired[1],
                right,
                decision_key(request.name, request.facts, request.options),
            )
            for (scenario, request, _, fired), right in zip(found, correct, strict=True)
        ]


def _distance(
    env: Environment,
    scenario: Scenario,
    request: DecisionRequest,
    option: dict[str, Any],
    policy: Any,
    models: ModelFactory,
    row: OutcomeRow,
    recorded: RecordedRun | None,
    more: int = 0,
) -> float:
    """How far from its labels the scenario's run ends (0: it passes, `_apart`) with `request` answered
    by `option` and every other decision as the policy makes it: with the thread's recorded answers where
    it asks what the thread asked (`recorded`), and the run's own seed for the rest (a stand-in answers
    as it did in the run, a model behind an endpoint numbers its samples as the run did); or, `more` > 0,
    0 when it passes with the next decision answered by another of its options too (`_completes`)."""
    return _completes(
        env, scenario, {_key(request): option}, _key(request), policy, models, row, recorded, more
    )


def _counterfactual_run(
    env: Environment,
    scenario: Scenario,
    fixed: dict[str, dict[str, Any]],
    policy: Any,
    models: ModelFactory,
    row: OutcomeRow,
    recorded: RecordedRun | None,
) -> RunBuffer:
    """The scenario run again with the `fixed` decisions answered so, the rest as `_distance` says."""
    models_ = {"decider": models(_seed(scenario, row))}
    inner = (
        ReplayFirstDecider(policy, models_, env.judgments, recorded)
        if recorded is not None
        else PolicyDecider(policy, models_, env.judgments)
    )
    thread = f"counterfactual:v0:{scenario.id}:r1"
    store = RunBuffer(thread)  # its one thread, uncopied: nothing changes its entries
    # Scored and thrown away: written without hashes (nothing will verify it). An answer fixed otherwise
    # may lead where the scenario's script answers a wait with an event the machine refuses: that run
    # fails there, as a suite's run does, rather than stopping the diagnosis.
    run_scenario(env, scenario, _Counterfactual(fixed, inner), store, thread, hashes=False, refused="end")
    return store


def _completes(
    env: Environment,
    scenario: Scenario,
    fixed: dict[str, dict[str, Any]],
    last: str,
    policy: Any,
    models: ModelFactory,
    row: OutcomeRow,
    recorded: RecordedRun | None,
    more: int,
) -> float:
    """How far from its labels the scenario's run ends with the `fixed` decisions answered so (`_apart`;
    0: it passes), and, when it does not and `more` allows, 0 when it passes with the first decision
    after `last` (the last one fixed) answered by another of its options too (`DOWNSTREAM`)."""
    store = _counterfactual_run(env, scenario, fixed, policy, models, row, recorded)
    row_ = outcome_row(env, scenario, store.thread_id, store.entries)
    if row_.passed:
        return 0.0
    far = _apart(env, scenario, row_)
    if more <= 0:
        return far
    decisions = _decisions_in(env, store.entries)
    keys = [_key(request) for request, _ in decisions]
    if last not in keys:
        return far
    after = [(k, r, e) for k, (r, e) in zip(keys, decisions, strict=True)][keys.index(last) + 1 :]
    following = next(((k, r, e) for k, r, e in after if k not in fixed), None)
    if following is None:
        return far
    key, request, entry = following
    answered = None if entry.type == "xstate.error.actor" else dict(entry.event)
    passes = any(
        _completes(env, scenario, fixed | {key: option}, key, policy, models, row, recorded, more - 1) == 0
        for option in request.options
        if answered is None or not same_answer(option, answered)  # that answer is the run that failed
    )
    return 0.0 if passes else far


VIOLATION_DISTANCE = 1000.0
"""What a violation adds to how far a run ends from its labels: more than any count of effects, so an
answer whose run breaks a rule is never the closest."""


def _apart(env: Environment, scenario: Scenario, row: OutcomeRow) -> float:
    """How far a failed run ends from its scenario's labels: each labelled effect it misses and each
    effect it records unlabelled, one more for another final state, `VIOLATION_DISTANCE` per violation
    (at least 1: it failed)."""
    far = float(row.final_state != scenario.expected.outcome)
    if scenario.expected.effects is not None:
        diff = compare_effects(row.effects, scenario.expected.effects, env.effect_text_fields)
        far += len(diff.missing) + len(diff.unexpected)
    return max(1.0, far + VIOLATION_DISTANCE * len(row.violations))


def _decisions_in(env: Environment, entries: Sequence[LogEntry]) -> list[tuple[DecisionRequest, LogEntry]]:
    """Every decision of a thread's entries: its request (replayed from the log) and the entry that
    answered it."""
    landed = [e for e in entries if e.metadata and "decision" in e.metadata]
    return list(zip(requests_in(env, entries), landed, strict=False))


def _seed(scenario: Scenario, row: OutcomeRow) -> str:
    """The seed of the run `row` is: a counterfactual run's model answers as that run's did."""
    parsed = ThreadId.parse(row.thread_id)
    return f"{scenario.id}:r{parsed.run if parsed else 1}"


@dataclass(frozen=True)
class Override:
    """A held-out decision a new branch answers, and whether the labels agree with its answer."""

    scenario: str
    branch: str
    answer: dict[str, Any]
    correct: list[dict[str, Any]]
    key: str = ""
    """The decision's key (`decision_key`)."""

    @property
    def right(self) -> bool:
        return not self.correct or any(same_answer(self.answer, c) for c in self.correct)


@dataclass(frozen=True)
class TrainDiagnosis:
    """`improve diagnose` of a policy's labelled training runs: the diagnosis, the SQL that read the
    runs from the warehouse, and the threads set aside because they do not verify."""

    policy: str
    diagnosis: Diagnosis
    sql: str
    quarantined: list[Quarantined]

    def to_json(self) -> dict[str, Any]:
        return self.diagnosis.to_json() | {
            "sql": self.sql,
            "quarantined": [asdict(q) for q in self.quarantined],
        }


def diagnose_policy(
    space: Workspace,
    env: str | None,
    policy: str,
    model: str,
    k: int | None = None,
    *,
    cache: CacheMode,
    say: Say,
) -> TrainDiagnosis:
    """Run (or reuse) the policy's train runs, record them in the warehouse, and diagnose the verified
    rows; held-out failures never shape a change, so only the train split is read."""
    inputs = locate(space, env, policy)
    spec = suite_spec(space, inputs.env, inputs.policy, model, k=k, cache=cache)
    with space.writing(say), Ledger(space, inputs.env, say) as ledger:
        # Runs not recorded yet are made now (a real model is asked): said as they go, and counted after.
        what = f"train runs of {policy_label(inputs.policy)} with model {model} (k = {spec.k})"
        plan = write_threads(
            inputs.env,
            inputs.train,
            spec,
            ledger.store,
            concurrency=8,
            ran=every(25, say, what),
            keep=ledger.keep(),
        )
        for note in kept_aside(plan) + refused_scripts(plan, space.scenarios_path(inputs.env_name)):
            say(note)
        made = sum(not p.reused for p in plan)
        if made:
            say(f"recorded {made} new {what}; {len(plan) - made} reused")
        recorded = ledger.record(
            [p.thread_id for p in plan], say=say, rewritten=[p.thread_id for p in plan if not p.reused]
        )
        evidence = Evidence(
            inputs.env,
            inputs.scenarios,
            ledger.store,
            spec.model_factory(inputs.env),
            replay_first=space.config.objective.replay_first,
            concurrency=8,
        )
        diagnosis, _ = evidence.diagnose(recorded.rows, inputs.policy)
    return TrainDiagnosis(policy_label(inputs.policy), diagnosis, recorded.sql, recorded.quarantined)
