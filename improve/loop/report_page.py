"""A round's report as one self-contained HTML page (`improve report --html`): the decision, the two
charts, the scorecards, the gates, the policy diagram and the failing runs.

Self-contained means nothing is fetched when the page is viewed: the CSS is inline, the charts and the
diagram are SVG drawn here (`improve.evals.charts.svg_chart`, `improve.machine.describe_svg`), and there
is no script at all. Every text that came from a user's files (scenario and category names, reasons,
guards, version labels) is HTML-escaped. The page is drawn from the round's record (`round.json`,
`improve.loop.round_record`) alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from improve.errors import ImproveError, WorkspaceError
from improve.evals import Scorecard, Workspace, category_chart, history_chart, p_value, svg_chart
from improve.files import write_atomic
from improve.loop.changelog import CHANGELOG, Changelog, Entry, proposer_text
from improve.loop.gates import GateResult
from improve.loop.render import OUT_OF_SAMPLE, out_of_sample_command
from improve.loop.round_record import ROUND_RECORD, Impact, RoundRecord, SplitScore, read_round_record
from improve.machine import describe_mermaid, describe_svg, diff_states


def round_folders(reports: Path) -> list[Path]:
    """The finished rounds' report folders (those with round.json), oldest first: ids start with the UTC
    second the round began, then its version, compared as a number (`--rounds 3` can run v9 and v10 in
    one second, and `-v10` sorts before `-v9` as text)."""
    if not reports.is_dir():
        return []
    return sorted((d for d in reports.iterdir() if (d / ROUND_RECORD).is_file()), key=_in_order)


def _in_order(folder: Path) -> list[tuple[int, str]]:
    """A folder name's key, its runs of digits compared as numbers (`...-v9` before `...-v10`, and a
    collision's `...-v10-1` after `...-v10`)."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", folder.name)]


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
.nothing-to-fix, .nothing-left-to-try { background: #ddf4ff; color: #0550ae; }
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
            + _cell(c.runs_per_scenario, True)
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
        "runs / scenario",
        "pass rate",
        "violations",
        "model calls / run",
        "tokens / run",
        "model decisions",
        "fell back (endpoint)",
    ]
    return _table(head, rows)


def _scores_table(scores: dict[str, SplitScore]) -> str:
    rows = []
    for split, s in scores.items():
        test = ""
        if s.p is not None:
            test = f"{s.test or 'test'} p = {p_value(s.p)}" + (
                f" (alpha {s.alpha:g})" if s.alpha is not None else ""
            )
        rows.append(
            "<tr>"
            + _cell(split)
            + _cell(f"{s.before:.3f}", True)
            + _cell(f"{s.after:.3f}", True)
            + _cell(f"{s.mean_diff:+.3f}", True)
            + _cell(test)
            + _cell(s.violations_after, True)
            + "</tr>"
        )
    return _table(["split", "before", "after", "mean diff", "test", "violations after"], rows)


def _gates_table(gates: Sequence[GateResult]) -> str:
    rows = [
        f'<tr>{_cell(g.name)}<td class="{"pass" if g.ok else "fail"}">'
        f"{'pass' if g.ok else 'fail'}</td>{_cell(g.detail[:400])}</tr>"
        for g in gates
    ]
    return _table(["gate", "result", "detail"], rows)


def _impact(impact: Impact) -> str:
    rows = [
        "<tr>"
        + _cell(c.decision)
        + f"<td><code>{escape(c.before)}</code></td><td><code>{escape(c.after)}</code></td>"
        + _cell(c.threads, True)
        + "<td>"
        + ", ".join(f"<code>{escape(t)}</code>" for t in c.examples)
        + (f" (<code>{escape(c.example)}</code>)" if c.example else "")
        + "</td></tr>"
        for c in impact.changes
    ]
    table = (
        _table(["decision", "answered", "the candidate would answer", "threads", "for example"], rows)
        if rows
        else ""
    )
    return f"<p>{escape(impact.summary())}</p>{table}"


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


def _reruns_note(record: RoundRecord) -> str:
    """Where the sequential reruns ran scenarios beyond k, say so beside k: the table counts them."""
    most = max((c.k for c in record.scorecards), default=record.k)
    return f" (up to {most} with the reruns the promotion rule asked for)" if most > record.k else ""


