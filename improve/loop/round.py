"""One improvement round: from the traces of the current policy to a reviewed pull request.

    locate inputs -> baseline (k runs per scenario, reused from traces when recorded)
      -> diagnose (train failures only) -> propose one change -> gates (at most 3 repairs)
      -> candidate on train, then held-out, k runs each -> the promotion rule (stated before replay)
      -> CHANGELOG entry (recommended or discarded) -> report -> pull request (never merged)

The working tree stays on the current policy: a recommended candidate lives on its own branch (with
its CHANGELOG entry); discarded candidates are recorded in the working tree's CHANGELOG and travel with
the next recommended branch, so nothing is lost and the branch merges cleanly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from improve import clock
from improve.errors import EndpointError, ImproveError
from improve.evals import (
    Batch,
    Check,
    Ledger,
    OutcomeRow,
    RerunRule,
    Scenario,
    Scorecard,
    Settled,
    SuiteSpec,
    Workspace,
    decide,
    fallbacks,
    paired,
    policy_label,
    scorecard,
    settle,
    write_threads,
)
from improve.files import check_directory
from improve.llm import Meter, ModelSpec
from improve.loop.branches import added
from improve.loop.changelog import discarded_branches
from improve.loop.diagnose import Diagnosis, in_cluster
from improve.loop.evidence import Override, diagnose_train, held_out_overrides
from improve.loop.gates import (
    EnvironmentGate,
    GateContext,
    GateResult,
    Unparsed,
    gates_for,
    passed,
    run_gates,
)
from improve.loop.inputs import (
    Inputs,
    RoundOptions,
    RoundResult,
    asdict_shallow,
    goal_threshold,
    locate,
    next_version,
)
from improve.loop.probes import probe_requests
from improve.loop.proposers import (
    Proposal,
    ProposalError,
    ProposalRequest,
    Proposer,
    ProposerSetup,
    make_proposer,
)
from improve.loop.record import record
from improve.machine import MachineConfig, diff_states, parse_machine
from improve.runtime import ChatSession, Environment, ModelFactory, vocabulary

MAX_REPAIRS = 3
Say = Callable[[str], None]


def _proposer(opts: RoundOptions, inputs: Inputs) -> Proposer:
    if not isinstance(opts.proposer, str):
        return opts.proposer
    setup = ProposerSetup(
        environment=inputs.env,
        scenarios=inputs.scenarios,
        root=inputs.space.root,
        model=opts.proposer_model,
        base_url=opts.proposer_base_url,
        cache=opts.cache,
        model_spec=inputs.space.config.models.get(opts.proposer_model) if opts.proposer_model else None,
    )
    return make_proposer(opts.proposer, setup, inputs.space)


def _cards(rows: Sequence[OutcomeRow], label: str) -> dict[str, Scorecard]:
    return {split: scorecard(rows, label, split) for split in ("train", "held-out")}


def run_round(space: Workspace, opts: RoundOptions, say: Say = lambda m: None) -> RoundResult:
    """One round (see the module's docstring). Every thread it runs or reuses is recorded in the
    workspace's warehouse and read back from there; threads that do not verify are set aside."""
    inputs = locate(space, opts.env, opts.policy)
    # Before anything runs or a branch is made: the round's report folder can be written.
    check_directory(space.reports, "the reports directory")
    # One writer of the workspace's threads at a time: a second round (or run, or resume) waits.
    with space.writing(say), Ledger(space, inputs.env) as ledger:
        return _run_round(space, opts, say, inputs, ledger)


def _run_round(space: Workspace, opts: RoundOptions, say: Say, inputs: Inputs, ledger: Ledger) -> RoundResult:
    objective = space.config.objective
    k = opts.k or objective.k
    env = inputs.env
    store = ledger.store
    baseline_label = policy_label(inputs.policy)
    version = next_version(inputs.policies_dir, inputs.changelog)
    stamp = clock.now().strftime("%Y%m%d-%H%M%S")
    result = RoundResult(
        round_id=f"{stamp}-{inputs.env_name}-v{version}",
        environment=inputs.env_name,
        baseline_version=baseline_label,
        candidate_version=None,
        proposer=opts.proposer if isinstance(opts.proposer, str) else opts.proposer.name,
        model=opts.model,
        k=k,
        seed=objective.seed,
    )
    train = [s for s in inputs.scenarios if s.split == "train"]
    held_out = [s for s in inputs.scenarios if s.split == "held-out"]

    base_spec = SuiteSpec(
        inputs.policy,
        opts.model,
        k,
        objective.max_model_calls,
        space.model_spec(opts.model, env),
        str(space.cache_dir),
        opts.cache,
    )
    # One model for the whole round: the suites and the counterfactual runs share its session (its way
    # of asking, its concurrency cap, its cache) and one meter, whose limit every suite checks.
    meter = opts.meter if opts.meter is not None else Meter(limit_usd=opts.max_usd, say=say)
    session = base_spec.chat_session(meter)
    models = session.model if session is not None else base_spec.model_factory(env)

    def note(what: str) -> None:
        result.model_info = model_info(opts.model, base_spec.model_spec, session, meter)
        if session is not None:
            say(f"  {what}: {meter.summary()}")

    say(f"baseline: {baseline_label} on {len(train)} train + {len(held_out)} held-out scenarios, k={k}")
    base_rows = _suite(env, inputs.scenarios, base_spec, ledger, opts, say, "baseline", models, meter, result)
    note("baseline")
    _endpoint_answered(base_rows, f"baseline {baseline_label}", objective.max_fallback_share)
    base_cards = _cards(base_rows, baseline_label)
    threshold = goal_threshold(inputs.policy.description)
    if (
        threshold is not None
        and base_cards["held-out"].pass_rate >= threshold
        and base_cards["held-out"].violations == 0
    ):
        result.status, result.goal_met = "nothing-to-fix", True
        result.decision_detail = f"the goal already holds: held-out pass rate {base_cards['held-out'].pass_rate:.3f} >= {threshold}"
        return result

    say("diagnose: train failures only")
    diagnosis, examples = diagnose_train(
        env, inputs.scenarios, base_rows, store, inputs.policy, models, skip=opts.skip
    )
    if diagnosis.blocked:
        result.status, result.decision_detail = "blocked", diagnosis.blocked
        return result
    if diagnosis.chosen is None or diagnosis.hypothesis is None:
        result.status = "nothing-to-fix"
        result.decision_detail = "no training failure or cost cluster left to address"
        return result
    result.candidate_version = f"v{version}"
    result.cluster = diagnosis.chosen.id
    result.hypothesis = asdict(diagnosis.hypothesis)
    say(f"cluster: {diagnosis.chosen.title} -> {diagnosis.hypothesis.change}")

    request = _request(inputs, diagnosis, examples, base_cards["train"], version, k, baseline_label)
    proposer = _proposer(opts, inputs)
    context = GateContext(
        env,
        expected_hashes=inputs.env_hashes,
        probes=probe_requests(env, train, store),
        scenarios=inputs.scenarios,
        gates=gates_for(space),
        baseline=inputs.policy,
        decisions=request.examples,
    )
    proposal, gates, repairs, calls = _propose_and_gate(proposer, request, context, say)
    result.branches = _branches_added(inputs.policy, proposal)
    result.gates = [g.to_json() for g in gates]
    result.repairs = repairs
    result.model_calls = calls
    if proposal is not None:
        result.rationale = proposal.rationale
    if proposal is None or not passed(gates):
        last = gates[-1] if gates else None
        result.decision_detail = (
            f"the candidate did not pass the gates after {repairs} repair(s): {last.name}: {last.detail}"
            if last is not None
            else "the proposer produced no candidate"
        )
        note("evidence")
        record(inputs, result, None, None, base_cards, None, proposal, say)
        return result

    candidate = parse_machine(proposal.document, source=f"candidate v{version}")
    result.diff_summary = f"states changed: {', '.join(diff_states(inputs.policy, candidate)) or 'none'}"
    label = policy_label(candidate)
    cand_spec = dataclasses.replace(base_spec, policy=candidate)
    say(f"candidate {label}: train, k={k}")
    cand_rows = _suite(env, train, cand_spec, ledger, opts, say, "train", models, meter, result)
    say(f"candidate {label}: held-out, k={k}")
    cand_rows += _suite(env, held_out, cand_spec, ledger, opts, say, "held-out", models, meter, result)
    settled = _rerun_changed(
        env,
        inputs.scenarios,
        base_rows,
        cand_rows,
        (base_spec, cand_spec),
        k,
        ledger,
        opts,
        say,
        models,
        meter,
        result,
    )
    base_rows, cand_rows = settled.baseline, settled.candidate
    base_cards = _cards(base_rows, baseline_label)
    note("candidate")
    for side, rows in ((f"baseline {baseline_label}", base_rows), (f"candidate {label}", cand_rows)):
        _endpoint_answered(rows, side, objective.max_fallback_share)
    result.candidate_threads = sorted(r.thread_id for r in cand_rows)
    cand_cards = _cards(cand_rows, label)
    for split in ("train", "held-out"):
        # A scenario whose threads were all set aside on one side cannot be paired: it is left out of
        # both, and said so, rather than scored on one side only.
        base_cards[split], cand_cards[split], unpaired = paired(base_cards[split], cand_cards[split])
        if unpaired:
            say(f"  {split}: left out of the comparison (no verified run on one side): {', '.join(unpaired)}")
    overrides = held_out_overrides(env, inputs.scenarios, base_rows, store, inputs.policy, candidate, models)
    verdict = decide(
        base_cards["train"],
        base_cards["held-out"],
        cand_cards["train"],
        cand_cards["held-out"],
        objective,
        settled.reruns,
        extra=[_branches_hold(overrides)] if overrides else [],
    )
    result.recommended = verdict.promote
    result.status = "recommended" if verdict.promote else "discarded"
    result.regressions = [c.scenario for c in [*verdict.train.regressions, *verdict.held_out.regressions]]
    result.decision_detail = "; ".join(
        f"{c.name}: {'pass' if c.ok else 'FAIL'} ({c.detail})" for c in verdict.checks
    )
    result.scores = {
        split: {
            "before": cmp.baseline_rate,
            "after": cmp.candidate_rate,
            "mean_diff": cmp.mean_diff,
            "ci_low": cmp.ci_low,
            "ci_high": cmp.ci_high,
            "confidence": cmp.confidence,
            "test": cmp.test,
            "p": cmp.p,
            "alpha": cmp.alpha,
            "extra_runs": settled.reruns.extra_runs_in(split),
            "violations_after": cand_cards[split].violations,
            "cost_before": base_cards[split].cost(objective.cost),
            "cost_after": cand_cards[split].cost(objective.cost),
            "k": k,
        }
        for split, cmp in (("train", verdict.train), ("held-out", verdict.held_out))
    }
    result.reruns = settled.reruns.to_json()
    record(
        inputs,
        result,
        candidate,
        cand_cards,
        base_cards,
        verdict,
        proposal,
        say,
        allow_insecure_github=opts.allow_insecure_github,
    )
    return result


def _endpoint_answered(rows: Sequence[OutcomeRow], side: str, most: float) -> None:
    """Refuse to go on when more than `most` of a side's model decisions fell back for the endpoint."""
    fell = fallbacks(rows)
    if fell.decisions and fell.share > most:
        raise EndpointError(
            f"the {side} runs: {fell.sentence()} ({fell.share:.0%} of its model decisions; the objective "
            f"allows max_fallback_share = {most:g}). The runs measure the endpoint, not the policy, so the "
            "round compares and promotes nothing: fix the endpoint (its server, URL or key, or the way of "
            "asking: `ask` in [models.NAME]) and run the round again"
        )


def model_info(
    name: str, spec: ModelSpec | None, session: ChatSession | None, meter: Meter
) -> dict[str, Any]:
    """Which model a round ran on and how its calls were answered, for reports: provider, model,
    temperature, seed, the endpoint's fingerprints, and whether recorded and live calls were mixed."""
    if spec is None:
        return {"name": name, "provider": "stand-in", "calls": meter.to_json()}
    return {
        "name": name,
        **spec.public(),
        "fingerprints": sorted(session.fingerprints) if session is not None else [],
        "calls": meter.to_json(),
        "mixed": meter.mixed,
    }


def _suite(
    env: Environment,
    scenarios: Sequence[Scenario],
    spec: SuiteSpec,
    ledger: Ledger,
    opts: RoundOptions,
    say: Say,
    what: str,
    models: ModelFactory,
    meter: Meter,
    result: RoundResult,
    runs: Sequence[int] | None = None,
) -> list[OutcomeRow]:
    """Run (or reuse) the suite's threads, record them in the warehouse, and read back the verified
    rows; threads set aside are counted on the result. `runs`: run numbers other than 1..k."""

    def ran(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            say(f"  {what}: {done}/{total} runs")

    plan = write_threads(
        env,
        scenarios,
        spec,
        ledger.store,
        concurrency=opts.concurrency,
        executor=opts.executor,
        ran=ran,
        meter=meter,
        models=models,
        runs=runs,
    )
    recorded = ledger.record(
        [p.thread_id for p in plan],
        say=lambda m: say(f"  {what}: {m}"),
        rewritten=[p.thread_id for p in plan if not p.reused],
    )
    result.quarantined += [asdict(q) for q in recorded.quarantined]
    return recorded.rows


def _rerun_changed(
    env: Environment,
    scenarios: Sequence[Scenario],
    base_rows: list[OutcomeRow],
    cand_rows: list[OutcomeRow],
    specs: tuple[SuiteSpec, SuiteSpec],
    k: int,
    ledger: Ledger,
    opts: RoundOptions,
    say: Say,
    models: ModelFactory,
    meter: Meter,
    result: RoundResult,
) -> Settled:
    """The sequential rule (`improve.evals.reruns`, stated before the replay): the scenarios whose
    result changed run again under both policies, recorded in the warehouse like every other run."""
    by_id = {s.id: s for s in scenarios}

    def run_more(ids: Sequence[str], numbers: range) -> Batch:
        chosen = [by_id[i] for i in ids]
        what = f"reruns r{numbers.start}-r{numbers.stop - 1}"
        return Batch(
            _suite(
                env, chosen, specs[0], ledger, opts, say, f"{what}, baseline", models, meter, result, numbers
            ),
            _suite(
                env, chosen, specs[1], ledger, opts, say, f"{what}, candidate", models, meter, result, numbers
            ),
        )

    settled = settle(
        base_rows, cand_rows, RerunRule.from_objective(ledger.space.config.objective, k), run_more
    )
    if settled.reruns.scenarios:
        say(f"reruns: {settled.reruns.summary()}")
    return settled


def _request(
    inputs: Inputs,
    diagnosis: Diagnosis,
    examples: list[dict[str, Any]],
    train_card: Scorecard,
    version: str,
    k: int,
    baseline_label: str,
) -> ProposalRequest:
    assert diagnosis.chosen is not None
    chosen = asdict(diagnosis.chosen)
    return ProposalRequest(
        environment=inputs.env_name,
        goal=inputs.env.config.description,
        policy=inputs.policy,
        new_version=version,
        vocabulary=vocabulary(inputs.env),
        objective={
            "train_pass_rate": train_card.pass_rate,
            "violations": train_card.violations,
            "model_calls_per_run": train_card.cost("model_calls"),
            "k": k,
            "goal": inputs.policy.description,
        },
        diagnosis=diagnosis.to_json(),
        examples=[e | {"in_cluster": in_cluster(e, chosen)} for e in examples],
        discarded=discarded_branches(inputs.changelog, baseline_label),
    )


def _branches_hold(overrides: Sequence[Override]) -> Check:
    """The promotion check that the new branches answer right wherever they answer on held-out."""
    wrong = [o for o in overrides if not o.right]
    scenarios = len({o.scenario for o in overrides})
    if not wrong:
        return Check(
            "branches hold",
            True,
            f"the new branch answers {len(overrides)} held-out decision(s) of {scenarios} scenario(s), each as "
            "the labels say",
        )
    shown = "; ".join(
        f"{o.scenario}: {_answer_text(o.answer)} where the labels say "
        f"{' or '.join(_answer_text(c) for c in o.correct)}"
        for o in wrong[:5]
    )
    return Check(
        "branches hold",
        False,
        f"the new branch answers {len(wrong)} of the {len(overrides)} held-out decision(s) it takes wrongly "
        f"({shown}): its condition holds where its answer is not right, whatever the model answered there",
    )


def _answer_text(option: Mapping[str, Any]) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in option.items() if k != "type")
    return f"{option.get('type')}{{{fields}}}" if fields else str(option.get("type"))


def _branches_added(baseline: MachineConfig, proposal: Proposal | None) -> list[dict[str, str]]:
    """The branches the proposal adds to the baseline (none when it is not a readable policy)."""
    if proposal is None or not isinstance(proposal.document, dict):
        return []
    try:
        candidate = parse_machine(proposal.document, source="candidate")
    except ImproveError:
        return []
    return [{"guard": b.guard or "", "answer": b.answer()} for b in added(baseline, candidate)]


def _novelty(request: ProposalRequest, proposal: Proposal) -> GateResult | None:
    """A failing result when every branch the proposal adds was already discarded against this policy."""
    if not request.discarded:
        return None
    new = _branches_added(request.policy, proposal)
    seen = {(d["guard"], d["answer"]): d["round"] for d in request.discarded}
    if not new or any((b["guard"], b["answer"]) not in seen for b in new):
        return None
    rounds = sorted({seen[(b["guard"], b["answer"])] for b in new})
    return GateResult(
        "novelty",
        False,
        f"this change was already discarded against {request.policy.id}@{request.policy.version} (round(s) "
        f"{', '.join(rounds)}, see the CHANGELOG): "
        + "; ".join(f"`{b['guard']}` -> {b['answer']}" for b in new)
        + ". Propose another condition or another answer",
    )


def _propose_and_gate(
    proposer: Proposer, request: ProposalRequest, context: GateContext, say: Say
) -> tuple[Proposal | None, list[GateResult], int, int]:
    """Propose, gate, and repair with the failing gate's detail at most MAX_REPAIRS times."""
    try:
        proposal = proposer.propose(request)
    except ProposalError as err:
        return None, [GateResult("propose", False, str(err))], 0, 0
    calls = proposal.calls
    repairs = 0
    said: set[str] = set()
    while True:
        for note in proposal.notes:
            if note not in said:
                said.add(note)
                say(f"proposer: {note}")
        document = (
            proposal.document if proposal.document is not None else Unparsed("the proposer returned nothing")
        )
        repeated = _novelty(request, proposal)
        gates = (
            [repeated]
            if repeated
            else run_gates(document, context, source=f"candidate v{request.new_version}")
        )
        if passed(gates):
            say(f"gates: all {len(gates)} pass" + (f" after {repairs} repair(s)" if repairs else ""))
            return proposal, gates, repairs, calls
        failed = gates[-1]
        say(f"gates: {failed.name} failed: {failed.detail.splitlines()[0]}")
        if (
            failed.name == EnvironmentGate.name or repairs >= MAX_REPAIRS
        ):  # a changed environment is not repaired
            return proposal, gates, repairs, calls
        repairs += 1
        try:
            proposal = proposer.repair(request, proposal, failed)
        except ProposalError as err:
            return proposal, [*gates, GateResult("repair", False, str(err))], repairs, calls
        calls += proposal.calls


def run_rounds(
    space: Workspace, opts: RoundOptions, rounds: int, say: Say = lambda m: None
) -> list[RoundResult]:
    """Up to `rounds` candidates against the current policy, each aimed at the next cause, until one is
    recommended; stop early after 3 discarded in a row or when the goal already holds."""
    results: list[RoundResult] = []
    skip = list(opts.skip)
    for number in range(1, rounds + 1):
        say(f"round {number}/{rounds} against {opts.policy}")
        result = run_round(space, RoundOptions(**{**asdict_shallow(opts), "skip": skip}), say)
        results.append(result)
        if result.status in ("recommended", "blocked", "nothing-to-fix"):
            break
        if result.cluster:
            skip.append(result.cluster)
        if number >= 3:  # every earlier round was discarded too, or the loop would have stopped
            say("3 candidates discarded in a row: stopping")
            break
    return results
