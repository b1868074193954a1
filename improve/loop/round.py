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

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from improve.errors import ImproveError, WorkspaceError
from improve.evals.outcome import OutcomeRow
from improve.evals.promotion import PromotionDecision, decide
from improve.evals.report import scorecard_markdown
from improve.evals.scenarios import Scenario
from improve.evals.scorecard import Scorecard, scorecard
from improve.evals.suite import SuiteSpec, run_suite
from improve.evals.workspace import CONFIG_NAME, Workspace, policy_label
from improve.log.store import JsonlDirStore
from improve.loop.changelog import append_entry, entry_markdown
from improve.loop.diagnose import Diagnosis, diagnose
from improve.loop.evidence import decision_examples
from improve.loop.gates import (
    EnvironmentGate,
    GateContext,
    GateResult,
    Unparsed,
    gates_for,
    passed,
    run_gates,
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
from improve.machine import MachineConfig, parse_machine
from improve.machine.describe import diff_states
from improve.runtime.environment import Environment
from improve.runtime.vocabulary import vocabulary

MAX_REPAIRS = 3
Say = Callable[[str], None]


@dataclass
class RoundOptions:
    env: str | None = None
    policy: str = "v0"
    k: int | None = None
    model: str = "naive"
    proposer: str | Proposer = "rules"
    """A registered proposer's name (`rules`, `openai`, a workspace's or a package's), or a Proposer
    object (a test seam)."""
    concurrency: int = 8
    executor: Executor | None = None
    proposer_model: str | None = None
    """The proposer's own model, for one that asks a model (`openai`)."""
    proposer_base_url: str | None = None
    proposer_cache: Literal["live", "record", "replay"] = "record"
    open_pr: bool = True
    skip: list[str] = field(default_factory=list)
    """Cluster ids already tried against this policy (each round aims at the next cause)."""


@dataclass
class RoundResult:
    round_id: str
    environment: str
    baseline_version: str
    candidate_version: str | None
    proposer: str
    model: str
    k: int
    seed: int
    recommended: bool = False
    status: str = "discarded"
    """recommended, discarded, blocked (the environment needs a person) or nothing-to-fix."""
    cluster: str | None = None
    hypothesis: dict[str, Any] | None = None
    rationale: str | None = None
    diff_summary: str | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)
    repairs: int = 0
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    regressions: list[str] = field(default_factory=list)
    decision_detail: str = ""
    model_calls: int = 0
    report: str | None = None
    pr: dict[str, Any] | None = None
    candidate_threads: list[str] = field(default_factory=list)
    goal_met: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Inputs:
    """What a round needs, located and checked before anything runs."""

    space: Workspace
    env: Environment
    env_name: str
    policy: MachineConfig
    policy_path: Path
    scenarios: list[Scenario]
    policies_dir: Path
    changelog: Path
    env_hashes: dict[str, str]


def review_branch(env_name: str, version: str) -> str:
    """The branch a recommended candidate is committed to: `improve/<environment>-<version>`."""
    return f"improve/{env_name}-{version}"


def locate(space: Workspace, env: str | None, policy: str) -> Inputs:
    """Every input of a round, or a clear message naming what is missing."""
    missing: list[str] = []
    if not (space.root / CONFIG_NAME).is_file():
        missing.append(f"the objective: no {CONFIG_NAME} in {space.root} (see README, 'The workspace')")
    env_name = space.env_name(env)
    # Before anything is written: a name git refuses would leave a recommended candidate without a branch.
    from improve.loop.publish import check_branch_name

    check_branch_name(review_branch(env_name, "v1"))
    environment = space.environment(env_name)
    scenarios_path = space.scenarios_path(env_name)
    if not scenarios_path.is_file():
        missing.append(f"the scenarios and split: {scenarios_path} does not exist")
    policies_dir = space.policies_dir(env_name)
    changelog = policies_dir / "CHANGELOG.md"
    if not policies_dir.is_dir():
        missing.append(f"the policy history: {policies_dir} does not exist")
    elif not changelog.is_file():
        missing.append(
            f"the policy history: {changelog} does not exist (create it with a '# CHANGELOG' line)"
        )
    policy_path = space.policy_path(env_name, policy)
    if not policy_path.is_file():
        missing.append(f"the policy: {policy_path} does not exist")
    if missing:
        raise WorkspaceError("a round cannot start; missing:\n" + "\n".join(f"- {m}" for m in missing))
    config = space.load_policy(env_name, policy)
    if not config.description.strip():
        raise WorkspaceError(
            f"the goal is missing: {policy_path} has no `description` (the goal with measurable success criteria)"
        )
    if not vocabulary(environment).decisions:
        raise WorkspaceError(
            f"environment {env_name} has no decision (agent.decide): nothing for a policy to do"
        )
    scenario_set = space.scenarios(env_name)
    space.traces.mkdir(parents=True, exist_ok=True)
    return Inputs(
        space,
        environment,
        env_name,
        config,
        policy_path,
        scenario_set.scenarios,
        policies_dir,
        changelog,
        environment.file_hashes(),
    )


