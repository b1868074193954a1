"""One improvement round: from the traces of the current policy to a reviewed pull request.

    Round.run:  baseline   k runs per scenario of the current policy (reused from traces when recorded);
                           where runs wait on a model, the held-out ones go on while the round diagnoses,
                           proposes and gates (`_train_first`), joined before the candidate runs
             -> diagnose   train failures only: clusters, the one to fix, the hypothesis
             -> propose    one change
             -> gate       the gates in order (novelty among them when the CHANGELOG remembers
                           candidates discarded against this policy), at most 3 repairs
             -> replay     the candidate on train and held-out, k runs each, then the sequential reruns;
                           replay-first: each candidate run starts from the baseline's recorded run
             -> decide     the promotion rule (stated before the replay)
             -> preview    the production impact preview: how the candidate would decide on the
                           workspace's recent production threads (it decides nothing)
             -> record     the round record, its report, the CHANGELOG entry, the pull request

Each step reads and sets the round's state and says whether the round goes on; `record` always runs
last and returns the `RoundRecord` (written to the report only when a candidate was proposed). Every
thread the round runs or reuses is recorded in the workspace's warehouse and read back from there;
threads that do not verify are set aside.

The working tree stays on the current policy: a recommended candidate lives on its own branch (with
its CHANGELOG entry); discarded candidates are recorded in the working tree's CHANGELOG and travel with
the next recommended branch, so nothing is lost and the branch merges cleanly.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from improve import clock
from improve.errors import EndpointError, ImproveError, ProposerCrash, raised
from improve.evals import (
    Batch,
    CandidateCheck,
    Ledger,
    OutcomeRow,
    PlannedRun,
    PromotionDecision,
    Quarantined,
    RerunRule,
    Scenario,
    Scorecard,
    Settled,
    Slots,
    StartFrom,
    SuiteSpec,
    Workspace,
    candidate_check,
    decide,
    every,
    fallbacks,
    is_generated,
    kept_aside,
    mistyped_warnings,
    outcome_row,
    paired,
    policy_content,
    policy_label,
    refused_scripts,
    rerun_scenarios,
    scorecard,
    set_key,
    settle,
    split_warnings,
    suite_spec,
    write_threads,
)
from improve.files import check_directory
from improve.llm import Meter
from improve.log import Ahead, KeptReads, LogEntry, Store, ThreadPage
from improve.loop.branches import DiscardedBranch, added, answer_on, route
from improve.loop.counterfactuals import Counterfactuals, StandIn
from improve.loop.diagnose import Diagnosis, ambiguous_labels, in_cluster
from improve.loop.diagnose import diagnose as cluster_failures
from improve.loop.discards import DiscardedCandidate, answers_anew, focus, mined_from, superseded, wrong_key
from improve.loop.evidence import Evidence
from improve.loop.gates import (
    GATE_NAMES,
    EnvironmentGate,
    Gate,
    GateContext,
    Gated,
    GateResult,
    NoveltyGate,
    OutOfSampleGate,
    Unparsed,
    ValidateGate,
    gate,
    gates_for,
)
from improve.loop.gates.out_of_sample import draw_seed, without_wording
from improve.loop.gates.out_of_sample import examples as oos_examples
from improve.loop.generated import environment_key, generated_path, keep, kept
from improve.loop.impact import preview_impact
from improve.loop.inputs import Inputs, RoundOptions, locate
from improve.loop.proposers import (
    Proposal,
    ProposalError,
    ProposalRequest,
    Proposer,
    ProposerSetup,
    make_proposer,
)
from improve.loop.record import Recorder
from improve.loop.round_record import (
    Behind,
    Calls,
    Impact,
    ModelInfo,
    NewBranch,
    OutOfSampleCheck,
    RoundRecord,
    SplitScore,
    Status,
)
from improve.machine import ERROR_EVENT, MachineConfig, canonical_json, diff_states, parse_machine
from improve.runtime import compile_policy, reach_sentinels, runs_overlap, vocabulary

MAX_REPAIRS = 3
Say = Callable[[str], None]
SPLITS = ("train", "held-out")


def run_round(
    space: Workspace, opts: RoundOptions, say: Say = lambda m: None, *, check_facts: bool = True
) -> RoundRecord:
    """One round (see the module's docstring). `check_facts`: say first the scenarios' fact values their
    declared types do not allow (`mistyped_warnings`), which the round would learn from as given."""
    # Before anything runs or a branch is made: the round's report folder can be written.
    check_directory(space.reports, "the reports directory")
    # One writer of the workspace's threads at a time: a second round (or run, or resume) waits, and
    # reads the CHANGELOG and the discarded candidates (the version it takes) after this one has written.
    with space.writing(say):
        inputs = locate(space, opts.env, opts.policy)
        if check_facts:
            path = space.scenarios_path(inputs.env_name)
            for warning in mistyped_warnings(inputs.env, inputs.scenarios, path):
                say(warning)
        # A category only one split has: `scenarios check` refuses the file, and a round said nothing.
        for category in sorted({s.category for s in inputs.scenarios}):
            for warning in split_warnings(inputs.scenarios, category):
                say(f"warning: {warning}")
        with Ledger(space, inputs.env, say) as ledger:
            return Round(space, opts, inputs, ledger, say).run()


MAX_DISCARDED_IN_A_ROW = 3
"""`--rounds` stops after this many candidates discarded in a row against one policy: each read the
held-out set, and a fourth cause is seldom found where three were not."""


def run_rounds(
    space: Workspace, opts: RoundOptions, rounds: int, say: Say = lambda m: None
) -> list[RoundRecord]:
    """Up to `rounds` candidates against the current policy, each aimed at the next cause, until one is
    recommended; stop early after `MAX_DISCARDED_IN_A_ROW` discarded in a row or when the goal already
    holds."""
    records: list[RoundRecord] = []
    skip = list(opts.skip)
    # The rounds diagnose the same baseline: a counterfactual run one of them ran is not run again.
    counterfactuals = opts.counterfactuals if opts.counterfactuals is not None else Counterfactuals()
    for number in range(1, rounds + 1):
        if rounds > 1:  # one round is the command itself: its first lines say what it does
            say(f"round {number}/{rounds} against {opts.policy}")
        record = run_round(
            space,
            dataclasses.replace(opts, skip=list(skip), counterfactuals=counterfactuals),
            say,
            check_facts=number == 1,  # the same scenarios every round: said once
        )
        records.append(record)
        if record.status == "recommended" and number < rounds:
            # The rounds left would start from the candidate, which only a person's merge makes a policy.
            say(
                f"{record.candidate_version} recommended in round {number} of {rounds}: the rounds left start "
                f"from it once it is merged (improve round --policy {record.candidate_version})"
            )
        if record.status != "discarded" and not record.nothing_new:
            break
        if record.cluster:
            skip.append(record.cluster)
        if number >= MAX_DISCARDED_IN_A_ROW:  # every earlier one was discarded too, or the loop had stopped
            say(_without_one(records[-MAX_DISCARDED_IN_A_ROW:], opts.policy))
            break
    return records


def _none_for(second: bool) -> str:
    """What a round found for a cluster it passed over: no second rule, or none at all."""
    return "no narrower or broader rule" if second else "no rule"


def _without_one(records: Sequence[RoundRecord], policy: str) -> str:
    """Rounds in a row that recommended nothing, said by what each found (a round with nothing left to
    try ran no candidate and read no held-out run) and what to do next."""
    discarded = sum(r.status == "discarded" for r in records)
    reads = sum(1 for r in records if r.held_out is not None)
    found = [f"{discarded} candidate(s) discarded"] if discarded else []
    if discarded < len(records):
        found.append(f"{len(records) - discarded} with nothing left to try")
    read = "each" if reads == len(records) else str(reads) if reads else "none"
    return (
        f"{len(records)} rounds in a row without a recommendation against {policy}: stopping ({', '.join(found)}; "
        f"{read} read the held-out set; label more "
        "scenarios, or run again to go on)"
    )


def round_failed(records: Sequence[RoundRecord]) -> bool:
    """Whether rounds end in failure for a caller (exit 1): nothing recommended, and a candidate was
    discarded or a round was blocked. Rounds that only found the goal holding or nothing left to try
    did not fail; one that discarded a candidate did, whatever the rounds after it found."""
    if any(r.status == "recommended" for r in records):
        return False
    return any(r.status in ("discarded", "blocked") for r in records)


class Round:
    """One round's state and its steps (see the module's docstring)."""

    def __init__(
        self, space: Workspace, opts: RoundOptions, inputs: Inputs, ledger: Ledger, say: Say
    ) -> None:
        self.space, self.opts, self.inputs, self.ledger = space, opts, inputs, ledger
        self.say = _Held(say)
        self.warned: set[str] = set()
        self.objective = space.config.objective
        self.k = opts.k or self.objective.k
        self.replay_first = (
            opts.replay_first if opts.replay_first is not None else self.objective.replay_first
        )
        self.version = inputs.memory.version
        self.round_id = f"{clock.now().strftime('%Y%m%d-%H%M%S')}-{inputs.env_name}-v{self.version}"
        self.label = policy_label(inputs.policy)
        self.spec = suite_spec(space, inputs.env, inputs.policy, opts.model, k=self.k, cache=opts.cache)
        # One model for the whole round: the suites and the counterfactual runs share its session (its way
        # of asking, its concurrency cap, its cache) and one meter, whose limit every suite checks.
        self.meter = opts.meter if opts.meter is not None else Meter(limit_usd=opts.max_usd, say=say)
        self.session = self.spec.chat_session(self.meter)
        self.models = self.session.model if self.session is not None else self.spec.model_factory(inputs.env)
        self.reads = KeptReads(ledger.store)
        """The threads this round reads again (the baseline's), each decoded once."""
        self._slots = Slots(opts.concurrency)
        """Runs in flight at once across the round's suites (the reruns run ahead beside the candidate's),
        on one pool of threads, the counterfactual runs' too; closed when the round ends."""
        self.evidence = Evidence(
            inputs.env,
            inputs.scenarios,
            self.reads,
            self.models,
            replay_first=self.replay_first,
            concurrency=opts.concurrency,
            memo=opts.counterfactuals if opts.counterfactuals is not None else Counterfactuals(),
            stand_in=StandIn(inputs.env_hashes, self.spec.model) if self.session is None else None,
            pool=self._slots.pool,
        )
        self.train_key = mined_from(set_key(inputs.train), inputs.env_hashes)
        """What the clusters are mined from, the training split and the environment's files: a cluster
        found rule-less on another set, or before the environment changed (a fact the machine now
        computes, as docs/extending.md advises for text said many ways), is tried again."""
        memory = inputs.memory
        self.superseded = superseded(
            memory.tried,
            [(e.round_id, e.cluster, e.candidate) for e in memory.changelog.entries if e.recommended],
            memory.lineage,
        )
        """Discarded candidates whose cluster had a candidate promoted since: its failures left are mined
        afresh, not as narrower rules than theirs (`discards.superseded`)."""
        self.focus = focus(
            memory.tried,
            baseline=self.label,
            model=opts.model,
            train=self.train_key,
            superseded=self.superseded,
        )
        """Where the round aims after the candidates discarded along the policy's line."""
        self._split_decisions: dict[str, list[dict[str, Any]]] = {}
        self.wrong_held_out: tuple[str, ...] = ()
        """The held-out decisions the candidate's new branches answered wrongly (`decide`)."""
        self.renewed: frozenset[str] | None = None
        """Rounds whose candidate, discarded for reaching too far, answers otherwise behind this round's
        baseline (`discards.answers_anew`): found once, when the baseline's runs are known."""
        self.aim: str | None = None
        """What the round said about its cluster: a narrower rule for it, or the next cluster."""
        self.again: str | None = None
        """The cluster that came round again, every other one tried along this policy's line."""
        self.passed_over: list[str] = []
        """Clusters this round asked a rule for and got none (`propose`): it moved on."""
        self.passed_why: list[str] = []
        """For each of them, what it got none of (`_none_for`)."""
        self.behind: DiscardedCandidate | None = None
        """The discarded candidate whose branches this round's candidate carries (`_behind`)."""
        self.followed: str | None = None
        """The round of the discarded candidate this round looked behind (`_behind`), carried or not."""
        self.still_failing: list[str] = []
        """The training scenarios the candidate's branches answered otherwise that still fail (`decide`)."""
        # What the steps find.
        self.status: Status = "discarded"
        self.detail = ""
        self.goal_met = False
        self.model_info: ModelInfo | None = None
        self.quarantined: list[Quarantined] = []
        self.base_rows: list[OutcomeRow] = []
        self.cards: dict[str, Scorecard] = {}
        """Each split's scorecards in the order they are shown: the baseline's, then the candidate's."""
        self.diagnosis: Diagnosis | None = None
        self.request: ProposalRequest | None = None
        self.proposer: Proposer | None = None
        self.proposal: Proposal | None = None
        self.gates: list[GateResult] = []
        self.gated: Gated | None = None
        self.repairs = 0
        self.calls = 0
        self.candidate: MachineConfig | None = None
        self.candidate_spec: SuiteSpec | None = None
        self.settled: Settled | None = None
        self.verdict: PromotionDecision | None = None
        self.impact: Impact | None = None
        self.out_of_sample: OutOfSampleCheck | None = None
        self._oos_gate: OutOfSampleGate | None = None
        self._held: tuple[dict[tuple[str, int], PlannedRun], dict[tuple[str, int], PlannedRun]] | None = None
        """The reruns run ahead (`_ahead`), the baseline's and the candidate's, by scenario and run."""
        self._ahead_store: Ahead | None = None
        self._background: _Background | None = None
        self._baseline_suite: _Background | None = None
        """The baseline's suite, going on with its held-out runs while the round diagnoses (`_train_first`)."""
        self._baseline_rows: list[list[OutcomeRow]] | None = None
        """What it gives when it ends: the baseline's rows on both splits."""

    def run(self) -> RoundRecord:
        steps = (
            self.baseline,
            self.diagnose,
            self.propose,
            self.gate,
            self.replay,
            self.decide,
            self.preview,
        )
        try:
            for step in steps:
                if not step():
                    break
            self._join_baseline()  # a round that stopped early still records the baseline's runs
            self._nothing_new()
            return self.record()
        finally:
            if self._baseline_suite is not None:
                self._baseline_suite.join()  # its runs are on the pool closed next
                for message in self.say.release():  # a round that raised meanwhile still says what it did
                    self.say(message)
            self._slots.close()

    # --- the steps ------------------------------------------------------------------------------

    def baseline(self) -> bool:
        """The current policy's runs on both splits; the round stops when its goal already holds."""
        inputs = self.inputs
        # Made before anything runs: a proposer that cannot be made (a model or a key missing) is named
        # now, not after the baseline's runs (each round makes its own, so a tried request is its own).
        self._proposer()
        reach = reach_sentinels(inputs.env)
        if reach.reachable:
            # No policy change can keep out what a person's event or a tool's output leads to: as with an
            # invariant violation on train, the environment needs a person first.
            self.status, self.detail = "blocked", reach.summary()
            return False
        self.say(
            f"baseline: {self.label} on {len(inputs.train)} train + {len(inputs.held_out)} held-out "
            f"scenarios, k={self.k}"
        )
        stale = inputs.memory.stale
        if stale:
            self.say(
                f"the held-out set is now {inputs.memory.held_out.key}: candidates discarded for gaining too "
                "little on another may be proposed again: "
                + ", ".join(
                    f"{t.candidate} (round {t.round}, "
                    + (f"set {t.held_out[0]})" if t.held_out else "which found nothing but those)")
                    for t in stale
                )
            )
        if self._train_first():
            # Diagnosing, proposing and gating read no held-out run: the suite of both splits goes on in
            # the background once its training runs are recorded, the held-out runs waiting on the model
            # while the round works, and is joined before the candidate runs (`_join_baseline`).
            train = [self.spec.thread_id(sc, n) for sc in inputs.train for n in range(1, self.k + 1)]
            ready = threading.Event()
            early: list[list[OutcomeRow]] = []
            every_row: list[list[OutcomeRow]] = []

            def train_recorded(rows: list[OutcomeRow]) -> None:
                early.append(rows)
                ready.set()

            def suite() -> None:
                try:
                    both = [*inputs.train, *inputs.held_out]  # the training runs first
                    every_row.append(
                        self._written_and_verified(both, self.spec, "baseline", train, train_recorded)
                    )
                finally:
                    ready.set()  # a suite that failed wakes the round, which then raises its error

            self._baseline_suite = _Background(suite, reraise=True)
            self._baseline_rows = every_row
            ready.wait()
            if not early:
                self._baseline_suite.done()
            self.base_rows = early[0]
            self._answered(self.base_rows, f"baseline {self.label} on train")
            self.cards = _cards(self.base_rows, self.label)
            # Until it is joined, the round's own messages wait, so they read as they would after it; and
            # where the goal turns out to hold already, what the round did meanwhile is dropped unsaid.
            self.say.hold()
            return True
        self.base_rows = self._written_and_verified(inputs.scenarios, self.spec, "baseline")
        self._note("baseline")
        self._answered(self.base_rows, f"baseline {self.label}")
        self.cards = _cards(self.base_rows, self.label)
        return not self._goal_holds()

    def _train_first(self) -> bool:
        """Whether the held-out baseline may run while the round diagnoses, proposes and gates: its runs
        wait on a model together, and nothing before the candidate's runs reads a held-out run but the
        goal (no discarded candidate whose novelty or renewal is judged on one). The goal is checked when
        it is joined (`_join_baseline`)."""
        inputs = self.inputs
        return self._overlaps() and not inputs.memory.tried and bool(inputs.train) and bool(inputs.held_out)

    def _join_baseline(self) -> bool:
        """The baseline's suite, whose held-out runs went on beside the diagnosis (`_train_first`),
        joined: its rows on both splits, in the order a suite of the scenario file gives them; then what
        the round said meanwhile. False when the goal already holds on held-out: the round stops as if it
        had checked before diagnosing."""
        if self._baseline_suite is None or self._baseline_rows is None:
            return True
        try:
            self._baseline_suite.done()  # raises the suite's error, if it failed
        finally:
            said = self.say.release()
        # In the scenario file's order, as the suite of both splits at once gives them.
        order = {
            self.spec.thread_id(sc, n): i
            for i, (sc, n) in enumerate((sc, n) for sc in self.inputs.scenarios for n in range(1, self.k + 1))
        }
        self.base_rows = sorted(self._baseline_rows[0], key=lambda r: order.get(r.thread_id, len(order)))
        self._baseline_rows = None
        self._note("baseline")
        self._answered(self.base_rows, f"baseline {self.label}")
        self.cards = _cards(self.base_rows, self.label)
        if self._goal_holds():
            self._undo_speculation()
            return False
        for message in said:
            self.say(message)
        return True

    def _goal_holds(self) -> bool:
        """Whether the baseline already meets the goal on held-out (the round then has nothing to fix)."""
        held_out, goal = self.cards["held-out"], self.inputs.goal
        if goal is not None and held_out.pass_rate >= goal and held_out.violations == 0:
            self.status, self.goal_met = "nothing-to-fix", True
            self.detail = f"the goal already holds: held-out pass rate {held_out.pass_rate:.3f} >= {goal}"
            return True
        return False

    def _undo_speculation(self) -> None:
        """Forget what the round found while the held-out baseline ran: a round whose goal holds stops
        before diagnosing."""
        self.diagnosis = self.request = self.proposer = self.proposal = self.gated = None
        self.candidate, self.gates, self.repairs, self.calls = None, [], 0, 0
        self.aim = self.again = None
        self.passed_over, self.passed_why = [], []

    def diagnose(self) -> bool:
        """The training failures clustered, the cluster to fix and the hypothesis. A cluster whose
        candidate was discarded along this policy's line gets a narrower rule once when that candidate
        reached too far, else the round moves on to the next cluster (`discards.focus`); when every cluster
        was tried, the one tried longest ago comes round again (with a broader rule when its one
        candidate gained too little). First, a candidate that gained too little while a later decision
        still failed its runs is looked behind (`_behind`)."""
        self.say("diagnose: train failures only")
        self._renew()
        if self._behind():
            return True
        tried = [c for c in self.focus.skip if c not in self.opts.skip and c not in self.passed_over]
        skip = [*self.opts.skip, *self.passed_over, *tried]
        self.diagnosis, examples = self.evidence.diagnose(self.base_rows, self.inputs.policy, skip)
        again: str | None = None
        if self.focus.spent and self._deterministic():
            tried = [c for c in tried if c not in self.focus.spent]
        while self.diagnosis.chosen is None and not self.diagnosis.blocked and tried:
            # Every cluster left was tried along this line: the one tried longest ago comes round again
            # (the novelty gate still refuses a candidate that answers as a discarded one did).
            again = tried.pop(0)
            skip.remove(again)
            self.diagnosis, examples = self.evidence.diagnose(self.base_rows, self.inputs.policy, skip)
        diagnosis = self.diagnosis
        ambiguous = ambiguous_labels(examples)
        if ambiguous is not None and ambiguous not in self.warned:
            self.warned.add(ambiguous)  # a round that diagnoses again (the next cluster) says it once
            self.say(f"warning: {ambiguous}")
        # Said of the clusters this training set still shows, once: a cluster found rule-less on an
        # earlier set that no run fails now needs no word, and `--rounds` would repeat it each round.
        afresh = [c for c in self.focus.afresh if any(k.id == c for k in diagnosis.clusters)]
        if afresh:
            self.say(
                f"cluster(s) {', '.join(afresh)} had no rule (or none that passed the gates) on an earlier "
                f"training set or environment: open to a rule again on this one ({self.train_key})"
            )
        if diagnosis.blocked:
            self.status, self.detail = "blocked", diagnosis.blocked
            return False
        if diagnosis.chosen is None or diagnosis.hypothesis is None:
            self.status, self.detail = "nothing-left-to-try", nothing_left(diagnosis)
            return False
        self.aim = self.focus.says(diagnosis.chosen.id)
        self.again = None
        if again is not None and diagnosis.chosen.id == again:
            self.aim, self.again = self.focus.again(again), again
        if self.passed_over:
            passed = ", ".join(
                f"{why} for {c}" for c, why in zip(self.passed_over, self.passed_why, strict=True)
            )
            self.aim = f"{self.aim or 'the next cluster'} ({passed})"
        if self.aim:
            self.say(f"aiming at {self.aim}")
        self.say(f"cluster: {diagnosis.chosen.title} -> {diagnosis.hypothesis.change}")
        self.request = self._request(diagnosis, examples)
        return True

    def _behind(self) -> bool:
        """The decision after a discarded candidate's branches, tried with them as one candidate.

        A branch that answers its decision rightly gains nothing while a later decision fails the same
        runs (an agent that resolves a claim, then tells the customer: an escalated claim must also be
        called about). Its baseline's runs never reached the later decision in the situations the
        branch makes, so no rule for it can be learned from them. The candidate's own training runs did:
        the newest candidate discarded against this baseline for gaining too little while runs its
        branches answered otherwise still failed (`DiscardedCandidate.later`) is run again as it was
        (its recorded runs are reused), its failures there are diagnosed at a decision other than the
        one its cluster was at, in those scenarios, and the proposer adds a branch for that decision
        to the candidate: both are gated, replayed and judged against the baseline as one candidate.
        Each discarded candidate is looked behind once, whatever its runs show (`followed`, kept in
        the memory with this round's candidate when it is discarded), and one that was itself such a
        candidate is not (one decision after, as `evidence.DOWNSTREAM` looks one decision ahead); False
        when none is to follow or its runs show no such cluster (the round goes on as usual)."""
        memory, label = self.inputs.memory, self.label
        followed = {t.followed or t.behind for t in memory.tried}
        last = next(
            (
                t
                for t in reversed(memory.tried)
                if t.later
                and t.policy is not None
                and t.behind is None
                and t.baseline == label
                and t.round not in followed
                and t.model in (None, self.opts.model)
                and t.cluster is not None
                and t.cluster.startswith("wrong-answer:")
            ),
            None,
        )
        if last is None or last.policy is None or last.cluster is None:
            return False
        try:
            policy = parse_machine(dict(last.policy), f"candidate {last.candidate} (round {last.round})")
        except ImproveError:
            return False  # a memory written by another version of the schema: not followed
        first = last.cluster.split(":")[1]
        self.followed = last.round
        self.say(
            f"behind candidate {last.candidate} (round {last.round}): its branch gained too little while "
            f"{len(last.later)} training scenario(s) it answered otherwise still failed; its runs again, "
            "for the decision after it"
        )
        spec = dataclasses.replace(self.spec, policy=policy)
        rows = self._written_and_verified(self.inputs.train, spec, f"candidate {last.candidate}")
        diagnosis, examples = self.evidence.diagnose(rows, policy)
        later = set(last.later)
        skip = [
            c.id
            for c in diagnosis.clusters
            if not (c.answer and c.answer["decision"] != first and later & set(c.scenarios))
        ]
        diagnosis = cluster_failures(rows, policy_label(policy), skip=skip, examples=examples)
        if diagnosis.chosen is None or diagnosis.hypothesis is None:
            self.say(f"behind candidate {last.candidate}: no failure at a later decision to fix; on as usual")
            return False
        shown = _shown(last)
        self.behind, self.diagnosis = last, diagnosis
        self.aim = (
            f"the decision after candidate {last.candidate}'s branch ({shown}; round {last.round}), which gained "
            f"too little while {len(last.later)} training scenario(s) it answered otherwise still failed: "
            "a branch for it, with that branch, as one candidate"
        )
        self.say(f"aiming at {self.aim}")
        self.say(f"cluster: {diagnosis.chosen.title} -> {diagnosis.hypothesis.change}")
        self.request = self._request(diagnosis, examples, policy)
        return True

    def _deterministic(self) -> bool:
        """Whether the round's proposer answers the same request the same way (the rule miner)."""
        proposer = self.opts.proposer if not isinstance(self.opts.proposer, str) else self._proposer()
        return bool(getattr(proposer, "deterministic", False))

    def _renew(self) -> None:
        """A candidate discarded for reaching too far is tried again when its branches, behind this
        baseline's, answer the training and held-out decisions otherwise than it did: a branch promoted
        since answers first some of the decisions it took, or it stood in front of a less safe branch
        (the safety order puts a new branch there where no training label decides) that answers rightly
        the held-out decisions it took wrongly; its rule then goes behind (`ProposalRequest.behind`).
        One that answers them as it did still asks for a narrower rule (and the novelty gate refuses
        it)."""
        memory = self.inputs.memory
        if self.renewed is not None:
            return
        self.renewed = frozenset()
        ancestors = [t for t in memory.tried if t.reason == "reach"]
        if not ancestors:
            return
        decisions = [*self._decisions("train"), *self._decisions("held-out")]
        current = route(self.inputs.policy)
        held_out = memory.held_out.key
        self.renewed = frozenset(t.round for t in ancestors if answers_anew(t, current, decisions, held_out))
        if self.renewed:
            self.focus = focus(
                memory.tried, self.renewed, self.label, self.opts.model, self.train_key, self.superseded
            )
            self.say(
                "discarded for reaching too far, candidate(s) "
                + ", ".join(t.candidate for t in ancestors if t.round in self.renewed)
                + " would answer otherwise behind this baseline's branches: their rules may be proposed"
                " again, behind them (the round's result below says whether one was)"
            )

    @property
    def discarded(self) -> list[DiscardedBranch]:
        """The branches a candidate must not add as written: the memory's, less those of renewed rounds."""
        renewed = self.renewed or frozenset()
        return [d for d in self.inputs.memory.discarded if d.round not in renewed]

    def propose(self) -> bool:
        """One change, from the round's proposer."""
        assert self.request is not None
        self.proposer = self._proposer()
        try:
            self.proposal = self._asked("propose", partial(self.proposer.propose, self.request))
        except ProposalError as err:
            self.calls += err.calls  # asked, though nothing came of it
            chosen = self.diagnosis.chosen if self.diagnosis is not None else None
            second = bool(self.request.narrower or self.request.broader)
            if chosen is not None and (second or self._last_without_rule(chosen.id)):
                # A second rule for a tried cluster that the proposer cannot find costs no held-out read
                # and is no candidate: the round moves on to the next cluster instead of ending. So does
                # the last fresh cluster's first rule (`_last_without_rule`).
                self.say(f"{_none_for(second)} for cluster {chosen.id}: {err}")
                self.passed_over.append(chosen.id)
                self.passed_why.append(_none_for(second))
                return self.diagnose() and self.propose()
            self.gates = [GateResult("propose", False, str(err))]
            self._note("evidence")
            return False
        self.calls += self.proposal.calls
        return True

    def _asked(self, what: str, call: Callable[[], Proposal]) -> Proposal:
        """The proposer's answer to `call`; anything it raises but a `ProposalError` (its own bug: a
        workspace's proposer module, an installed package's) is a `ProposerCrash` naming it, what it was
        asked, and the file and line that raised, never a traceback."""
        name = getattr(self.proposer, "name", type(self.proposer).__name__)
        model = getattr(self.proposer, "model", None)
        if isinstance(model, str):
            # A model's reply to a request of thousands of tokens can take minutes on a small machine.
            self.say(f"{what}: asking proposer '{name}' ({model}) for a candidate")
        try:
            return call()
        except ImproveError:
            raise
        except Exception as err:
            raise ProposerCrash(
                f"proposer '{name}' crashed when asked to {what} a candidate: "
                f"{raised(err, within=self.space.root)}"
            ) from err

    def _last_without_rule(self, cluster: str) -> bool:
        """Whether `cluster`, for which a proposer that answers the same request the same way (the rule
        miner) found no first rule, is the last cluster this round could aim at afresh: the round then goes
        on to what the next round would find (a tried cluster come round again, or nothing left to try)
        rather than end as a discarded candidate, which spent a version and a CHANGELOG entry on no
        candidate and made `--rounds` exit 1. Where other clusters are left, the round still ends (the
        next one aims at them): moving on within the round was measured, and on the code-agent desk it
        reached, within the demo's six rounds, a rule that loops out of sample (docs/architecture.md)."""
        diagnosis = self.diagnosis
        if (
            diagnosis is None
            or self.again is not None
            or self.behind is not None
            or not self._deterministic()
        ):
            return False
        return not any(c.id != cluster and c.id not in diagnosis.skipped for c in diagnosis.clusters)

    def gate(self) -> bool:
        """The gates in order; a failure goes back to the proposer with its detail, at most
        MAX_REPAIRS times (a changed environment is never repaired)."""
        assert self.request is not None and self.proposer is not None and self.proposal is not None
        context = self._gate_context(self.request)
        said: set[str] = set()
        while True:
            for note in self.proposal.notes:
                if note not in said:
                    said.add(note)
                    self.say(f"proposer: {note}")
            document = self._ours(self.proposal.document)
            self.gated = gate(
                document if document is not None else Unparsed("the proposer returned nothing"),
                context,
                source=f"candidate v{self.version}",
            )
            self.gates = list(self.gated.results)
            failed = self.gated.failed
            if failed is None:
                # A round's gates are the eight built-in ones and, as `improve verify` lists them, any
                # registered extension, and novelty when candidates were discarded against the baseline.
                extra = [g.name for g in self.gates if g.name not in GATE_NAMES]
                self.say(
                    f"gates: all {len(self.gates)} pass"
                    + (f" (the eight built-in and {', '.join(extra)})" if extra else "")
                    + (f" after {self.repairs} repair(s)" if self.repairs else "")
                )
                config = self.gated.config
                if config is not None and self._already(config):
                    return False
                self.candidate = self._numbered(config) if config is not None else None
                return True
            self.say(f"gates: {failed.name} failed: {failed.detail.splitlines()[0]}")
            if failed.name == EnvironmentGate.name or self.repairs >= MAX_REPAIRS:
                break
            self.repairs += 1
            if failed.name == OutOfSampleGate.name:
                self._learn_from_generated_cases()
            try:
                self.proposal = self._asked(
                    "repair", partial(self.proposer.repair, self.request, self.proposal, failed)
                )
            except ProposalError as err:
                self.calls += err.calls
                self.gates.append(GateResult("repair", False, str(err)))
                break
            self.calls += self.proposal.calls
        refused = next((g for g in reversed(self.gates) if not g.ok and g.name != "repair"), None)
        if refused is not None and refused.name == OutOfSampleGate.name:
            # What the generated cases showed of the last candidate, recorded as a recommended one's
            # is: the report then says how to draft those cases as scenarios to label.
            self.out_of_sample = self._out_of_sample()
        self._note("evidence")
        return False

    def _learn_from_generated_cases(self) -> None:
        """The decisions of generated cases the last candidate's new branches answered otherwise than
        careful, labelled by careful's answer, added to the request's decisions: the repair's rule must
        keep out of them as it keeps out of a training decision it would answer wrongly."""
        assert self.request is not None and self._oos_gate is not None
        found = self._oos_gate.found
        if found is None:
            return
        new = found.counterexamples()
        inputs = self.inputs
        keep(generated_path(self.space.root, inputs.env_name), new, environment_key(inputs.env_hashes))
        if new:
            copies = self._worded(new, self.request.examples)
            self.request = dataclasses.replace(self.request, examples=[*self.request.examples, *copies])
            self.say(
                f"repair: the {len(new)} decision(s) of those generated cases, labelled by careful's answer, "
                "join the training decisions the next rule must not answer wrongly"
            )

    def _ours(self, document: Any) -> Any:
        """The proposed document under the policy's own id and goal (`description`) and the version this
        round gives it: a proposal changes what the policy does, not what it is; a model that wrote
        others (its own version, a description of its change) is corrected, and the round says so."""
        if not isinstance(document, dict):
            return document
        policy = self.inputs.policy
        own = {"id": policy.id, "version": str(self.version), "description": policy.description}
        own = {k: v for k, v in own.items() if v is not None}
        changed = sorted(k for k, v in own.items() if document.get(k) != v)
        if changed:
            self.say(
                f"proposer: its candidate's {', '.join(changed)} set to the round's ({', '.join(f'{k} {own[k]!r}'[:80] for k in changed)})"
            )
        return {**document, **own}

    def _already(self, candidate: MachineConfig) -> bool:
        """Whether a version's policy file already holds the candidate (a merged review branch left it
        there): the round then ends with nothing to propose, before any candidate run. Numbered as a
        candidate, it became a second review branch and CHANGELOG entry of a policy there is."""
        inputs, mine = self.inputs, policy_content(candidate)
        numbered = [(int(p.stem[1:]), p) for p in inputs.policies_dir.glob("v*.json") if p.stem[1:].isdigit()]
        for number, path in sorted(numbered):
            try:
                held = inputs.space.load_policy(inputs.env_name, path.stem)
            except ImproveError:
                continue  # a file that does not load holds no candidate; `improve verify` says why
            if policy_content(held) != mine:
                continue
            root = inputs.space.root
            shown = path.relative_to(root) if path.is_relative_to(root) else path
            self._take(str(number))
            self.status = "nothing-left-to-try"
            self.detail = (
                f"this candidate is v{number}, already in {shown}: nothing to propose against {self.label}"
                + (
                    f"; to improve on v{number}, start from it (improve round --policy v{number})"
                    if f"v{number}" != self.label
                    else ""
                )
            )
            self.say(self.detail)
            return True
        return False

    def _numbered(self, candidate: MachineConfig) -> MachineConfig:
        """The candidate under its own version: a recommended candidate nobody merged yet holds the one
        this round took if it holds something else (its review branch and threads are under it)."""
        version = self.inputs.memory.own_version(self.version, candidate)
        if version == self.version:
            return candidate
        if self.inputs.memory.recommended.get(f"v{version}") == policy_content(candidate):
            self.say(
                f"candidate v{version}: the same candidate was recommended as v{version}, not merged yet: it "
                "keeps that version (its review branch and threads)"
            )
        else:
            self.say(
                f"candidate v{version}: v{self.version} is held by a recommended candidate not merged yet "
                "(its review branch and threads)"
            )
        self._take(version)
        return candidate.model_copy(update={"version": version})

    def _take(self, version: str) -> None:
        """The round's candidate numbered `version`: the round's id and the proposed document say it."""
        self.version = version
        self.round_id = f"{self.round_id.rsplit('-v', 1)[0]}-v{version}"
        if self.proposal is not None and isinstance(self.proposal.document, dict):
            self.proposal = dataclasses.replace(
                self.proposal, document={**self.proposal.document, "version": version}
            )

    def replay(self) -> bool:
        """The candidate on train and held-out (one suite, so its runs overlap), then the sequential
        rule's reruns of both policies; replay-first, each candidate run starts from the baseline's."""
        if not self._join_baseline():
            return False
        assert self.candidate is not None and self.gated is not None
        label = policy_label(self.candidate)
        self.candidate_spec = dataclasses.replace(self.spec, policy=self.candidate)
        how = ", replay-first" if self.replay_first else ""
        self.say(f"candidate {label}: train and held-out, k={self.k}{how}")
        scenarios = [*self.inputs.train, *self.inputs.held_out]
        start = self._start(self.base_rows)
        self._run_ahead_of_branches()
        if start is not None and self._overlaps():
            # The runs that part from the baseline's (and wait on the model) start first, so their waits
            # are not behind the others' replays; the plan keeps the suite's order.
            parting = self._parting()
            at = {(sc.id, n): i for i, sc in enumerate(scenarios) for n in range(1, self.k + 1)}
            first = [sc for sc in scenarios if sc.id in parting] + [
                sc for sc in scenarios if sc.id not in parting
            ]
            plan = self._write(first, self.candidate_spec, "candidate", start=start)
            plan.sort(key=lambda p: at.get((p.scenario.id, p.run), len(at)))
        else:
            plan = self._write(scenarios, self.candidate_spec, "candidate", start=start)
        if self._background is None:
            self._run_ahead_of(plan)
        rows = self._verified(plan, "candidate")
        rule = RerunRule.from_objective(self.objective, self.k)
        self.settled = settle(self.base_rows, rows, rule, self._run_more)
        if self.settled.reruns.scenarios:
            self.say(f"reruns: {self.settled.reruns.summary()}")
        self._note("candidate")
        self._answered(self.settled.baseline, f"baseline {self.label}")
        self._answered(self.settled.candidate, f"candidate {label}")
        return True

    def decide(self) -> bool:
        """The promotion rule on the paired scorecards, with the new branches checked on held-out."""
        assert self.settled is not None and self.candidate is not None
        base = _cards(self.settled.baseline, self.label)
        cand = _cards(self.settled.candidate, policy_label(self.candidate))
        for split in SPLITS:
            # A scenario whose threads were all set aside on one side cannot be paired: it is left out of
            # both, and said so, rather than scored on one side only.
            base[split], cand[split], unpaired = paired(base[split], cand[split])
            if unpaired:
                self.say(
                    f"  {split}: left out of the comparison (no verified run on one side): {', '.join(unpaired)}"
                )
        self.cards = {"train": base["train"], "candidate train": cand["train"]}
        self.cards |= {"held-out": base["held-out"], "candidate held-out": cand["held-out"]}
        hold, wrong = self.evidence.branches_hold(self.settled.baseline, self.inputs.policy, self.candidate)
        self.wrong_held_out = tuple(wrong_key(key) for key in wrong)
        self.verdict = decide(
            base["train"],
            base["held-out"],
            cand["train"],
            cand["held-out"],
            self.objective,
            self.settled.reruns,
            extra=[hold] if hold else [],
        )
        self.status = "recommended" if self.verdict.promote else "discarded"
        self.detail = "; ".join(
            f"{c.name}: {'pass' if c.ok else 'FAIL'} ({c.detail})" for c in self.verdict.checks
        )
        if not self.verdict.promote:
            self.detail += self._still_failing(self.settled.candidate)
        return True

    def _still_failing(self, rows: Sequence[OutcomeRow]) -> str:
        """Where the candidate's branch answered a training run otherwise than the baseline and the run
        still fails: said, with one run's reason, because a branch that answers its decisions right can
        gain nothing while a later decision fails those runs (an agent that decides twice). Those whose
        failed runs asked another decision than the cluster's are kept (`still_failing`): the next round
        tries that decision behind the branch (`_behind`). Empty when every such run passes."""
        parting = self._parting("train")
        failing = sorted(
            (r for r in rows if r.split == "train" and r.scenario in parting and not r.passed),
            key=lambda r: r.thread_id,
        )
        if not parting or not failing:
            return ""
        scenarios = sorted({r.scenario for r in failing})
        chosen = self.diagnosis.chosen if self.diagnosis is not None else None
        first = chosen.answer["decision"] if chosen is not None and chosen.answer else None
        later: dict[str, set[str]] = {}
        for row in failing if first is not None else ():
            for request in self.evidence.requests(row.thread_id):
                if request.name != first:
                    later.setdefault(request.name, set()).add(row.scenario)
        self.still_failing = sorted(set().union(*later.values())) if later else []
        said = (
            f"; its branch answers {len(parting)} training scenario(s) otherwise than the baseline, and "
            f"{len(scenarios)} still fail ({failing[0].scenario}: {failing[0].reason[:240]}): if its answer is "
            "right there, a later decision fails those runs"
        )
        if not later:
            return said + ", and a rule for that decision may have to come first"
        names = ", ".join(f"'{name}'" for name in sorted(later))
        return (
            f"{said} ({names} in {len(self.still_failing)} of them): the next round tries a branch for it "
            "behind this one, both as one candidate"
        )

    def preview(self) -> bool:
        """The production impact preview of the candidate (`loop/impact.py`): recorded, never decisive."""
        assert self.gated is not None and self.candidate is not None
        compiled = self.gated.machine or compile_policy(
            self.candidate, self.inputs.env.judgments, self.inputs.env.policy_guards
        )
        self.impact = preview_impact(self.ledger, compiled, self.opts.model)
        self.say(f"production: {self.impact.summary()}")
        if self.status == "recommended":
            self.out_of_sample = self._out_of_sample()
            if self.out_of_sample is not None:
                self.say(f"out of sample: {self.out_of_sample.summary()}")
        return True

    def _out_of_sample(self) -> OutOfSampleCheck | None:
        """What the `out-of-sample` gate found of the recommended candidate, as the round records it."""
        gate = self._oos_gate
        if gate is None:
            return None
        if gate.error is not None:
            # A generator's mistake (a case it cannot label) is said; the gate passed without a check.
            self.say(f"out of sample: not checked: {gate.error}")
        found = gate.found
        if found is None:
            return None
        for side in (found.baseline, found.candidate):
            if side.skipped:
                self.say(
                    f"out of sample: {side.skipped} generated case(s) could not run with {side.policy}, left "
                    f"out (fix the environment's generator, Environment.cases): {side.skipped_reason}"
                )
        return OutOfSampleCheck(
            cases=found.cases,
            seed=found.seed,
            labelled_by=found.labelled_by,
            baseline_agreed=found.baseline.agreed,
            candidate_agreed=found.candidate.agreed,
            by_branch=found.candidate.by_rule,
            examples=oos_examples(found),
            reference=self._reference_label(),
        )

    def _reference_label(self) -> str:
        """The version whose careful runs label the generated cases the generator leaves unlabelled: the
        line's first policy (v0: the model decides everything), not the baseline, whose learned branches
        careful's runs would take for right answers."""
        memory = self.inputs.memory
        return memory.lineage[-1] if memory.lineage else self.label

    def _out_of_sample_gate(self) -> OutOfSampleGate | None:
        """The `out-of-sample` gate when the objective asks for `out_of_sample_cases` and the environment
        has a generator (else None: no policy read for it); one per round, so every repair is checked on
        the cases the candidates before it were, and on a new draw (`OutOfSampleGate`)."""
        inputs = self.inputs
        if not self.objective.out_of_sample_cases or inputs.env.cases is None:
            return None
        if self._oos_gate is not None:
            return self._oos_gate
        root = self._reference_label()
        # Each read of the held-out set draws other cases: with one seed every round checked the same
        # cases, and once the ones it drafted as scenarios were labelled (it skips a labelled one), what
        # was left of them passed, round after round, while other cases still failed.
        seed = self.objective.seed + max(0, inputs.memory.held_out.read - 1)

        def prepare(draw: int) -> CandidateCheck | None:
            reference = (
                inputs.policy if root == self.label else inputs.space.load_policy(inputs.env_name, root)
            )
            return candidate_check(
                inputs.env,
                reference,
                inputs.policy,
                self.objective.out_of_sample_cases,
                draw_seed(seed, draw),
                known=inputs.scenarios,
            )

        self._oos_gate = OutOfSampleGate(prepare)
        return self._oos_gate

    def record(self) -> RoundRecord:
        """The round record; when a candidate was proposed, its report, CHANGELOG entry and review."""
        record = self._record()
        if self.request is None:  # stopped before proposing: nothing to record beyond the record itself
            return record
        if self.verdict is not None:
            # The promotion rule read the candidate's held-out runs: one more read of the held-out set.
            record.held_out = self.inputs.memory.held_out
            if record.held_out.short:
                self.say(f"warning: {record.held_out.short}")
        return Recorder(self.inputs, self.say, self.opts.allow_insecure_github).leave(record)

    # --- what the steps share -------------------------------------------------------------------

    def _write(
        self,
        scenarios: Sequence[Scenario],
        spec: SuiteSpec,
        what: str,
        runs: Sequence[int] | None = None,
        start: StartFrom | None = None,
        fresh: bool = False,
        store: Store | None = None,
    ) -> list[PlannedRun]:
        """Run (or reuse) the suite's threads; those it reused (read while checked) are kept for the
        round's reads. `runs`: run numbers other than 1..k (the reruns). `start`: the baseline's runs
        these start from (replay-first). The candidate runs as the gates compiled it. `store`: where
        runs made ahead of need are held (`_ahead`); default the workspace's traces."""
        plan = write_threads(
            self.inputs.env,
            scenarios,
            spec,
            store if store is not None else self.ledger.store,
            fresh=fresh or self.opts.fresh,
            concurrency=self.opts.concurrency,
            executor=self.opts.executor,
            ran=every(25, self.say, what),
            meter=self.meter,
            models=self.models,
            runs=runs,
            compiled=self.gated.machine if self.gated is not None and spec is self.candidate_spec else None,
            start_from=start,
            slots=self._slots,
            keep=self.ledger.keep(),
        )
        for p in plan:
            if p.entries is not None:  # reused: read while it was checked
                self.reads.keep(p.thread_id, p.entries)
        source = self.space.scenarios_path(self.inputs.env_name)
        for note in kept_aside(plan) + refused_scripts(plan, source):
            self.say(note)
        return plan

    def _written_and_verified(
        self,
        scenarios: Sequence[Scenario],
        spec: SuiteSpec,
        what: str,
        first: Sequence[str] = (),
        on_first: Callable[[list[OutcomeRow]], None] | None = None,
    ) -> list[OutcomeRow]:
        """`_verified(_write(...))`; where runs wait on a model together, each run is recorded soon after
        it ends, while the others still wait (the suite runs on a thread of its own; what ended is
        recorded a chunk at a time, as the last chunk's recording allows): the same threads and rows,
        the recording no longer after the last wait. `on_first` is given the rows of the threads `first`
        once they are all recorded (or when the suite ends, what is found of them)."""
        if not self._overlaps():
            return self._verified(self._write(scenarios, spec, what), what)
        ended: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        planned: list[list[PlannedRun]] = []

        def write() -> None:
            try:
                planned.append(self._write(scenarios, spec, what, store=_Told(self.ledger.store, ended)))
            finally:
                ended.put(None)

        suite = _Background(write, reraise=True)
        rows: dict[str, OutcomeRow] = {}
        # At least a wave of runs a chunk: each recording costs the warehouse a batch.
        least = max(8, self.opts.concurrency)
        made: list[str] = []
        waiting = set(first)  # of `first`, the threads not recorded yet
        finished = False
        while not finished:
            thread_id = ended.get()  # waits for the next run to end
            while thread_id is not None:
                made.append(thread_id)
                if ended.empty():
                    break
                thread_id = ended.get()
            finished = thread_id is None
            if made and (finished or len(made) >= least):
                rows |= {r.thread_id: r for r in self._verified_ids(made, made, what)}
                waiting.difference_update(made)
                made = []
                if on_first is not None and first and not waiting:
                    on_first([rows[t] for t in first if t in rows])
                    on_first = None
        suite.done()  # raises the suite's error, if it failed
        plan = planned[0]
        reused = [p.thread_id for p in plan if p.reused]
        if reused:
            rows |= {r.thread_id: r for r in self._verified_ids(reused, [], what)}
        if on_first is not None:
            on_first([rows[t] for t in first if t in rows])
        return [rows[p.thread_id] for p in plan if p.thread_id in rows]

    def _verified_ids(
        self, thread_ids: Sequence[str], rewritten: Sequence[str], what: str
    ) -> list[OutcomeRow]:
        recorded = self.ledger.record(thread_ids, say=_prefixed(self.say, what), rewritten=rewritten)
        self.quarantined += recorded.quarantined
        return recorded.rows

    def _verified(self, plan: Sequence[PlannedRun], what: str) -> list[OutcomeRow]:
        """Record the planned runs' threads in the warehouse and read back the verified rows; threads set
        aside are counted."""
        return self._verified_ids(
            [p.thread_id for p in plan], [p.thread_id for p in plan if not p.reused], what
        )

    def _run_more(self, ids: Sequence[str], numbers: range) -> Batch:
        """The sequential rule's batch: these scenarios run again under both policies, recorded together.
        Replay-first, each candidate run starts from the baseline's run as written, before the warehouse
        verified it: one whose baseline run is then set aside runs again from scratch, as it would have
        had it waited (it hardly ever happens: that thread was written a moment before)."""
        assert self.candidate_spec is not None
        by_id = {s.id: s for s in self.inputs.scenarios}
        chosen = [by_id[i] for i in ids]
        what = f"reruns r{numbers.start}-r{numbers.stop - 1}"
        held = self._ahead(chosen, numbers, what)
        rest = [sc for sc in chosen if sc.id not in held]
        base_plan, cand_plan = [], []
        if held:
            assert self._held is not None
            taken = [(sc.id, n) for sc in chosen if sc.id in held for n in numbers]
            base_plan = [self._published(self._held[0][key]) for key in taken]
            cand_plan = [self._published(self._held[1][key]) for key in taken]
        if rest:
            base_plan += self._write(rest, self.spec, f"{what}, baseline", numbers)
        start = self._start_planned(base_plan)
        if rest:
            cand_plan += self._write(rest, self.candidate_spec, f"{what}, candidate", numbers, start=start)
        rows = {r.thread_id: r for r in self._verified([*base_plan, *cand_plan], what)}
        if start is not None:
            for p in base_plan:
                if p.thread_id not in rows:
                    # Its baseline run was set aside: the candidate's runs again from scratch, replacing it.
                    again = self._write([p.scenario], self.candidate_spec, what, [p.run], fresh=True)
                    for a in again:
                        rows.pop(a.thread_id, None)
                    rows |= {r.thread_id: r for r in self._verified(again, what)}
        return Batch(
            [rows[p.thread_id] for p in base_plan if p.thread_id in rows],
            [rows[p.thread_id] for p in cand_plan if p.thread_id in rows],
        )

    def _run_ahead_of(self, plan: Sequence[PlannedRun]) -> None:
        """Where runs wait on a model together: while the warehouse records the candidate's first runs,
        the reruns the sequential rule is about to ask for start in the background, held (`_hold`). The
        scenarios are those it runs again after the runs as written (`rerun_scenarios`; the rule reads
        them verified, and takes from what ran ahead only what it asks for)."""
        if not self._runs_ahead():
            return
        env = self.inputs.env
        try:
            written = [
                outcome_row(env, p.scenario, p.thread_id, p.entries or self.ledger.store.read(p.thread_id))
                for p in plan
            ]
        except ImproveError:
            return  # a thread that does not even fold: the warehouse will say why; nothing runs ahead
        by_id = {s.id: s for s in self.inputs.scenarios}
        chosen = [by_id[i] for i in rerun_scenarios(self.base_rows, written)]
        runs = range(self.k + 1, self.k + self.objective.max_extra_runs + 1)
        if chosen and runs and 2 * len(chosen) * len(runs) <= self.objective.max_extra_runs_total:
            self._background = _Background(lambda: self._hold(chosen, runs, "reruns ahead"))

    def _run_ahead_of_branches(self) -> None:
        """Where runs wait on a model together: before the candidate's first runs, the reruns of the
        held-out scenarios where a branch the candidate adds answers a decision of the baseline's runs
        otherwise than it was answered start in the background, held (`_hold`): only there do the
        candidate's runs part from the baseline's, so only there can their pass fraction change (as far
        as its branches tell: a batch asks for what was not run ahead, and it runs then). Train
        scenarios wait: they run again only if the candidate passes them less often, which the runs
        have yet to show, and most are the failures it was mined to fix. A candidate that adds no
        branch there (or whose reruns the round's cap could not pay for) runs nothing ahead here
        (`_run_ahead_of`)."""
        runs = range(self.k + 1, self.k + self.objective.max_extra_runs + 1)
        if not runs or not self._runs_ahead():
            return
        parting = self._parting("held-out")
        chosen = [s for s in self.inputs.scenarios if s.id in parting]
        if chosen and 2 * len(chosen) * len(runs) <= self.objective.max_extra_runs_total:
            self._background = _Background(lambda: self._hold(chosen, runs, "reruns ahead"))

    def _parting(self, split: str | None = None) -> set[str]:
        """The scenarios (of `split`, else both) where a branch the candidate adds answers a decision of
        the baseline's runs otherwise than it was answered: where the candidate's runs part from the
        baseline's (replay-first: where they ask the model)."""
        assert self.candidate is not None
        new = {b.index for b in added(self.inputs.policy, self.candidate)}
        if not new:
            return set()
        branches = route(self.candidate)
        parting: set[str] = set()
        for row in self.base_rows:
            if row.scenario in parting or (split is not None and row.split != split):
                continue
            for request, answered in self.evidence.decisions(row.thread_id):
                decision = {"name": request.name, "facts": request.facts, "options": request.options}
                fired = answer_on(branches, decision)
                if fired is None or fired[0].index not in new:
                    continue
                if answered.type == ERROR_EVENT or canonical_json(fired[1]) != canonical_json(answered.event):
                    parting.add(row.scenario)  # the candidate answers otherwise: its run parts here
                    break
        return parting

    def _ahead(self, chosen: Sequence[Scenario], numbers: range, what: str) -> set[str]:
        """The scenarios of the batch whose runs were run ahead (and are held); the others run now, as
        asked.

        When the model is waited on and runs overlap, the reruns of every batch the sequential rule may
        yet ask of a scenario (up to max_extra_runs each, both policies) run at once, ahead of need: in
        the background while the candidate's first runs are recorded (`_run_ahead_of`), else with the
        first batch. They are held in memory (`Ahead`): each batch takes its runs from there, and only
        what a batch asks for is written and recorded; the rest is dropped, never journaled. Each run
        is the run it would have been (seeded by scenario and run number, replay-first from the
        baseline's run of its number), so the threads and the decision are those of runs made batch by
        batch; the model calls of dropped runs are spent and counted. Worth it only where waiting
        dominates: off at concurrency 1, for stand-ins that answer at once, and when the round's cap on
        extra runs could not pay for it."""
        if self._background is not None:
            background, self._background = self._background, None
            if not background.done():
                self._held = None  # it failed: what it held is dropped, and the batches run as asked
        if self._held is not None:
            held = self._held[0]
            return {sc.id for sc in chosen if all((sc.id, n) in held for n in numbers)}
        runs = range(numbers.start, max(numbers.stop, self.k + self.objective.max_extra_runs + 1))
        if (
            self._ahead_store is not None
            or len(runs) <= len(numbers)
            or 2 * len(chosen) * len(runs) > self.objective.max_extra_runs_total
            or not self._runs_ahead()
        ):
            return set()
        self._hold(chosen, runs, f"{what} and after")
        return {sc.id for sc in chosen}

    def _hold(self, chosen: Sequence[Scenario], runs: range, what: str) -> None:
        """Run the reruns `runs` of `chosen` under both policies, held in memory (`_ahead`)."""
        assert self.candidate_spec is not None
        self._ahead_store = store = Ahead(self.ledger.store)
        base = self._write(chosen, self.spec, f"{what}, baseline", runs, store=store)
        start = (
            StartFrom(store, {(p.scenario.id, p.run): p.thread_id for p in base})
            if self.replay_first
            else None
        )
        cand = self._write(chosen, self.candidate_spec, f"{what}, candidate", runs, start=start, store=store)
        self._held = ({(p.scenario.id, p.run): p for p in base}, {(p.scenario.id, p.run): p for p in cand})

    def _published(self, planned: PlannedRun) -> PlannedRun:
        """A run made ahead, written to the workspace's traces now that a batch asks for it."""
        store = self._ahead_store
        if store is not None and not planned.reused and store.held(planned.thread_id):
            self.reads.keep(planned.thread_id, store.publish(planned.thread_id))
        return planned

    def _runs_ahead(self) -> bool:
        """Whether reruns run ahead of need (`_ahead`): runs wait together, and the objective allows it."""
        return self.objective.run_ahead and self._overlaps()

    def _overlaps(self) -> bool:
        """Whether the round's runs wait on a model together: what running reruns ahead pays off for."""
        if self.opts.concurrency <= 1:
            return False
        if self.session is not None:
            return self.spec.model_spec is not None and self.spec.model_spec.in_flight() > 1
        return runs_overlap(self.models)

    def _start(self, baseline: Sequence[OutcomeRow]) -> StartFrom | None:
        """Replay-first: the baseline's verified runs, each the start of the candidate's run of the same
        scenario and run number (a run set aside starts nothing: its candidate runs from scratch)."""
        if not self.replay_first:
            return None
        return StartFrom(self.reads, {(r.scenario, r.run): r.thread_id for r in baseline})

    def _start_planned(self, plan: Sequence[PlannedRun]) -> StartFrom | None:
        """Replay-first: the baseline's runs as written, before the warehouse verified them (`_run_more`)."""
        if not self.replay_first:
            return None
        return StartFrom(self.reads, {(p.scenario.id, p.run): p.thread_id for p in plan})

    def _note(self, what: str) -> None:
        """Which model the runs used so far and how its calls went; said for a model behind an endpoint:
        the round's calls up to the end of `what` (the meter counts the whole round)."""
        self.model_info = _model_info(self.opts.model, self.spec, self.session, self.meter)
        if self.session is not None:
            self.say(f"  the round so far, after the {what} runs: {self.meter.summary()}")

    def _answered(self, rows: Sequence[OutcomeRow], side: str) -> None:
        """Refuse to go on when more than max_fallback_share of a side's model decisions fell back for
        the endpoint."""
        most = self.objective.max_fallback_share
        fell = fallbacks(rows)
        if fell.past(most):
            raise EndpointError(
                f"the {side} runs: {fell.beyond(most)}. The runs measure the endpoint, not the policy, so the "
                "round compares and promotes nothing: fix the endpoint (its server, URL or key, or the way of "
                "asking: `ask` in [models.NAME]) and run the round again"
            )

    def _request(
        self, diagnosis: Diagnosis, examples: list[dict[str, Any]], policy: MachineConfig | None = None
    ) -> ProposalRequest:
        """What the proposer may read: never a held-out result. `policy`: the one to change, when not the
        baseline (a discarded candidate's, `_behind`)."""
        assert diagnosis.chosen is not None
        chosen = dataclasses.asdict(diagnosis.chosen)
        train = self.cards["train"]
        inputs = self.inputs
        return ProposalRequest(
            environment=inputs.env_name,
            goal=inputs.env.config.description,
            policy=policy or inputs.policy,
            new_version=self.version,
            vocabulary=vocabulary(inputs.env),
            objective={
                "train_pass_rate": train.pass_rate,
                "violations": train.violations,
                "model_calls_per_run": train.cost("model_calls"),
                "k": self.k,
                "goal": inputs.policy.description,
            },
            diagnosis=diagnosis.to_json(),
            examples=[
                e | {"in_cluster": in_cluster(e, chosen, self.evidence.offers)}
                for e in [*examples, *self._generated(examples)]
            ],
            discarded=[dataclasses.asdict(d) for d in self.discarded],
            narrower=self._again(self.focus.narrower, diagnosis.chosen.id),
            broader=self._again(self.focus.broader, diagnosis.chosen.id) if self.again else [],
            behind=self._behind_again(diagnosis.chosen.id),
        )

    def _generated(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The generated cases' decisions earlier rounds' out-of-sample gates showed a candidate answering
        wrongly (`loop.generated`), for this environment as it is, each twice (`without_wording`)."""
        inputs = self.inputs
        remembered = kept(
            generated_path(self.space.root, inputs.env_name), environment_key(inputs.env_hashes)
        )
        return self._worded(remembered, examples) if remembered else []

    def _worded(
        self, decisions: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Generated cases' decisions as the miner reads them: their text is the generator's, so each joins
        twice, emptied and filled with the training decisions' texts (never a generated one's), and no
        word test keeps it out (`without_wording`)."""
        training = [e for e in examples if not is_generated(e)]
        return without_wording(decisions, training, vocabulary(self.inputs.env).fact_paths)

    def _behind_again(self, cluster: str) -> list[dict[str, str]]:
        """The branches of `cluster`'s candidates tried again behind this baseline's (`_renew`): a rule
        for another cluster keeps the safety order's place."""
        renewed = self.renewed or frozenset()
        tried = self.inputs.memory.tried
        return [e for t in tried if t.round in renewed and t.cluster == cluster for e in _added(t)]

    @staticmethod
    def _again(tried: Mapping[str, DiscardedCandidate] | None, cluster: str) -> list[dict[str, str]]:
        """The branches of the candidate a narrower (or broader) rule for `cluster` is measured against:
        none unless the focus says so."""
        last = (tried or {}).get(cluster)
        return [] if last is None else _added(last)

    def _proposer(self) -> Proposer:
        opts, inputs = self.opts, self.inputs
        if not isinstance(opts.proposer, str):
            return opts.proposer
        setup = ProposerSetup(
            environment=inputs.env,
            scenarios=inputs.scenarios,
            root=self.space.root,
            model=opts.proposer_model,
            base_url=opts.proposer_base_url,
            cache=opts.cache,
            model_spec=self.space.config.models.get(opts.proposer_model) if opts.proposer_model else None,
        )
        return make_proposer(opts.proposer, setup, self.space)

    def _gate_context(self, request: ProposalRequest) -> GateContext:
        inputs = self.inputs
        return GateContext(
            inputs.env,
            expected_hashes=inputs.env_hashes,
            probes=self.evidence.probes(inputs.train),
            scenarios=inputs.scenarios,
            gates=self._gates(),
            baseline=inputs.policy,
            decisions=request.examples,
            discarded=self.discarded,
            tried=inputs.memory.tried,
            held_out_decisions=self._held_out_decisions() if inputs.memory.tried else [],
            held_out_key=inputs.memory.held_out.key,
        )

    def _gates(self) -> list[Gate]:
        """The workspace's gates; `novelty` after `validate` when candidates were discarded against the
        baseline, and `out-of-sample` last when the objective checks generated cases."""
        memory = self.inputs.memory
        gates = gates_for(self.space)
        gates = _with_novelty(gates) if memory.discarded or memory.tried else gates
        oos = self._out_of_sample_gate()
        return [*gates, oos] if oos is not None else gates

    def _held_out_decisions(self) -> list[dict[str, Any]]:
        """The baseline's held-out decisions, their name, facts and options only (each once): where the
        novelty gate compares what a candidate answers with what a discarded one did. No label, no
        outcome: only the memory's record of which of them a discarded candidate answered wrongly, in
        the round that spent that read, refuses a candidate again."""
        return self._decisions("held-out")

    def _decisions(self, split: str) -> list[dict[str, Any]]:
        """The baseline's decisions on `split`: name, facts and options, each once (read once a round:
        the renewal check and the novelty gate both ask)."""
        if split in self._split_decisions:
            return self._split_decisions[split]
        found: dict[str, dict[str, Any]] = {}
        for row in self.base_rows:
            if row.split != split:
                continue
            for request in self.evidence.requests(row.thread_id):
                decision = {"name": request.name, "facts": request.facts, "options": request.options}
                found.setdefault(canonical_json(decision), decision)
        self._split_decisions[split] = list(found.values())
        return self._split_decisions[split]

    def _proposer_model(self) -> str | None:
        """The model the proposer asked, when it asks one (an LLM proposer's `model`)."""
        model = getattr(self.proposer, "model", None)
        return model if isinstance(model, str) else None

    def _record(self) -> RoundRecord:
        """The record of what the steps found."""
        proposed = self.proposal.document if self.proposal is not None else None
        config = self.candidate or (self.gated.config if self.gated is not None else None)
        return RoundRecord(
            round_id=self.round_id,
            environment=self.inputs.env_name,
            baseline_version=self.label,
            candidate_version=f"v{self.version}" if self.request is not None else None,
            proposer=self.opts.proposer if isinstance(self.opts.proposer, str) else self.opts.proposer.name,
            proposer_model=self._proposer_model(),
            proposer_notes=list(self.proposal.notes) if self.proposal is not None else [],
            model=self.opts.model,
            k=self.k,
            seed=self.objective.seed,
            status=self.status,
            recommended=self.status == "recommended",
            goal_met=self.goal_met,
            decision_detail=self.detail or self._gate_detail(),
            cluster=self._cluster(),
            aim=self.aim,
            passed_over=list(self.passed_over),
            hypothesis=self.diagnosis.hypothesis if self.request is not None and self.diagnosis else None,
            rationale=self._rationale(),
            branches=_new_branches(self.inputs.policy, config),
            diff_summary=self._diff_summary(),
            gates=self.gates,
            repairs=self.repairs,
            model_calls=self.calls,
            scores=self._scores(),
            regressions=[c.scenario for c in self._regressions()],
            wrong_held_out=list(self.wrong_held_out),
            still_failing=self.still_failing,
            train_set=self.train_key,
            behind=Behind(round=self.behind.round, candidate=self.behind.candidate) if self.behind else None,
            followed=self.followed,
            reruns=self.settled.reruns if self.settled is not None else None,
            candidate_threads=sorted(r.thread_id for r in self.settled.candidate) if self.settled else [],
            quarantined=self.quarantined,
            model_info=self.model_info,
            impact=self.impact,
            cases=self.inputs.env.cases is not None,
            out_of_sample=self.out_of_sample,
            scorecards=list(self.cards.values()),
            decision=self.verdict,
            baseline_policy=self.inputs.policy,
            candidate_policy=config,
            proposed=proposed,
        )

    def _cluster(self) -> str | None:
        """The cluster the round's candidate is for; when it asked a narrower or broader rule for one and
        got none, then found nothing else, that one: the workspace remembers it was tried against this
        baseline with nothing found (`discards.focus`: spent), or every later round asks again."""
        if self.diagnosis is not None and self.diagnosis.chosen is not None:
            return self.diagnosis.chosen.id
        return self.passed_over[-1] if self.passed_over and self.request is not None else None

    def _rationale(self) -> str | None:
        """The proposer's rationale; behind a discarded candidate, also the branches it carries."""
        if self.proposal is None:
            return None
        if self.behind is None:
            return self.proposal.rationale
        shown = _shown(self.behind)
        return (
            f"{self.proposal.rationale} It carries the branch(es) of candidate {self.behind.candidate} "
            f"(round {self.behind.round}), which gained too little alone: {shown}."
        )

    def _nothing_new(self) -> None:
        """A cluster that came round again (every cluster was tried along this line) with no candidate
        that passes the gates: the round found nothing left to try, as `--rounds` says when the clusters
        left are tried in one run. No candidate ran or read the held-out set, so no CHANGELOG entry is
        spent on it (the workspace still remembers what was tried, under the version it took, and the
        next round brings another cluster round). Ending as discarded made each new `improve round` on a
        policy with nothing left add an entry, and exit 1 where `--rounds` exits 0."""
        if (
            self.again is None
            or self.verdict is not None
            or self.request is None
            or self.status != "discarded"
        ):
            return
        why = self._gate_detail()
        self.status = "nothing-left-to-try"
        self.detail = (
            f"nothing left to try: every cluster was tried along this policy's line, and {self.again}, tried "
            f"longest ago, came round again with nothing new ({why}); label more training scenarios like "
            "its failures, or try another proposer"
        )

    def _gate_detail(self) -> str:
        if self.request is None or self.verdict is not None:
            return ""
        last = self.gates[-1] if self.gates else None
        if last is None:
            return "the proposer produced no candidate"
        if last.name == "propose":
            # The proposer found nothing to propose (`propose` records why as its failure): no candidate
            # met a gate.
            return f"the proposer proposed no candidate: {last.detail}"
        refused = next((g for g in reversed(self.gates[:-1]) if not g.ok), None)
        if last.name == "repair" and refused is not None:
            # The repair found no further candidate: the last candidate's refusal is the reason to read,
            # said here, where the round's decision (and the CHANGELOG) is read.
            return (
                f"the candidate did not pass the gates after {self.repairs} repair(s): {refused.name}: "
                f"{refused.detail}; then repair: {last.detail}"
            )
        return (
            f"the candidate did not pass the gates after {self.repairs} repair(s): {last.name}: {last.detail}"
        )

    def _diff_summary(self) -> str | None:
        if self.settled is None or self.candidate is None:
            return None
        return f"states changed: {', '.join(diff_states(self.inputs.policy, self.candidate)) or 'none'}"

    def _scores(self) -> dict[str, SplitScore]:
        verdict, settled = self.verdict, self.settled
        if verdict is None or settled is None:
            return {}
        cost = self.objective.cost
        return {
            split: SplitScore(
                before=cmp.baseline_rate,
                after=cmp.candidate_rate,
                mean_diff=cmp.mean_diff,
                ci_low=cmp.ci_low,
                ci_high=cmp.ci_high,
                confidence=cmp.confidence,
                test=cmp.test,
                p=cmp.p,
                alpha=cmp.alpha,
                fixed=cmp.fixed,
                sequential=cmp.sequential,
                extra_runs=settled.reruns.extra_runs_in(split),
                violations_after=self.cards[f"candidate {split}"].violations,
                cost_before=self.cards[split].cost(cost),
                cost_after=self.cards[f"candidate {split}"].cost(cost),
                k=self.k,
            )
            for split, cmp in (("train", verdict.train), ("held-out", verdict.held_out))
        }

    def _regressions(self) -> list[Any]:
        return [*self.verdict.train.regressions, *self.verdict.held_out.regressions] if self.verdict else []


class _Held:
    """The round's `say`: while held, what the round's own thread says waits (`release` hands it back);
    what other threads say (a suite's progress) is said at once."""

    def __init__(self, say: Say) -> None:
        self._say = say
        self._owner = threading.get_ident()
        self._held: list[str] | None = None

    def __call__(self, message: str) -> None:
        if self._held is not None and threading.get_ident() == self._owner:
            self._held.append(message)
        else:
            self._say(message)

    def hold(self) -> None:
        self._held = []

    def release(self) -> list[str]:
        held, self._held = self._held or [], None
        return held


class _Background:
    """`work` on a thread of its own; `done()` waits for it and says whether it finished without error
    (`reraise`: raises that error in the caller's thread instead)."""

    def __init__(self, work: Callable[[], None], reraise: bool = False) -> None:
        self._error: BaseException | None = None
        self._reraise = reraise
        self._thread = threading.Thread(target=self._run, args=(work,), name="improve-round", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # handed to the caller's thread by done()
            self._error = error

    def join(self) -> None:
        """Wait for it, whatever its end (`done` says how it ended)."""
        self._thread.join()

    def done(self) -> bool:
        self._thread.join()
        if self._error is not None and self._reraise:
            raise self._error
        return self._error is None


class _Told:
    """`base`, telling `ended` the id of each thread written whole (a suite's run, as it ends)."""

    def __init__(self, base: Store, ended: queue.SimpleQueue[str | None]) -> None:
        self.base, self.ended = base, ended

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        length = self.base.append(thread_id, expected_index, entries)
        if expected_index == 0:
            self.ended.put(thread_id)
        return length

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        return self.base.read(thread_id, from_index)

    def length(self, thread_id: str) -> int:
        return self.base.length(thread_id)

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        return self.base.fork(source_id, new_id, upto)

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        return self.base.list_threads(prefix, limit, cursor)

    def exists(self, thread_id: str) -> bool:
        return self.base.exists(thread_id)

    def delete(self, thread_id: str) -> None:
        self.base.delete(thread_id)


def _cards(rows: Sequence[OutcomeRow], label: str) -> dict[str, Scorecard]:
    return {split: scorecard(rows, label, split) for split in SPLITS}


def _prefixed(say: Say, what: str) -> Say:
    return lambda message: say(f"  {what}: {message}")


def _with_novelty(gates: list[Gate]) -> list[Gate]:
    """The gates with `novelty` right after `validate` (it reads the validated candidate)."""
    at = next((i + 1 for i, g in enumerate(gates) if g.name == ValidateGate.name), 0)
    return [*gates[:at], NoveltyGate(), *gates[at:]]


def _new_branches(baseline: MachineConfig, candidate: MachineConfig | None) -> list[NewBranch]:
    """The branches the candidate adds to the baseline (none when it did not validate)."""
    if candidate is None:
        return []
    return [NewBranch(guard=b.guard or "", answer=b.answer()) for b in added(baseline, candidate)]


def _model_info(name: str, spec: SuiteSpec, session: Any, meter: Meter) -> ModelInfo:
    """Which model a round ran on and how its calls were answered, for reports: provider, model,
    temperature, seed, the endpoint's fingerprints, and whether recorded and live calls were mixed."""
    calls = Calls.model_validate(meter.to_json())
    if spec.model_spec is None:
        return ModelInfo(name=name, provider="stand-in", calls=calls)
    return ModelInfo.model_validate(
        {
            "name": name,
            **spec.model_spec.public(),
            "fingerprints": sorted(session.fingerprints) if session is not None else [],
            "calls": calls,
            "mixed": meter.mixed,
        }
    )


def _added(candidate: DiscardedCandidate) -> list[dict[str, str]]:
    """A discarded candidate's added branches as a proposal request names them (`ProposalRequest.narrower`)."""
    return [
        {"guard": b.guard, "answer": b.answer, "candidate": candidate.candidate, "round": candidate.round}
        for b in candidate.added
    ]


def _shown(candidate: DiscardedCandidate) -> str:
    """A discarded candidate's added branches as the round's messages show them."""
    return "; ".join(f"`{b.guard}` -> {b.answer}" for b in candidate.added)


def nothing_left(diagnosis: Diagnosis) -> str:
    """Why no cluster is left: none at all, or every one was tried (and what a user can do then)."""
    left = [c.id for c in diagnosis.clusters]
    if not left:
        return (
            f"no training failure or cost cluster left to address (train pass rate "
            f"{diagnosis.train_pass_rate:.3f} over {diagnosis.train_runs} runs); where held-out runs still fail, "
            "no training scenario shows why: label training scenarios like them"
        )
    # A wrong-answer cluster whose right answer a tried one shares was tried with it (`diagnose._choose`):
    # one rule for that answer serves both. Said, or the list names clusters no entry mentions.
    tried = {c.id for c in diagnosis.clusters if c.id in diagnosis.skipped}
    by_answer = {
        (c.answer["decision"], c.answer["right"]): c.id
        for c in diagnosis.clusters
        if c.id in tried and c.answer
    }
    shown = [
        f"{c.id} (with {by_answer[key]}: the same right answer)"
        if c.id not in tried and c.answer and (key := (c.answer["decision"], c.answer["right"])) in by_answer
        else c.id
        for c in diagnosis.clusters
    ]
    return (
        f"every failure cluster left was tried along this policy's line or in this run, and none has a "
        f"candidate to try now: {', '.join(shown)} (a cluster no rule was found for is said above, `no rule "
        "for cluster ...`; a candidate an earlier round discarded, in the CHANGELOG); label more training "
        "scenarios like their failures, or try another proposer"
    )
