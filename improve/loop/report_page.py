"""A round's report as one self-contained HTML page (`improve report --html`): the decision, the two
charts, the scorecards, the gates, the policy diagram and the failing runs.

Self-contained means nothing is fetched when the page is viewed: the CSS is inline, the charts and the
diagram are SVG drawn here (`improve.evals.charts.svg_chart`, `improve.machine.describe_svg`), and there
is no script at all. Every text that came from a user's files (scenario and category names, reasons,
guards, version labels) is HTML-escaped. The page is read from what the round left in its report folder
(`round.json`, `scorecards.json`, `policy.json`) and the policies' CHANGELOG.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from improve.errors import ImproveError, WorkspaceError
from improve.evals import (
    Scorecard,
    VersionScore,
    Workspace,
    category_chart,
    history_chart,
    p_value,
    scorecard_from_json,
    svg_chart,
)
from improve.files import write_atomic
from improve.loop.history import measured_from_record, policy_history, read_entries
from improve.machine import MachineConfig, describe_mermaid, describe_svg, diff_states, parse_machine

ROUND_RECORD = "round.json"
SCORECARDS = "scorecards.json"


@dataclass(frozen=True)
class RoundReport:
    """What a round left in its report folder, read back."""

    folder: Path
    record: dict[str, Any]
    cards: list[Scorecard]
    proposed: dict[str, Any] | None
    """The candidate policy's document (`policy.json`), when the round proposed one."""


def round_folders(reports: Path) -> list[Path]:
    """The finished rounds' report folders (those with round.json), oldest first (ids start with the
    UTC time the round began)."""
    if not reports.is_dir():
        return []
    return sorted((d for d in reports.iterdir() if (d / ROUND_RECORD).is_file()), key=lambda d: d.name)


