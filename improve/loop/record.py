"""What a round leaves behind: the report folder, the CHANGELOG entry, and for a recommended candidate
its review branch and pull request (or, outside git, the files and how to apply them)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from improve.errors import ImproveError
from improve.evals import PromotionDecision, Scorecard, VersionScore, scorecard_markdown
from improve.files import write_atomic
from improve.loop.changelog import append_entry, entry_markdown
from improve.loop.heldout import held_out_sentence, next_held_out_read
from improve.loop.history import measured_from_record, policy_history, read_entries
from improve.loop.inputs import Inputs, RoundResult, review_branch
from improve.loop.proposers import Proposal
from improve.machine import MachineConfig

Say = Callable[[str], None]


def record(
    inputs: Inputs,
    result: RoundResult,
    candidate: MachineConfig | None,
    cand_cards: dict[str, Scorecard] | None,
    base_cards: dict[str, Scorecard],
    verdict: PromotionDecision | None,
    proposal: Proposal | None,
    say: Say,
    *,
    allow_insecure_github: bool = False,
) -> None:
    """CHANGELOG entry, report files, and the pull request of a recommended candidate
    (`allow_insecure_github`: see `RoundOptions`)."""
    if verdict is not None:
        # The promotion rule read the candidate's held-out runs: one more read of the held-out set.
        held_out = [s for s in inputs.scenarios if s.split == "held-out"]
        read = next_held_out_read(inputs.changelog, held_out, inputs.space.config.objective.held_out_bias)
        result.held_out = read.to_json()
        if read.over:
            say(f"warning: {read.warning()}")
    report_dir = report_folder(inputs.space.reports, result, say)
    result.report = (
        str(report_dir.relative_to(inputs.space.root))
        if report_dir.is_relative_to(inputs.space.root)
        else str(report_dir)
    )
    cards = [base_cards["train"], base_cards["held-out"]]
    if cand_cards:
        cards = [base_cards["train"], cand_cards["train"], base_cards["held-out"], cand_cards["held-out"]]
    # Read before this round's entry is appended: the round itself is the history's head.
    history = policy_history(
        read_entries(inputs.changelog),
        result.candidate_version or result.baseline_version,
        measured_from_record(result.to_json()),
    )
    body = pr_body(result, cards, verdict, inputs.policy, candidate, history)
    write_atomic(report_dir / "scorecard.md", body)
    # The scorecards as data, for `improve report --html` (the markdown is for people).
    write_atomic(report_dir / "scorecards.json", json.dumps([c.to_json() for c in cards], indent=2) + "\n")
    if proposal is not None and proposal.document is not None:
        write_atomic(report_dir / "policy.json", json.dumps(proposal.document, indent=2) + "\n")
    record = result.to_json()
    if not result.recommended:
        entry = append_entry(inputs.changelog, inputs.env_name, record)
        write_atomic(report_dir / "changelog-entry.md", entry)
        write_atomic(report_dir / "round.json", json.dumps(record, indent=2, default=str) + "\n")
        say(f"discarded {result.candidate_version}: recorded in {inputs.changelog}")
        return
    assert candidate is not None and proposal is not None
    entry = entry_markdown(record)
    write_atomic(report_dir / "changelog-entry.md", entry)
    write_atomic(report_dir / "pr.md", body)
    policy_text = json.dumps(proposal.document, indent=2, ensure_ascii=False) + "\n"
    changelog_text = inputs.changelog.read_text(encoding="utf-8")
    changelog_text = changelog_text + ("" if changelog_text.endswith("\n") else "\n") + "\n" + entry
    result.pr = open_review(
        inputs,
        result,
        policy_text,
        changelog_text,
        body,
        report_dir,
        say,
        allow_insecure_github=allow_insecure_github,
    )
    write_atomic(report_dir / "round.json", json.dumps(result.to_json(), indent=2, default=str) + "\n")


ROUND_FILES = re.compile(
    r"(scorecard|pr|changelog-entry|CHANGELOG)\.md|policy\.(json|diff)|(candidate|scorecards)\.json|v\d+\.json"
    r"|report\.html"
)
"""The files `record` writes into a report folder; a folder holding only these (and no round.json) is
what a killed round left behind."""


def report_folder(reports: Path, result: RoundResult, say: Say) -> Path:
    """The round's report folder, made empty and ready.

    A finished round's folder (it has `round.json`) is never written over: a round id already taken
    (two rounds in one second) gets a suffix, `-2`, `-3`. A folder without `round.json` is a round
    killed before it finished (after creating its branch, say): the leftovers of this round id, and of
    earlier killed rounds of the same candidate version, are replaced by this round's complete report,
    so no half-written report stays behind looking like a round. A folder holding anything a round
    does not write is left alone.
    """
    base, n = result.round_id, 1
    while (reports / result.round_id / "round.json").exists():
        n += 1
        result.round_id = f"{base}-{n}"
    suffix = f"-{result.environment}-{result.candidate_version}" if result.candidate_version else None
    partial = [reports / result.round_id]
    if suffix is not None and reports.is_dir():
        partial += [d for d in reports.iterdir() if d.is_dir() and d.name.endswith(suffix)]
    for folder in dict.fromkeys(partial):
        if not folder.is_dir() or (folder / "round.json").exists():
            continue
        if all(f.is_file() and ROUND_FILES.fullmatch(f.name) for f in folder.iterdir()):
            shutil.rmtree(folder)
            say(
                f"replaced {folder.name}: a report folder without round.json, left by a round that did not finish"
            )
    folder = reports / result.round_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pr_body(
    result: RoundResult,
    cards: list[Scorecard],
    verdict: PromotionDecision | None,
    old: MachineConfig,
    new: MachineConfig | None,
    history: Sequence[VersionScore] = (),
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
            history=history,
        )
    )
    if result.held_out:
        lines += ["## Held-out reuse", "", held_out_sentence(result.held_out), ""]
        if result.held_out.get("warning"):
            lines += [f"**Warning**: {result.held_out['warning']}.", ""]
    if result.model_info:
        lines += ["## Model", "", model_markdown(result.model_info), ""]
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


def open_review(
    inputs: Inputs,
    result: RoundResult,
    policy_text: str,
    changelog_text: str,
    body: str,
    report_dir: Path,
    say: Say,
    *,
    allow_insecure_github: bool = False,
) -> dict[str, Any]:
    name = f"v{result.candidate_version.lstrip('v')}.json" if result.candidate_version else "candidate.json"
    policy_file = inputs.policies_dir / name
    try:
        import git

        repo = git.Repo(inputs.space.root, search_parent_directories=True)
        top = Path(repo.working_tree_dir or inputs.space.root).resolve()
    except Exception:
        # Not a git repository: the files are left in the report for a person to apply.
        write_atomic(report_dir / name, policy_text)
        write_atomic(report_dir / "CHANGELOG.md", changelog_text)
        return {
            "pushed": False,
            "instructions": f"not a git repository: copy {report_dir / name} to {policy_file} "
            f"and {report_dir / 'CHANGELOG.md'} to {inputs.changelog}",
        }
    from improve.loop.publish import branch_diff, open_pull_request

    branch = review_branch(inputs.env_name, result.candidate_version or "")
    policy_rel = str(policy_file.resolve().relative_to(top))
    files = {policy_rel: policy_text, str(inputs.changelog.resolve().relative_to(top)): changelog_text}
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
            allow_insecure_github=allow_insecure_github,
            # A rerun proposing the same policy adds no commit (its CHANGELOG entry differs only in
            # the round id); the branch keeps the first round's entry.
            candidate=[policy_rel],
        )
    except ImproveError as err:
        say(f"pull request: {err}")
        return {"pushed": False, "error": str(err)}
    write_atomic(report_dir / "policy.diff", branch_diff(top, branch, None))
    restore_changelog(repo, inputs.changelog, top)
    say(f"pull request: {pr.pr_url}" if pr.pr_url else f"branch {branch} ready: {pr.instructions}")
    return pr.to_json()


def restore_changelog(repo: Any, changelog: Path, top: Path) -> None:
    """The branch carries every entry written since HEAD; the working tree goes back to HEAD's CHANGELOG
    (only when it merely appended entries), so the branch merges cleanly."""
    rel = str(changelog.resolve().relative_to(top))
    try:
        head_text = repo.git.show(f"HEAD:{rel}")
    except Exception:
        return
    current = changelog.read_text(encoding="utf-8")
    if current.startswith(head_text.rstrip("\n")):
        write_atomic(changelog, head_text + ("\n" if not head_text.endswith("\n") else ""))


def model_markdown(info: dict[str, Any]) -> str:
    """Which model answered the round's runs, and how reproducible they are: one paragraph."""
    calls = info.get("calls") or {}
    if info.get("provider") == "stand-in":
        return f"Stand-in model `{info['name']}`: deterministic, seeded per scenario and run, no endpoint."
    seed = info.get("seed")
    fingerprints = ", ".join(f"`{f}`" for f in info.get("fingerprints") or []) or "none reported"
    usd = calls.get("usd")
    text = (
        f"`{info['name']}`: {info['provider']} model `{info['model']}` at {info['endpoint']}, temperature "
        f"{info['temperature']}, seed {seed if seed is not None else 'not set'}; system fingerprint "
        f"{fingerprints}. {calls.get('calls', 0)} calls ({calls.get('recorded', 0)} from recordings, "
        f"{calls.get('live', 0)} live, {calls.get('failed', 0)} failed, {calls.get('retries', 0)} retries), "
        f"{calls.get('input_tokens', 0) + calls.get('output_tokens', 0):,} tokens, "
        + (f"${usd:.4f}." if usd is not None else "cost unknown (no price).")
    )
    if info.get("mixed"):
        text += (
            " **Mixed**: this round combined recorded and live calls, so a replay (`--cache replay`) needs "
            "the recordings of both."
        )
    return text