def round_page(
    record: RoundRecord, folder: str, trace_href: Callable[[str], str | None] = lambda _: None
) -> str:
    """The HTML page of a round (its report folder's name is `folder`). The history chart is the line of
    versions that led to the candidate (`Changelog.history`); the diagram is the candidate's with the
    states it changed highlighted (the baseline's when no candidate was proposed); `trace_href` links a
    thread id to its file, or not."""
    r = record
    status = r.status
    title = f"{r.environment}: policy {r.candidate_version or '(none)'}"
    sections = [
        f'<h1>{escape(title)} <span class="verdict {escape(status)}">{escape(status)}</span></h1>',
        f'<p class="meta">Round <code>{escape(r.round_id)}</code>; baseline {escape(r.baseline_version)}; '
        f"proposer {escape(proposer_text(r))}; model <code>{escape(r.model)}</code>; k = {r.k} runs per scenario"
        f"{_reruns_note(r)}; bootstrap seed {r.seed}.</p>",
    ]
    if r.rationale:
        sections.append(f"<p><strong>Change:</strong> {escape(r.rationale)}</p>")
    if r.cluster:
        sections.append(f"<p><strong>Cluster:</strong> <code>{escape(r.cluster)}</code></p>")
    if r.decision_detail:
        sections.append(f"<p><strong>Promotion rule:</strong> {escape(r.decision_detail)}</p>")
    charts = [c for c in (history_chart(r.history or ()), category_chart(r.scorecards)) if c is not None]
    if charts:
        sections.append('<h2>Pass rates at a glance</h2><div class="charts">')
        for chart in charts:
            sections.append(
                f"<figure>{svg_chart(chart)}<figcaption>{escape(chart.caption)}</figcaption></figure>"
            )
        sections.append("</div>")
    sections += ["<h2>Scorecards</h2>", _cards_table(r.scorecards)]
    if r.scores:
        sections += ["<h3>Paired by scenario</h3>", _scores_table(r.scores)]
    if r.impact:
        sections += ["<h2>Production impact preview</h2>", _impact(r.impact)]
    if r.cases and r.candidate_policy is not None:
        found = r.out_of_sample
        checked = (
            f"<p>{escape('The round checked it ' + found.summary())}.</p>"
            + "".join(f"<p><code>{escape(e)}</code></p>" for e in found.examples)
            if found is not None
            else ""
        )
        sections += [
            "<h2>Out of sample</h2>",
            f"{checked}<p>{escape(OUT_OF_SAMPLE)}</p><pre>{escape(out_of_sample_command(r, unmerged=True))}</pre>",
        ]
    if r.gates:
        sections += ["<h2>Gates</h2>", _gates_table(r.gates)]
    baseline, candidate = r.baseline_policy, r.candidate_policy
    drawn = candidate or baseline
    if drawn is not None:
        changed = diff_states(baseline, candidate) if baseline is not None and candidate is not None else []
        cand_label, base_label = r.candidate_version, r.baseline_version
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
    sections += ["<h2>Failing runs</h2>", _failing(r.scorecards, r.candidate_version, trace_href)]
    sections.append(
        f'<p class="meta">Written by <code>improve report --html</code> from {escape(folder)}. '
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
    record: RoundRecord
    notes: list[str]


def write_round_page(space: Workspace, round_id: str | None, out: Path | None = None) -> WrittenPage:
    """Write the HTML page of a round of `space` (the latest when `round_id` is None) to `out` (default:
    `report.html` in the round's report folder); thread ids link to their files in the workspace's
    traces, relative to the page. A record from before rounds recorded their baseline and history
    takes them from the workspace (the policy file, the CHANGELOG)."""
    folder = find_round(space.reports, round_id)
    record = read_round_record(folder, environment=space.env_name(None))
    notes: list[str] = []
    if record.baseline_policy is None:
        try:
            record.baseline_policy = space.load_policy(record.environment, record.baseline_version)
        except ImproveError as exc:
            notes.append(f"the baseline policy is not drawn: {exc}")
    if record.history is None:
        changelog = Changelog.read(space.policies_dir(record.environment) / CHANGELOG)
        record.history = changelog.history(
            record.candidate_version or record.baseline_version, Entry.of(record) if record.scores else None
        )
    path = out if out is not None else folder / "report.html"
    traces = space.traces.resolve()

    def trace_href(thread_id: str) -> str | None:
        file = traces / f"{thread_id}.jsonl"
        if not file.is_file():
            return None
        # A thread id holds colons: quoted, and `./` first, so no browser reads `train:` as a scheme.
        return "./" + quote(os.path.relpath(file, path.resolve().parent).replace(os.sep, "/"))

    page = round_page(record, folder.name, trace_href)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page)
    return WrittenPage(folder, path, record, notes)