def find_round(reports: Path, round_id: str | None) -> Path:
    """The report folder of `round_id` (a folder name or a unique prefix), or of the latest round."""
    folders = round_folders(reports)
    if not folders:
        raise WorkspaceError(
            f"no finished round in {reports} (a round's folder holds {ROUND_RECORD}); run `improve round` first"
        )
    if round_id is None:
        return folders[-1]
    matches = [d for d in folders if d.name == round_id] or [
        d for d in folders if d.name.startswith(round_id)
    ]
    if len(matches) != 1:
        known = ", ".join(d.name for d in folders[-5:])
        what = "no round matches" if not matches else f"{len(matches)} rounds match"
        raise WorkspaceError(f"{what} {round_id!r} in {reports}; the latest are: {known}")
    return matches[0]


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkspaceError(f"{path} is missing: {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkspaceError(f"{path} is not readable JSON ({exc}); {what}") from None


def load_round_report(folder: Path) -> RoundReport:
    """Read a report folder; a folder from before scorecards.json was written is named as such."""
    record = _read_json(folder / ROUND_RECORD, "the round's record, written when a round finishes")
    cards_path = folder / SCORECARDS
    if not cards_path.is_file():
        raise WorkspaceError(
            f"{cards_path} is missing: the round was recorded before rounds wrote their scorecards as data; "
            f"{folder / 'scorecard.md'} has them as markdown, or run the round again"
        )
    raw_cards = _read_json(cards_path, "the round's scorecards")
    try:
        cards = [scorecard_from_json(c) for c in raw_cards]
    except (KeyError, TypeError) as exc:
        raise WorkspaceError(
            f"{cards_path}: not a list of scorecards ({exc!r}); run the round again"
        ) from None
    proposed_path = folder / "policy.json"
    proposed = _read_json(proposed_path, "the candidate policy") if proposed_path.is_file() else None
    return RoundReport(folder, record, cards, proposed)


# --- the page ---------------------------------------------------------------------------------------

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; margin: 0;
  background: #f6f8fa; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 32px 0 8px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.meta { color: #59636e; margin: 0 0 16px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 600; }
.recommended { background: #dafbe1; color: #116329; } .discarded, .blocked { background: #ffebe9; color: #a40e26; }
.nothing-to-fix { background: #ddf4ff; color: #0550ae; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 14px; }
th, td { border: 1px solid #d0d7de; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fail { color: #a40e26; font-weight: 600; } .pass { color: #116329; }
code, pre { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } figure { margin: 0; }
figcaption { color: #59636e; font-size: 13px; max-width: 720px; }
svg text { font-family: system-ui, sans-serif; } .chart-title { font-size: 15px; font-weight: 600; }
.tick { font-size: 11px; fill: #59636e; } .axis, .legend { font-size: 12px; fill: #1f2328; }
.grid { stroke: #e6e8eb; } .edge { stroke: #444; stroke-width: 1.3; }
.edge-label { font-size: 11px; fill: #0b3d91; paint-order: stroke; stroke: #fff; stroke-width: 3px; }
.state { fill: #eef2ff; stroke: #4f5b93; } .changed { fill: #fff4c2; stroke: #a86b00; stroke-width: 2; }
.sentinel { fill: #ffdede; stroke: #c00; } .choice { stroke-dasharray: 4 2; } .final-ring { stroke: #4f5b93; }
.state-name { font-size: 13px; font-weight: 600; fill: #1f2328; }
.diagram { overflow-x: auto; border: 1px solid #d0d7de; padding: 8px; }
.diagram svg, figure svg { max-width: 100%; height: auto; }
ul.threads { margin: 0; padding-left: 18px; }
"""


def _cell(value: Any, num: bool = False) -> str:
    return f'<td class="num">{escape(str(value))}</td>' if num else f"<td>{escape(str(value))}</td>"


def _table(head: Sequence[str], rows: Sequence[str]) -> str:
    return (
        "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"
    )


def _cards_table(cards: Sequence[Scorecard]) -> str:
    rows = []
    for c in cards:
        runs = c.runs or 1
        rows.append(
            "<tr>"
            + _cell(c.split)
            + _cell(c.policy_version)
            + _cell(len(c.scenarios), True)
            + _cell(c.k, True)
            + _cell(f"{c.pass_rate:.3f}", True)
            + _cell(c.violations, True)
            + _cell(f"{c.model_calls / runs:.2f}", True)
            + _cell(f"{c.tokens / runs:.0f}", True)
            + _cell(c.decisions, True)
            + _cell(c.fallbacks, True)
            + "</tr>"
        )
    head = [
        "split",
        "version",
        "scenarios",
        "k",
        "pass rate",
        "violations",
        "model calls / run",
        "tokens / run",
        "model decisions",
        "fell back (endpoint)",
    ]
    return _table(head, rows)


def _scores_table(scores: dict[str, Any]) -> str:
    rows = []
    for split, s in scores.items():
        p = s.get("p")
        alpha = s.get("alpha")
        test = f"{s.get('test', 'test')} p = {p_value(p)}" + (
            f" (alpha {alpha:g})" if alpha is not None else ""
        )
        test = test if p is not None else ""
        rows.append(
            "<tr>"
            + _cell(split)
            + _cell(f"{s['before']:.3f}", True)
            + _cell(f"{s['after']:.3f}", True)
            + _cell(f"{s['mean_diff']:+.3f}", True)
            + _cell(test)
            + _cell(s.get("violations_after", ""), True)
            + "</tr>"
        )
    return _table(["split", "before", "after", "mean diff", "test", "violations after"], rows)


def _gates_table(gates: Sequence[dict[str, Any]]) -> str:
    rows = [
        f'<tr>{_cell(g.get("name", ""))}<td class="{"pass" if g.get("ok") else "fail"}">'
        f"{'pass' if g.get('ok') else 'fail'}</td>{_cell(str(g.get('detail', ''))[:400])}</tr>"
        for g in gates
    ]
    return _table(["gate", "result", "detail"], rows)


FAILED_RUNS_SHOWN = 5
"""Failed runs listed per scenario; the rest are counted (the warehouse has them all)."""


def _failing(cards: Sequence[Scorecard], first: str | None, trace_href: Callable[[str], str | None]) -> str:
    rows = []
    # The candidate's failures first: they are what a reviewer is deciding about.
    for c in sorted(cards, key=lambda c: c.policy_version != first):
        for s in c.scenarios:
            if s.passed == s.runs:
                continue
            items = []
            for tid in s.failed_threads[:FAILED_RUNS_SHOWN]:
                href = trace_href(tid)
                ident = f"<code>{escape(tid)}</code>"
                items.append(
                    f'<li><a href="{escape(href)}">{ident}</a></li>' if href else f"<li>{ident}</li>"
                )
            more = len(s.failed_threads) - FAILED_RUNS_SHOWN
            if more > 0:
                items.append(f"<li>and {more} more</li>")
            threads = f'<ul class="threads">{"".join(items)}</ul>' if items else ""
            rows.append(
                "<tr>"
                + _cell(c.split)
                + _cell(c.policy_version)
                + _cell(s.scenario)
                + _cell(s.category)
                + _cell(f"{s.passed}/{s.runs}", True)
                + _cell("; ".join(s.reasons)[:400])
                + f"<td>{threads}</td></tr>"
            )
    if not rows:
        return "<p>Every run passed.</p>"
    return (
        "<p>Each thread replays with <code>improve replay THREAD_ID --verify</code> (no model, tool or "
        "person is called).</p>"
        + _table(["split", "version", "scenario", "category", "passed", "why", "failed runs"], rows)
    )


def round_page(
    report: RoundReport,
    history: Sequence[VersionScore],
    baseline: MachineConfig | None,
    candidate: MachineConfig | None,
    trace_href: Callable[[str], str | None] = lambda _: None,
) -> str:
    """The HTML page of a round. `history` is the line of versions that led to the candidate (see
    `improve.loop.history`); the diagram is the candidate's with the states it changed highlighted (the
    baseline's when no candidate was proposed); `trace_href` links a thread id to its file, or not."""
    r = report.record
    status = str(r.get("status", ""))
    title = f"{r.get('environment', '')}: policy {r.get('candidate_version') or '(none)'}"
    sections = [
        f'<h1>{escape(title)} <span class="verdict {escape(status)}">{escape(status)}</span></h1>',
        f'<p class="meta">Round <code>{escape(str(r.get("round_id", "")))}</code>; baseline '
        f"{escape(str(r.get('baseline_version', '')))}; proposer {escape(str(r.get('proposer', '')))}; model "
        f"<code>{escape(str(r.get('model', '')))}</code>; k = {escape(str(r.get('k', '')))}; bootstrap seed "
        f"{escape(str(r.get('seed', '')))}.</p>",
    ]
    if r.get("rationale"):
        sections.append(f"<p><strong>Change:</strong> {escape(str(r['rationale']))}</p>")
    if r.get("cluster"):
        sections.append(f"<p><strong>Cluster:</strong> <code>{escape(str(r['cluster']))}</code></p>")
    if r.get("decision_detail"):
        sections.append(f"<p><strong>Promotion rule:</strong> {escape(str(r['decision_detail']))}</p>")
    charts = [c for c in (history_chart(history), category_chart(report.cards)) if c is not None]
    if charts:
        sections.append('<h2>Pass rates at a glance</h2><div class="charts">')
        for chart in charts:
            sections.append(
                f"<figure>{svg_chart(chart)}<figcaption>{escape(chart.caption)}</figcaption></figure>"
            )
        sections.append("</div>")
    sections += ["<h2>Scorecards</h2>", _cards_table(report.cards)]
    if r.get("scores"):
        sections += ["<h3>Paired by scenario</h3>", _scores_table(r["scores"])]
    if r.get("gates"):
        sections += ["<h2>Gates</h2>", _gates_table(r["gates"])]
    drawn = candidate or baseline
    if drawn is not None:
        changed = diff_states(baseline, candidate) if baseline is not None and candidate is not None else []
        cand_label, base_label = r.get("candidate_version"), r.get("baseline_version")
        what = (
            f"The candidate {cand_label}; the states it changed against {base_label} are amber"
            if candidate is not None and baseline is not None
            else f"Policy {cand_label if candidate is not None else base_label}"
        )
        sections += [
            "<h2>Policy</h2>",
            f"<p>{escape(what)}{': ' + escape(', '.join(changed)) if changed else ''}. Sentinel states are red.</p>",
            f'<div class="diagram">{describe_svg(drawn, highlight=changed)}</div>',
            "<details><summary>The same diagram as Mermaid</summary><pre>"
            + escape(describe_mermaid(drawn, highlight=changed))
            + "</pre></details>",
        ]
    sections += ["<h2>Failing runs</h2>", _failing(report.cards, r.get("candidate_version"), trace_href)]
    sections.append(
        f'<p class="meta">Written by <code>improve report --html</code> from {escape(report.folder.name)}. '
        "The tool never merges; a person reviews.</p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # No network at view time: this policy refuses any fetch a future edit might add by mistake.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(sections)
        + "\n</main></body></html>\n"
    )


# --- from a workspace ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WrittenPage:
    folder: Path
    path: Path
    record: dict[str, Any]
    notes: list[str]


def write_round_page(space: Workspace, round_id: str | None, out: Path | None = None) -> WrittenPage:
    """Write the HTML page of a round of `space` (the latest when `round_id` is None) to `out` (default:
    `report.html` in the round's report folder); thread ids link to their files in the workspace's
    traces, relative to the page."""
    folder = find_round(space.reports, round_id)
    report = load_round_report(folder)
    r = report.record
    env = str(r.get("environment") or space.env_name(None))
    notes: list[str] = []
    baseline: MachineConfig | None = None
    try:
        baseline = space.load_policy(env, str(r["baseline_version"]))
    except (KeyError, ImproveError) as exc:
        notes.append(f"the baseline policy is not drawn: {exc}")
    candidate = None
    if report.proposed is not None:
        try:
            candidate = parse_machine(report.proposed, str(folder / "policy.json"))
        except ImproveError as exc:
            raise WorkspaceError(
                f"{folder / 'policy.json'}: not a policy ({exc}); run the round again"
            ) from None
    history = policy_history(
        read_entries(space.policies_dir(env) / "CHANGELOG.md"),
        str(r.get("candidate_version") or r.get("baseline_version") or ""),
        measured_from_record(r),
    )
    path = out if out is not None else folder / "report.html"
    traces = space.traces.resolve()

    def trace_href(thread_id: str) -> str | None:
        file = traces / f"{thread_id}.jsonl"
        if not file.is_file():
            return None
        # A thread id holds colons: quoted, and `./` first, so no browser reads `train:` as a scheme.
        return "./" + quote(os.path.relpath(file, path.resolve().parent).replace(os.sep, "/"))

    page = round_page(report, history, baseline, candidate, trace_href)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page)
    return WrittenPage(folder, path, r, notes)