def next_version(policies_dir: Path, changelog: Path) -> str:
    """The first version number no policy file and no CHANGELOG entry uses."""
    numbers = [
        int(m.group(1)) for p in policies_dir.glob("v*.json") if (m := re.fullmatch(r"v(\d+)", p.stem))
    ]
    if changelog.exists():
        numbers += [int(n) for n in re.findall(r"^## v(\d+)\b", changelog.read_text(encoding="utf-8"), re.M)]
    return str(max(numbers, default=0) + 1)


def goal_threshold(description: str) -> float | None:
    """The held-out pass-rate criterion written in the goal, e.g. 'held-out pass rate ... >= 0.95'."""
    match = re.search(r"held-out pass rate[^.]*?(?:>=|≥|at least)\s*([01](?:\.\d+)?)", description, re.I)
    return float(match.group(1)) if match else None


def _proposer(opts: RoundOptions, inputs: Inputs) -> Proposer:
    if not isinstance(opts.proposer, str):
        return opts.proposer
    setup = ProposerSetup(
        environment=inputs.env,
        scenarios=inputs.scenarios,
        root=inputs.space.root,
        model=opts.proposer_model,
        base_url=opts.proposer_base_url,
        cache=opts.proposer_cache,
    )
    return make_proposer(opts.proposer, setup, inputs.space)


def _cards(rows: Sequence[OutcomeRow], label: str) -> dict[str, Scorecard]:
    return {split: scorecard(rows, label, split) for split in ("train", "held-out")}


def run_round(space: Workspace, opts: RoundOptions, say: Say = lambda m: None) -> RoundResult:
    inputs = locate(space, opts.env, opts.policy)
    objective = space.config.objective
    k = opts.k or objective.k
    env = inputs.env
    store = JsonlDirStore(space.traces)
    baseline_label = policy_label(inputs.policy)
    version = next_version(inputs.policies_dir, inputs.changelog)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
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

    say(f"baseline: {baseline_label} on {len(train)} train + {len(held_out)} held-out scenarios, k={k}")
    base_spec = SuiteSpec(inputs.policy, opts.model, k, objective.max_model_calls)
    base_rows = _suite(env, inputs.scenarios, base_spec, store, opts, say, "baseline")
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
    diagnosis = diagnose(base_rows, baseline_label, skip=opts.skip)
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

    request = _request(inputs, diagnosis, base_rows, base_cards["train"], store, opts.model, version, k)
    proposer = _proposer(opts, inputs)
    context = GateContext(
        env,
        expected_hashes=inputs.env_hashes,
        probes=probe_requests(env, train, store),
        scenarios=inputs.scenarios,
        gates=gates_for(space),
    )
    proposal, gates, repairs, calls = _propose_and_gate(proposer, request, context, say)
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
        _record(inputs, result, None, None, base_cards, None, proposal, say, opts)
        return result

    candidate = parse_machine(proposal.document, source=f"candidate v{version}")
    result.diff_summary = f"states changed: {', '.join(diff_states(inputs.policy, candidate)) or 'none'}"
    label = policy_label(candidate)
    cand_spec = SuiteSpec(candidate, opts.model, k, objective.max_model_calls)
    say(f"candidate {label}: train, k={k}")
    cand_rows = _suite(env, train, cand_spec, store, opts, say, "train")
    say(f"candidate {label}: held-out, k={k}")
    cand_rows += _suite(env, held_out, cand_spec, store, opts, say, "held-out")
    result.candidate_threads = sorted(r.thread_id for r in cand_rows)
    cand_cards = _cards(cand_rows, label)
    verdict = decide(
        base_cards["train"], base_cards["held-out"], cand_cards["train"], cand_cards["held-out"], objective
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
            "violations_after": cand_cards[split].violations,
            "cost_before": base_cards[split].cost(objective.cost),
            "cost_after": cand_cards[split].cost(objective.cost),
            "k": k,
        }
        for split, cmp in (("train", verdict.train), ("held-out", verdict.held_out))
    }
    _record(inputs, result, candidate, cand_cards, base_cards, verdict, proposal, say, opts)
    return result


