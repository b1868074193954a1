"""The charts reviewers read: Mermaid xychart text (golden), the history read off a CHANGELOG, the SVG
drawing with hostile labels, and the HTML report of a round (in headless Chromium where installed)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from improve.evals.charts import (
    VersionScore,
    category_chart,
    chart_labels,
    chart_markdown,
    history_chart,
    mermaid_xychart,
    svg_chart,
)
from improve.evals.report import cards_table
from improve.evals.scorecards import ScenarioScore, Scorecard
from improve.loop.changelog import Changelog, Entry, entry_text, policy_history
from improve.loop.round_record import RoundRecord


def card(version: str, split: str, scores: dict[str, tuple[str, int]], runs: int = 2) -> Scorecard:
    """A scorecard of scenarios `id -> (category, passes of runs)`; failed runs get thread ids."""
    return Scorecard(
        version,
        split,
        [
            ScenarioScore(
                scenario=sid,
                category=category,
                split=split,
                runs=runs,
                passed=passed,
                violations=0,
                model_calls=runs,
                tokens=10 * runs,
                outcomes={"issued": passed},
                reasons=["expected issued, got escalated"] if passed < runs else [],
                failed_threads=[f"{split}:{version}:naive:{sid}:r{i + 1}" for i in range(runs - passed)],
            )
            for sid, (category, passed) in scores.items()
        ],
    )


HOSTILE = 'say "hi" [x], `y` #1; <b>'


def before_after() -> list[Scorecard]:
    return [
        card("v1", "train", {"a-1": ("small", 2), "b-1": (HOSTILE, 0)}),
        card("v2", "train", {"a-1": ("small", 2), "b-1": (HOSTILE, 2)}),
        card("v1", "held-out", {"a-2": ("small", 1), "c-1": ("late", 0)}),
        card("v2", "held-out", {"a-2": ("small", 2), "c-1": ("late", 1)}),
    ]


HISTORY = [VersionScore("v0", 0.5, 0.4), VersionScore("v1", 0.75, 0.7), VersionScore("v2", 0.9, 0.85)]


def test_the_history_chart_is_two_lines_over_the_versions_golden() -> None:
    chart = history_chart(HISTORY)
    assert chart is not None
    assert mermaid_xychart(chart) == (
        '%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "#2563eb, #ea580c"}}}}%%\n'
        "xychart-beta\n"
        '    title "Pass rate by policy version"\n'
        '    x-axis "policy version" ["v0", "v1", "v2"]\n'
        '    y-axis "pass rate" 0 --> 1\n'
        '    line "train" [0.500, 0.750, 0.900]\n'
        '    line "held-out" [0.400, 0.700, 0.850]\n'
    )
    block = chart_markdown(chart)
    assert block[0] == "```mermaid" and block[2] == "```"
    assert block[4].startswith("Lines: train in blue, held-out in orange.")
    assert history_chart(HISTORY[:1]) is None  # one version is a number, not a trend
    assert "scenarios changed" not in chart.caption
    # Rounds that read other held-out sets (scenarios added between them): the caption says which
    # versions each set measured, as a drop from one set to the next may be the scenarios'.
    moved = [
        dataclasses.replace(v, held_out_set=key)
        for v, key in zip(HISTORY, ("aaa", "aaa", "bbb"), strict=True)
    ]
    said = history_chart(moved)
    assert said is not None and "2 held-out sets; `aaa`: v0, v1, `bbb`: v2" in said.caption, said.caption


def test_the_category_chart_puts_before_and_after_bars_side_by_side_and_escapes_labels_golden() -> None:
    chart = category_chart(before_after())
    assert chart is not None
    # Categories from user files: no raw quote, bracket, backtick, `#`, `;` or `<` reaches Mermaid. Each
    # category has a slot per version (Mermaid stacks bar series in one slot, and a line across
    # categories would read as an order they do not have).
    hostile = "say #quot;hi#quot; [x], #96;y#96; #35;1#59; #lt;b#gt;"
    assert mermaid_xychart(chart) == (
        '%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "#ea580c, #2563eb"}}}}%%\n'
        "xychart-beta\n"
        '    title "Pass rate by category, v1 and v2"\n'
        f'    x-axis "category" ["late · v1", "late · v2", "{hostile} · v1", "{hostile} · v2", "small · v1", '
        '"small · v2"]\n'
        '    y-axis "pass rate" 0 --> 1\n'
        '    bar "before (v1)" [0.000, 0.000, 0.000, 0.000, 0.750, 0.000]\n'
        '    bar "after (v2)" [0.000, 0.500, 0.000, 1.000, 0.000, 1.000]\n'
    )
    assert "line" not in mermaid_xychart(chart)
    caption = chart_markdown(chart)[4]
    assert caption.startswith("Bars: before (v1) in orange, after (v2) in blue.")
    one = category_chart(before_after()[:1])
    assert one is not None and [s.kind for s in one.series] == ["bar"]
    assert '"small"]' in mermaid_xychart(one)
    # A long category is shortened before its version, so its two slots stay told apart.
    long = [
        card(v, "train", {"a": ("a-category-name-much-longer-than-any-axis-label", 1)}) for v in ("v1", "v2")
    ]
    chart = category_chart(long)
    assert chart is not None
    labels = mermaid_xychart(chart).splitlines()[3]
    assert "… · v1" in labels and "… · v2" in labels and "(2)" not in labels


def test_a_category_measured_on_one_side_only_is_left_out_and_said() -> None:
    cards = [
        card("v1", "train", {"a": ("small", 1), "b": ("gone", 1)}),
        card("v2", "train", {"a": ("small", 2)}),
    ]
    chart = category_chart(cards)
    assert chart is not None and chart.x_labels == ("small",)
    assert "left out: gone" in chart.caption


def test_labels_cut_to_the_same_text_stay_apart() -> None:
    long = "x" * 60
    labels = chart_labels([long + "a", long + "b", ""])
    assert len(set(labels)) == 3 and labels[1].endswith("(2)") and labels[2] == "(none)"


def test_the_svg_escapes_every_label_and_has_no_script_or_reference() -> None:
    chart = category_chart(before_after())
    assert chart is not None
    svg = svg_chart(chart)
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "&quot;hi&quot;" in svg
    assert "<script" not in svg and "href" not in svg
    assert svg.count("<rect") == 2 * 3 + 2  # two bars per category, two legend marks


def test_slanted_category_labels_start_inside_the_chart() -> None:
    """Many categories slant their labels; the first, long ones must not run off the left edge."""
    from improve.evals.charts import Chart, Series

    labels = ("angry-small-refund", "approval-rejected", *(f"c{i}" for i in range(9)))
    chart = Chart(
        "t", "category", labels, (Series("after", "bar", tuple(1.0 for _ in labels), "#2563eb"),), "c"
    )
    svg = svg_chart(chart)
    ticks = re.findall(
        r'<text x="([0-9.]+)" y="[0-9.]+" text-anchor="end" transform="rotate\(-30[^>]*>([^<]+)<', svg
    )
    assert len(ticks) == len(labels)
    for x, label in ticks:
        assert float(x) - len(label) * 6.1 >= 0, (label, x)


def changelog(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    path = tmp_path / "CHANGELOG.md"
    entries = (entry_text(RoundRecord.model_validate({"environment": "refunds", **r})) for r in records)
    path.write_text("# CHANGELOG: refunds policies\n\n" + "\n".join(entries))
    return path


def record(
    version: str, baseline: str, recommended: bool, train: tuple[float, float], held: tuple[float, float]
) -> dict[str, object]:
    def score(pair: tuple[float, float]) -> dict[str, object]:
        return {
            "before": pair[0],
            "after": pair[1],
            "mean_diff": pair[1] - pair[0],
            "p": 0.01,
            "alpha": 0.05,
            "test": "exact stratified test",
            "violations_after": 0,
            "cost_before": 1.0,
            "cost_after": 0.5,
        }

    return {
        "candidate_version": version,
        "baseline_version": baseline,
        "round_id": f"20260101-000000-refunds-{version}",
        "recommended": recommended,
        "proposer": "rules",
        "model": "naive",
        "k": 3,
        "seed": 1,
        "scores": {"train": score(train), "held-out": score(held)},
    }


def test_the_history_follows_the_line_of_recommended_versions_with_their_newest_measurement(
    tmp_path: Path,
) -> None:
    path = changelog(
        tmp_path,
        [
            record("v1", "v0", True, (0.5, 0.7), (0.4, 0.6)),
            record("v2", "v1", False, (0.7, 0.6), (0.6, 0.5)),  # discarded: off the line
            record("v3", "v1", True, (0.72, 0.8), (0.61, 0.75)),  # v1 measured again: newest wins
            record("v4", "v0", True, (0.5, 0.9), (0.4, 0.8)),  # an unmerged branch from v0
        ],
    )
    entries = Changelog.read(path).entries
    assert [(e.candidate, e.baseline, e.recommended) for e in entries] == [
        ("v1", "v0", True),
        ("v2", "v1", False),
        ("v3", "v1", True),
        ("v4", "v0", True),
    ]
    current = Entry(
        "v5", "v3", "r5", False, {"train": 0.81, "held-out": 0.74}, {"train": 0.85, "held-out": 0.8}
    )
    history = policy_history(entries, "v5", current)
    assert [(h.version, h.train, h.held_out) for h in history] == [
        ("v0", 0.5, 0.4),
        ("v1", 0.72, 0.61),
        ("v3", 0.81, 0.74),
        ("v5", 0.85, 0.8),
    ]
    assert [h.version for h in policy_history(entries, "v3")] == ["v0", "v1", "v3"]
    assert policy_history(entries, "v9") == [] and Changelog.read(tmp_path / "none.md").history("v1") == []
    assert {e.model for e in entries} == {"naive"}
    # A round on another model (a real one, after the stand-in's rounds): only its own model's figures
    # are on the line, never beside the stand-in's, which it cannot be compared with.
    real = Entry(
        "v5",
        "v3",
        "r5",
        False,
        {"train": 0.4, "held-out": 0.3},
        {"train": 0.6, "held-out": 0.5},
        model="smol",
    )
    assert [(h.version, h.held_out) for h in policy_history(entries, "v5", real)] == [
        ("v3", 0.3),
        ("v5", 0.5),
    ]
    # Each point keeps the held-out set its round read, for the chart to say where the set changed.
    read = dataclasses.replace(current, held_out=("c0ffee", 4))
    assert [h.held_out_set for h in policy_history(entries, "v5", read)][-2:] == ["c0ffee", "c0ffee"]
    # A loop in hand-edited entries ends the walk instead of hanging it.
    looped = [Entry("v1", "v2", "a", True, {}, {}), Entry("v2", "v1", "b", True, {}, {})]
    assert policy_history(looped, "v2") == []


def page_of_a_round(tmp_path: Path, cards: list[Scorecard] | None = None) -> Path:
    """A round's HTML page from a report folder as a round leaves it, with hostile user text in it."""
    from improve.loop.report_page import round_page
    from improve.loop.round_record import read_round_record
    from improve.machine import parse_machine
    from tests.test_scorecard import V1

    folder = tmp_path / "reports" / "20260101-000000-refunds-v2"
    folder.mkdir(parents=True)
    rec = record("v2", "v1", True, (0.5, 0.9), (0.4, 0.8)) | {
        "environment": "refunds",
        "status": "recommended",
        "rationale": "When <script>alert(1)</script> answer CLOSE",
        "gates": [
            {"name": "validate", "ok": True, "detail": "ok"},
            {"name": "lint", "ok": False, "detail": "<i>x</i>"},
        ],
    }
    (folder / "round.json").write_text(json.dumps(rec))
    (folder / "scorecards.json").write_text(json.dumps([c.to_json() for c in cards or before_after()]))
    candidate = dict(V1, version="2")
    (folder / "policy.json").write_text(json.dumps(candidate))
    baseline = parse_machine(
        json.loads((Path(__file__).parent.parent / "policies/refunds/v0.json").read_text())
    )
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "train:v1:naive:b-1:r1.jsonl").write_text("{}\n")
    read = read_round_record(folder)
    read.history, read.baseline_policy = list(HISTORY), baseline
    assert read.candidate_policy == parse_machine(candidate)
    page = round_page(
        read,
        folder.name,
        trace_href=lambda t: (
            f"./../../traces/{t}.jsonl".replace(":", "%3A") if (traces / f"{t}.jsonl").exists() else None
        ),
    )
    out = folder / "report.html"
    out.write_text(page)
    return out


