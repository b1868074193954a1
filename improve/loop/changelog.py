"""The policies' CHANGELOG.md: one entry per candidate, recommended or discarded, newest last."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from improve.evals import p_value
from improve.files import write_atomic
from improve.loop.heldout import held_out_lines

HEADER = (
    "# CHANGELOG: {env} policies\n\nEvery candidate a round proposes is recorded here, recommended or discarded, "
    "with its scorecard.\n"
)


def entry_markdown(record: dict[str, Any]) -> str:
    """A CHANGELOG entry from a round record (see round.py: RoundResult.to_json)."""
    decision = "recommended" if record["recommended"] else "discarded"
    lines = [
        f"## {record['candidate_version']} ({decision}) — round {record['round_id']}",
        "",
        f"- Baseline: {record['baseline_version']}; proposer: {record['proposer']}; model: {record['model']}; "
        f"k = {record['k']}; bootstrap seed {record['seed']}.",
    ]
    hypothesis = record.get("hypothesis")
    if hypothesis:
        lines += [
            f"- Cluster: {record['cluster']}.",
            f"- Hypothesis: {hypothesis['cause']}.",
            f"- Change: {record.get('rationale') or hypothesis['change']}",
            f"- Expected to move: {hypothesis['metric']}.",
            f"- Risk: {hypothesis['risk']}.",
        ]
    diff = record.get("diff_summary")
    if diff:
        lines.append(f"- Diff: {diff}.")
    for branch in record.get("branches") or []:
        lines.append(f"- Branch added: `{branch['guard']}` -> `{branch['answer']}`")
    gates = record.get("gates") or []
    if gates:
        summary = ", ".join(f"{g['name']} {'pass' if g['ok'] else 'FAIL'}" for g in gates)
        lines.append(f"- Gates: {summary}; repairs used: {record.get('repairs', 0)}.")
    scores = record.get("scores")
    if scores:
        for split in ("train", "held-out"):
            s = scores.get(split)
            if s:
                lines.append(
                    f"- {split}: {s['before']:.3f} -> {s['after']:.3f} (mean diff {s['mean_diff']:+.3f}, "
                    f"{_test(s)}), violations {s['violations_after']}, model calls/run "
                    f"{s['cost_before']:.2f} -> {s['cost_after']:.2f}"
                    + (
                        f", {s['extra_runs']} extra runs (reruns, both versions)"
                        if s.get("extra_runs")
                        else ""
                    )
                    + "."
                )
    lines += held_out_lines(record)  # which read of the held-out set the round was (loop/heldout.py)
    regressions = record.get("regressions") or []
    lines.append(f"- Regressions: {', '.join(regressions) if regressions else 'none'}.")
    lines.append(f"- Decision: **{decision}**. {record.get('decision_detail', '')}".rstrip())
    if record.get("report"):
        lines.append(f"- Report: `{record['report']}`.")
    return "\n".join(lines) + "\n"


ENTRY = re.compile(
    r"^## (?P<version>\S+) \((?P<decision>recommended|discarded)\) — round (?P<round>\S+)", re.M
)
BASELINE = re.compile(r"^- Baseline: (?P<baseline>[^;]+);", re.M)
_BRANCH = re.compile(r"^- Branch added: `(?P<guard>.+)` -> `(?P<answer>.+)`$", re.M)


def discarded_branches(path: Path, baseline: str) -> list[dict[str, str]]:
    """The branches of candidates discarded against `baseline` (a version label such as `v3`), from the
    CHANGELOG's entries: what a round must not propose against that policy again."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    starts = [m for m in ENTRY.finditer(text)]
    found: list[dict[str, str]] = []
    for index, head in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        body = text[head.end() : end]
        base = BASELINE.search(body)
        if head["decision"] != "discarded" or base is None or base["baseline"].strip() != baseline:
            continue
        for branch in _BRANCH.finditer(body):
            found.append({"guard": branch["guard"], "answer": branch["answer"], "round": head["round"]})
    return found


def _test(score: dict[str, Any]) -> str:
    """The test the promotion rule decided with, as the entry shows it; a record written before the
    exact tests shows its bootstrap interval, labelled as such."""
    if "p" not in score:
        return f"{score['confidence']:.0%} bootstrap CI [{score['ci_low']:+.3f}, {score['ci_high']:+.3f}]"
    p, alpha = score["p"], score["alpha"]
    return f"{score['test']} p = {p_value(p)} {'<=' if p <= alpha else '>'} alpha {alpha:g}"


def append_entry(path: Path, env: str, record: dict[str, Any]) -> str:
    """Append the entry (creating the file with its header when missing); return the entry text."""
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER.format(env=env)
    entry = entry_markdown(record)
    if not text.endswith("\n"):
        text += "\n"
    write_atomic(path, text + "\n" + entry)
    return entry