def _suite(
    env: Environment,
    scenarios: Sequence[Scenario],
    spec: SuiteSpec,
    store: JsonlDirStore,
    opts: RoundOptions,
    say: Say,
    what: str,
) -> list[OutcomeRow]:
    def ran(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            say(f"  {what}: {done}/{total} runs")

    return run_suite(
        env, scenarios, spec, store, concurrency=opts.concurrency, executor=opts.executor, ran=ran
    )


def _request(
    inputs: Inputs,
    diagnosis: Diagnosis,
    rows: list[OutcomeRow],
    train_card: Scorecard,
    store: JsonlDirStore,
    model: str,
    version: str,
    k: int,
) -> ProposalRequest:
    assert diagnosis.chosen is not None
    in_cluster = set(diagnosis.chosen.threads)
    examples = decision_examples(
        inputs.env, inputs.scenarios, [r for r in rows if r.split == "train"], store, inputs.policy, model
    )
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
        examples=[e.to_json() | {"in_cluster": e.thread_id in in_cluster} for e in examples],
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
    while True:
        document = (
            proposal.document if proposal.document is not None else Unparsed("the proposer returned nothing")
        )
        gates = run_gates(document, context, source=f"candidate v{request.new_version}")
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


def _record(
    inputs: Inputs,
    result: RoundResult,
    candidate: MachineConfig | None,
    cand_cards: dict[str, Scorecard] | None,
    base_cards: dict[str, Scorecard],
    verdict: PromotionDecision | None,
    proposal: Proposal | None,
    say: Say,
    opts: RoundOptions,
) -> None:
    """CHANGELOG entry, report files, and the pull request of a recommended candidate."""
    report_dir = inputs.space.reports / result.round_id
    report_dir.mkdir(parents=True, exist_ok=True)
    result.report = (
        str(report_dir.relative_to(inputs.space.root))
        if report_dir.is_relative_to(inputs.space.root)
        else str(report_dir)
    )
    cards = [base_cards["train"], base_cards["held-out"]]
    if cand_cards:
        cards = [base_cards["train"], cand_cards["train"], base_cards["held-out"], cand_cards["held-out"]]
    body = pr_body(result, cards, verdict, inputs.policy, candidate)
    (report_dir / "scorecard.md").write_text(body, encoding="utf-8")
    if proposal is not None and proposal.document is not None:
        (report_dir / "policy.json").write_text(
            json.dumps(proposal.document, indent=2) + "\n", encoding="utf-8"
        )
    record = result.to_json()
    if not result.recommended:
        entry = append_entry(inputs.changelog, inputs.env_name, record)
        (report_dir / "changelog-entry.md").write_text(entry, encoding="utf-8")
        (report_dir / "round.json").write_text(
            json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8"
        )
        say(f"discarded {result.candidate_version}: recorded in {inputs.changelog}")
        return
    assert candidate is not None and proposal is not None
    entry = entry_markdown(record)
    (report_dir / "changelog-entry.md").write_text(entry, encoding="utf-8")
    (report_dir / "pr.md").write_text(body, encoding="utf-8")
    policy_text = json.dumps(proposal.document, indent=2, ensure_ascii=False) + "\n"
    changelog_text = inputs.changelog.read_text(encoding="utf-8")
    changelog_text = changelog_text + ("" if changelog_text.endswith("\n") else "\n") + "\n" + entry
    result.pr = _pull_request(inputs, result, policy_text, changelog_text, body, report_dir, opts, say)
    (report_dir / "round.json").write_text(
        json.dumps(result.to_json(), indent=2, default=str) + "\n", encoding="utf-8"
    )


def pr_body(
    result: RoundResult,
    cards: list[Scorecard],
    verdict: PromotionDecision | None,
    old: MachineConfig,
    new: MachineConfig | None,
) -> str:
    lines = [f"# {result.environment}: policy {result.candidate_version or '(none)'} ({result.status})", ""]
    if result.hypothesis:
        h = result.hypothesis
        lines += [
            "## Hypothesis",
            "",
            f"- **Cluster**: `{result.cluster}`",
            f"- **Cause**: {h['cause']}",
            f"- **Change**: {result.rationale or h['change']}",
            f"- **Expected to move**: {h['metric']}",
            f"- **Risk**: {h['risk']}",
            f"- **Evidence** (training threads): {', '.join(f'`{t}`' for t in h['evidence'][:8])}",
            "",
        ]
    comparisons = [verdict.train, verdict.held_out] if verdict else []
    lines.append(
        scorecard_markdown(
            cards,
            comparisons,
            title=f"Scorecard (k = {result.k} runs per scenario, model `{result.model}`)",
            old_policy=old if new else None,
            new_policy=new,
            decision=verdict,
            seed=result.seed,
        )
    )
    if result.gates:
        lines += ["## Gates", "", "| gate | result | detail |", "|---|---|---|"]
        for g in result.gates:
            detail = str(g["detail"]).replace("\n", " ").replace("|", "\\|")[:300]
            lines.append(f"| {g['name']} | {'pass' if g['ok'] else '**fail**'} | {detail} |")
        lines += ["", f"Repairs used: {result.repairs}.", ""]
    if result.candidate_threads:
        sample = result.candidate_threads[:6]
        lines += [
            "## Replay it",
            "",
            "Every run is a journaled thread; replaying one calls no model, tool or person:",
            "",
            "```sh",
            *(f"improve replay {t} --verify" for t in sample),
            "```",
            "",
            f'All {len(result.candidate_threads)} candidate threads: `improve sql "SELECT * FROM outcomes '
            f"WHERE policy_version = '{result.candidate_version}'\"` after `improve ingest traces/`.",
            "",
        ]
    lines += ["---", "Opened by `improve round`. A person reviews and merges; the tool never merges.", ""]
    return "\n".join(lines)


def _pull_request(
    inputs: Inputs,
    result: RoundResult,
    policy_text: str,
    changelog_text: str,
    body: str,
    report_dir: Path,
    opts: RoundOptions,
    say: Say,
) -> dict[str, Any]:
    name = f"v{result.candidate_version.lstrip('v')}.json" if result.candidate_version else "candidate.json"
    policy_file = inputs.policies_dir / name
    try:
        import git

        repo = git.Repo(inputs.space.root, search_parent_directories=True)
        top = Path(repo.working_tree_dir or inputs.space.root).resolve()
    except Exception:
        # Not a git repository: the files are left in the report for a person to apply.
        (report_dir / name).write_text(policy_text, encoding="utf-8")
        (report_dir / "CHANGELOG.md").write_text(changelog_text, encoding="utf-8")
        return {
            "pushed": False,
            "instructions": f"not a git repository: copy {report_dir / name} to {policy_file} "
            f"and {report_dir / 'CHANGELOG.md'} to {inputs.changelog}",
        }
    from improve.loop.publish import branch_diff, open_pull_request

    branch = review_branch(inputs.env_name, result.candidate_version or "")
    files = {
        str(policy_file.resolve().relative_to(top)): policy_text,
        str(inputs.changelog.resolve().relative_to(top)): changelog_text,
    }
    # "refunds: policy v2: When facts.order.deliveredDaysAgo > 30, answer CLOSE" (the rule, not the numbers).
    summary = (result.rationale or result.cluster or "").split(" without ")[0].split(": it ")[0]
    title = f"{inputs.env_name}: policy {result.candidate_version}: {summary}"[:120]
    try:
        pr = open_pull_request(
            top,
            branch=branch,
            files=files,
            title=title,
            body=body,
            commit_message=f"{title}\n\nProposed by improve round {result.round_id}.",
        )
    except ImproveError as err:
        say(f"pull request: {err}")
        return {"pushed": False, "error": str(err)}
    (report_dir / "policy.diff").write_text(branch_diff(top, branch, None), encoding="utf-8")
    _restore_changelog(repo, inputs.changelog, top)
    say(f"pull request: {pr.pr_url}" if pr.pr_url else f"branch {branch} ready: {pr.instructions}")
    return pr.to_json()


def _restore_changelog(repo: Any, changelog: Path, top: Path) -> None:
    """The branch carries every entry written since HEAD; the working tree goes back to HEAD's CHANGELOG
    (only when it merely appended entries), so the branch merges cleanly."""
    rel = str(changelog.resolve().relative_to(top))
    try:
        head_text = repo.git.show(f"HEAD:{rel}")
    except Exception:
        return
    current = changelog.read_text(encoding="utf-8")
    if current.startswith(head_text.rstrip("\n")):
        changelog.write_text(head_text + ("\n" if not head_text.endswith("\n") else ""), encoding="utf-8")


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


def asdict_shallow(opts: RoundOptions) -> dict[str, Any]:
    return {f: getattr(opts, f) for f in opts.__dataclass_fields__}