def test_the_round_page_is_self_contained_and_escapes_what_users_wrote(tmp_path: Path) -> None:
    page = page_of_a_round(tmp_path).read_text()
    assert (
        "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<i>x</i>" not in page
    )
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert page.count("<svg") == 3  # the two charts and the policy diagram
    assert "Pass rate by policy version" in page and "Pass rate by category, v1 and v2" in page
    assert (
        "&gt;= 3" in page and "class route," in page and "The candidate v2; the states" in page
    )  # the diagram (a guard), and its Mermaid text
    # Runs per scenario as the markdown scorecard says them, and k beside them in the header: never "k"
    # over a count that holds the reruns (the page once said k = 3 above a table of k 9).
    assert "<th>runs / scenario</th>" in page and "<th>k</th>" not in page
    assert "k = 3 runs per scenario;" in page
    # Failing runs are listed with their thread ids; one whose file exists is linked (colons quoted).
    assert 'href="./../../traces/train%3Av1%3Anaive%3Ab-1%3Ar1.jsonl"' in page
    assert "<code>held-out:v2:naive:c-1:r1</code>" in page


def test_runs_per_scenario_read_the_same_in_the_markdown_and_the_page_when_reruns_ran(tmp_path: Path) -> None:
    cards = before_after()
    first, *rest = cards[3].scenarios
    cards[3] = dataclasses.replace(cards[3], scenarios=[dataclasses.replace(first, runs=9), *rest])
    assert (cards[0].runs_per_scenario, cards[3].runs_per_scenario) == ("2", "2-9")
    assert "| held-out | v2 | 2 | 2-9 |" in "\n".join(cards_table(cards))
    page = page_of_a_round(tmp_path, cards).read_text()
    assert '<td class="num">2-9</td>' in page and "k = 3 runs per scenario (up to 9 with the reruns" in page
    # And `improve score`'s table in the terminal.
    from rich.console import Console

    from improve.cli import evals as score_cli

    shown = Console(width=200, record=True)
    with mock.patch.object(score_cli, "out", shown):
        score_cli._print_tables(cards, [], 1)
    row = next(line for line in shown.export_text().splitlines() if "held-out" in line and "v2" in line)
    assert "│ 2-9 " in row, row


@pytest.mark.slow
def test_the_round_page_renders_in_chromium_without_console_errors_or_requests(tmp_path: Path) -> None:
    from tests.headless import find_chromium, load_page, png_size

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it in CI)")
    page = page_of_a_round(tmp_path)
    loaded = load_page(chromium, page)
    assert loaded.errors == []
    assert loaded.requests == [page.resolve().as_uri()]  # the page itself, nothing else
    assert png_size(loaded.screenshot) == (1200, 2000) and len(loaded.screenshot) > 30_000
    (tmp_path / "report.png").write_bytes(loaded.screenshot)

    # The check can fail: a console error, and a fetch the page's policy refuses, are both seen.
    text = page.read_text()
    noisy = tmp_path / "noisy.html"
    no_policy = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    noisy.write_text(
        no_policy.replace("</main>", "<script>console.error('deliberate error')</script></main>")
    )
    assert any("deliberate error" in e for e in load_page(chromium, noisy).errors)
    fetching = tmp_path / "fetching.html"
    fetching.write_text(text.replace("</main>", '<img src="http://127.0.0.1:9/x.png"></main>'))
    assert load_page(chromium, fetching).errors  # refused by the page's Content-Security-Policy


def test_report_names_what_is_missing_or_broken_in_a_report_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from improve.cli.main import app
    from tests.helpers import copy_workspace

    ws = copy_workspace(tmp_path / "ws")
    runner = CliRunner()
    none = runner.invoke(app, ["report", "-w", str(ws), "--html"])
    assert none.exit_code == 2 and "no finished round" in none.stderr and "improve round" in none.stderr
    folder = ws / "reports" / "20260101-000000-refunds-v1"
    folder.mkdir(parents=True)
    (folder / "round.json").write_text(json.dumps(record("v1", "v0", True, (0.5, 0.7), (0.4, 0.6))))
    old = runner.invoke(app, ["report", "-w", str(ws), "--html"])
    assert (
        old.exit_code == 2
        and "scorecards.json is missing" in old.stderr
        and "run the round again" in old.stderr
    )
    (folder / "scorecards.json").write_text("[{")
    broken = runner.invoke(app, ["report", "-w", str(ws), "--html"])
    assert broken.exit_code == 2 and "scorecards.json is not readable JSON" in broken.stderr
    assert "Traceback" not in old.output + broken.output + none.output
    out = runner.invoke(app, ["report", "-w", str(ws), "--out", str(tmp_path / "x.html")])
    assert out.exit_code == 2 and "pass --html" in out.stderr
    # A folder from a round as it is written now: the page lands where --out says.
    (folder / "scorecards.json").write_text(json.dumps([c.to_json() for c in before_after()]))
    done = runner.invoke(app, ["report", "-w", str(ws), "--html", "--out", str(tmp_path / "x.html")])
    assert done.exit_code == 0, done.output
    assert "Pass rate by category, v1 and v2" in (tmp_path / "x.html").read_text()


def test_the_latest_round_is_the_last_to_begin_its_version_read_as_a_number(tmp_path: Path) -> None:
    """`--rounds 3` can begin v9 and v10 in one second: v10 is the later, though `-v10` sorts before
    `-v9` as text; a round that used no version up (a collision's `-1`) comes after the one it shares
    a name with."""
    from improve.loop.report_page import find_round, round_folders

    names = [
        "20260101-000000-refunds-v9",
        "20260101-000000-refunds-v10",
        "20260101-000000-refunds-v10-1",
        "20251231-235959-refunds-v11",
        "20260101-000001-refunds-v2",
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "round.json").write_text("{}")
    assert [d.name for d in round_folders(tmp_path)] == [
        "20251231-235959-refunds-v11",
        "20260101-000000-refunds-v9",
        "20260101-000000-refunds-v10",
        "20260101-000000-refunds-v10-1",
        "20260101-000001-refunds-v2",
    ]
    assert find_round(tmp_path, None).name == "20260101-000001-refunds-v2"
    (tmp_path / "20260101-000001-refunds-v2" / "round.json").unlink()
    assert find_round(tmp_path, None).name == "20260101-000000-refunds-v10-1"


def a_round(version: str, baseline: str, status: str, **fields: Any) -> RoundRecord:
    """A round record with the sections a CHANGELOG entry writes."""
    return RoundRecord.model_validate(
        {
            "round_id": f"20260101-000000-refunds-{version}",
            "environment": "refunds",
            "baseline_version": baseline,
            "candidate_version": version,
            "proposer": "rules",
            "model": "naive",
            "k": 3,
            "seed": 7,
            "status": status,
            "recommended": status == "recommended",
            "decision_detail": "held-out gain: FAIL (p = 0.2)",
            **fields,
        }
    )


def test_a_changelog_entry_parses_back_to_the_entry_it_records(tmp_path: Path) -> None:
    """parse(render(record)) is the record's entry, whichever sections the round had: the heading, the
    baseline, each split's pass rates, the branches it added and its read of the held-out set; and an
    entry appended lands after one another process appended meanwhile."""
    from improve.loop.changelog import HEADER, DiscardedBranch

    score = {"mean_diff": 0.25, "violations_after": 0, "cost_before": 1.0, "cost_after": 0.5}
    exact = {"test": "exact stratified test", "p": 0.0123, "alpha": 0.05}
    held_out = {"key": "5f0c2a9e13b7", "scenarios": 27, "read": 3, "supported": 1, "max_bias": 0.1}
    rich = a_round(
        "v2",
        "v1",
        "discarded",
        cluster="wrong-answer:triage:ROUTE{queue=billing}->ROUTE{queue=security}",
        hypothesis={
            "cause": "c",
            "evidence": ["train:v1:naive:a:r1"],
            "change": "ch",
            "metric": "m",
            "risk": "r",
        },
        branches=[
            {
                "guard": "facts.ticket.text.contains('password') && {'type': 'ROUTE'} in input.options",
                "answer": "ROUTE{queue: 'security'}",
            },
            {"guard": "facts.order.amount > 30", "answer": "REFUND{amount: facts.order.refundable}"},
        ],
        gates=[{"name": "validate", "ok": True, "detail": "ok"}],
        scores={
            "train": {"before": 0.61234, "after": 0.8, **score, **exact, "extra_runs": 6},
            "held-out": {"before": 0.4, "after": 0.45, **score, "ci_low": -0.1, "ci_high": 0.2},  # bootstrap
        },
        held_out={**held_out, "bias_bound": 0.16, "warning": "held-out set `5f0c2a9e13b7` has been read"},
        report="reports/20260101-000000-refunds-v2",
    )
    gated = a_round("v3", "v1", "discarded", gates=[{"name": "validate", "ok": False, "detail": "$.initial"}])
    promoted = a_round(
        "v4",
        "v1",
        "recommended",
        scores={s: {"before": 0.5, "after": 0.9, **score, **exact} for s in ("train", "held-out")},
    )
    records = [rich, gated, promoted]
    text = HEADER.format(env="refunds") + "".join("\n" + entry_text(r) for r in records)
    parsed = Changelog.parse(text)
    assert parsed.entries == tuple(Entry.of(r) for r in records)
    assert parsed.versions == (2, 3, 4)
    assert parsed.discarded_branches("v1") == [
        DiscardedBranch(b.guard, b.answer, rich.round_id) for b in rich.branches
    ]
    assert parsed.held_out_reads("5f0c2a9e13b7") == 3
    assert [v.version for v in parsed.history("v4")] == ["v1", "v4"]
    # Appended in one write at the end: another process's entry, appended since this one read the
    # file, stays, and both parse back.
    path = tmp_path / "CHANGELOG.md"
    path.write_text(text)
    mine = Changelog.read(path)
    with path.open("a") as other:
        other.write("\n" + entry_text(a_round("v5", "v4", "discarded")))
    after = mine.append(entry_text(a_round("v6", "v4", "discarded")), "refunds")
    assert [e.candidate for e in Changelog.read(path).entries] == ["v2", "v3", "v4", "v5", "v6"]
    assert after.text == path.read_text()


def test_a_round_record_reads_back_typed_and_an_older_one_is_migrated(tmp_path: Path) -> None:
    """round.json as written reads back equal, scorecards and decision included; a record of the first
    format (no `format`: scorecards.json and policy.json beside it) reads as the same typed record."""
    from improve.evals.promotion import decide
    from improve.evals.workspace import ObjectiveSection
    from improve.loop.round_record import FORMAT, read_round_record
    from tests.test_scorecard import V1

    cards = before_after()
    verdict = decide(cards[0], cards[2], cards[1], cards[3], ObjectiveSection())
    written = a_round(
        "v2",
        "v1",
        "discarded",
        scorecards=cards,
        decision=verdict,
        proposed=dict(V1, version="2"),
        gates=[{"name": "validate", "ok": True, "detail": "ok"}],
        held_out={
            "key": "ab12",
            "scenarios": 27,
            "read": 1,
            "supported": 2,
            "max_bias": 0.1,
            "bias_bound": 0.0,
        },
        history=HISTORY,
    )
    folder = tmp_path / "new"
    folder.mkdir()
    written.write(folder)
    read = read_round_record(folder)
    assert read.to_json() == written.to_json() and read.format == FORMAT
    assert read.decision == verdict and read.scorecards == cards and read.history == HISTORY
    assert read.candidate_policy is not None and read.candidate_policy.version == "2"
    assert read.held_out is not None and read.held_out.sentence.startswith(
        "Held-out set `ab12` (27 scenarios) read 1 time,"
    )
    old = tmp_path / "old"
    old.mkdir()
    document = read.to_json()
    for key in ("format", "scorecards", "decision", "proposed", "history"):
        document.pop(key)
    document["held_out"].pop("sentence")
    (old / "round.json").write_text(json.dumps(document))
    (old / "scorecards.json").write_text(json.dumps([c.to_json() for c in cards]))
    (old / "policy.json").write_text(json.dumps(dict(V1, version="2")))
    migrated = read_round_record(old)
    assert migrated.format == FORMAT and migrated.scorecards == cards and migrated.decision is None
    assert migrated.held_out == read.held_out and migrated.candidate_policy == read.candidate_policy
    assert migrated.to_json() | {"decision": None, "history": None} == read.to_json() | {
        "decision": None,
        "history": None,
    }
