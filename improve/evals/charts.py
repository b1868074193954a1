"""The two pictures a reviewer reads before the tables: pass rate per policy version across rounds
(train and held-out), and pass rate per scenario category before and after a change.

Each is a `Chart` (plain data), drawn two ways: as a Mermaid `xychart-beta` block that GitHub renders
in a PR body or a pasted scorecard (`mermaid_xychart`), and as inline SVG for the self-contained HTML
report (`svg_chart`), which must not load mermaid.js or anything else at view time.

Mermaid's xychart draws two `bar` series of one chart on top of each other in the versions GitHub
runs (and names series only in a legend those versions lack), so there "before" is a line over
"after"'s bars and the caption under each chart says which colour or mark is which; the SVG groups
the bars side by side and draws its own legend. Every label (category
names and version labels come from user files) is passed through `mermaid_label` or HTML-escaped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Literal

from improve.evals.scorecards import Scorecard
from improve.machine import mermaid_label

LABEL_MAX = 32
"""Axis labels longer than this are cut (with an ellipsis): a chart is read at a glance."""

HORIZONTAL_FROM = 4
"""More categories than this and the Mermaid chart is drawn horizontally."""

BLUE, ORANGE = "#2563eb", "#ea580c"
COLOUR_NAMES = {BLUE: "blue", ORANGE: "orange"}


@dataclass(frozen=True)
class VersionScore:
    """One policy version's pass rates, as the round that last measured it recorded them."""

    version: str
    train: float
    held_out: float
    round_id: str | None = None
    held_out_set: str | None = None
    """The key of the held-out set that round read (`evals.set_key`), when its CHANGELOG entry says."""


@dataclass(frozen=True)
class Series:
    name: str
    kind: Literal["line", "bar"]
    values: tuple[float, ...]
    colour: str


@dataclass(frozen=True)
class Chart:
    title: str
    x_title: str
    x_labels: tuple[str, ...]
    series: tuple[Series, ...]
    caption: str
    y_title: str = "pass rate"
    horizontal: bool = False
    """Mermaid draws the categories down the side: many category names side by side overlap."""


def history_chart(history: Sequence[VersionScore]) -> Chart | None:
    """Pass rate per policy version, oldest first, train and held-out as two lines; None for fewer
    than two versions (one point is a number, not a trend)."""
    if len(history) < 2:
        return None
    caption = (
        "Each version as the latest round on the same model that measured it recorded it (the "
        "policies' CHANGELOG), along the line of versions that led here."
    )
    sets = list(dict.fromkeys(p.held_out_set for p in history if p.held_out_set))
    if len(sets) > 1:
        # Scenarios added between rounds move the figures as much as a policy does (a user read a drop
        # from v3 to v4 that was the new scenarios').
        measured = ", ".join(
            f"`{key}`: {', '.join(p.version for p in history if p.held_out_set == key)}" for key in sets
        )
        caption += (
            f" The scenarios changed along the line ({len(sets)} held-out sets; {measured}): between "
            "versions measured on different sets, a rise or a fall may be the scenarios', not the policy's."
        )
    return Chart(
        title="Pass rate by policy version",
        x_title="policy version",
        x_labels=tuple(p.version for p in history),
        series=(
            Series("train", "line", tuple(p.train for p in history), BLUE),
            Series("held-out", "line", tuple(p.held_out for p in history), ORANGE),
        ),
        caption=caption,
    )


def category_chart(cards: Sequence[Scorecard]) -> Chart | None:
    """Pass rate per scenario category (train and held-out together: the mean of the pass fractions of
    its scenarios), the first version of `cards` ("before") beside the last ("after"), bars side by
    side; one version alone is one bar per category. None when the cards hold no scenario."""
    versions = list(dict.fromkeys(c.policy_version for c in cards))
    if not versions:
        return None
    rates = [_by_category([c for c in cards if c.policy_version == v]) for v in versions]
    if len(versions) == 1:
        categories = sorted(rates[0])
        if not categories:
            return None
        return Chart(
            title=f"Pass rate by category, {versions[0]}",
            x_title="category",
            x_labels=tuple(categories),
            series=(Series(versions[0], "bar", tuple(rates[0][c] for c in categories), BLUE),),
            horizontal=len(categories) > HORIZONTAL_FROM,
            caption="The mean pass fraction of the category's scenarios, train and held-out together.",
        )
    before, after = rates[0], rates[-1]
    # Only categories measured on both sides are compared; a scenario scored on one side only would
    # read as a change.
    categories = sorted(set(before) & set(after))
    if not categories:
        return None
    left_out = sorted(set(before) ^ set(after))
    return Chart(
        title=f"Pass rate by category, {versions[0]} and {versions[-1]}",
        x_title="category",
        x_labels=tuple(categories),
        series=(
            Series(f"before ({versions[0]})", "bar", tuple(before[c] for c in categories), ORANGE),
            Series(f"after ({versions[-1]})", "bar", tuple(after[c] for c in categories), BLUE),
        ),
        horizontal=len(categories) > HORIZONTAL_FROM,
        caption="The mean pass fraction of the category's scenarios, train and held-out together"
        + (f"; measured on one side only, left out: {', '.join(left_out)}" if left_out else "")
        + ".",
    )


def _by_category(cards: Sequence[Scorecard]) -> dict[str, float]:
    fractions: dict[str, list[float]] = {}
    for card in cards:
        for s in card.scenarios:
            fractions.setdefault(s.category, []).append(s.pass_fraction)
    return {c: sum(v) / len(v) for c, v in fractions.items()}


# --- Mermaid --------------------------------------------------------------------------------------


def _short(text: str, limit: int = LABEL_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def chart_labels(labels: Sequence[str]) -> list[str]:
    """Axis labels as drawn: one line, shortened, and unique (two labels cut to the same text would be
    one category to the chart, so later ones get ` (2)`, ` (3)`)."""
    seen: set[str] = set()
    out = []
    for label in labels:
        base = _short(label) or "(none)"
        text, n = base, 2
        while text in seen:
            text, n = f"{base} ({n})", n + 1
        seen.add(text)
        out.append(text)
    return out


def _quoted(text: str) -> str:
    # xychart's quoted strings have no escape for `"`: `mermaid_label` turns it (and the other
    # characters Mermaid reads as syntax or entity codes) into entity codes Mermaid decodes when drawing.
    return '"' + mermaid_label(text) + '"'


def mermaid_series(chart: Chart) -> list[Series]:
    """The series as `mermaid_xychart` draws them: bars first, so lines are drawn over them."""
    return [s for s in chart.series if s.kind == "bar"] + [s for s in chart.series if s.kind == "line"]


def _tag(name: str) -> str:
    """A series' short name for an axis label: "before (v1)" -> "v1"."""
    found = re.search(r"\(([^()]+)\)\s*$", name)
    return found[1] if found else name


def mermaid_layout(chart: Chart) -> tuple[list[str], list[Series]]:
    """The axis labels and series as Mermaid draws them. GitHub's Mermaid puts a chart's bar series on
    top of each other in one slot (the smaller hidden), and a line across categories would read as an
    order they do not have; so with several bar series each category gets a slot per series (`small ·
    v1`, `small · v2`), each series a bar in its own slots and zero in the others'."""
    series = mermaid_series(chart)
    bars = [s for s in series if s.kind == "bar"]
    if len(bars) < 2:
        return chart_labels(chart.x_labels), series
    # The category is shortened, never the series' tag: two slots of one category must stay told apart.
    labels = [
        f"{_short(x, LABEL_MAX - len(_tag(b.name)) - 3)} · {_tag(b.name)}"
        for x in chart.x_labels
        for b in bars
    ]
    spread = [
        Series(
            s.name,
            s.kind,
            tuple(value if s.kind == "line" or s is b else 0.0 for value in s.values for b in bars),
            s.colour,
        )
        for s in series
    ]
    return chart_labels(labels), spread


def how_to_read(series: Sequence[Series]) -> str:
    """The legend as a sentence ("Bars: before (v2) in orange, after (v3) in blue."): GitHub's
    Mermaid draws no legend."""
    parts = []
    for kind in ("bar", "line"):
        named = [f"{s.name} in {COLOUR_NAMES.get(s.colour, s.colour)}" for s in series if s.kind == kind]
        if named:
            word = kind + ("s" if len(named) > 1 or kind == "bar" else "")
            parts.append(f"{word}: {', '.join(named)}")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."


def mermaid_xychart(chart: Chart) -> str:
    """The chart as a Mermaid `xychart-beta` block's body, colours fixed so the caption holds."""
    labels, series = mermaid_layout(chart)
    palette = ", ".join(s.colour for s in series)
    lines = [
        '%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "' + palette + '"}}}}%%',
        "xychart-beta horizontal" if chart.horizontal else "xychart-beta",
        f"    title {_quoted(chart.title)}",
        f"    x-axis {_quoted(chart.x_title)} [{', '.join(_quoted(x) for x in labels)}]",
        f"    y-axis {_quoted(chart.y_title)} 0 --> 1",
    ]
    for s in series:
        lines.append(f"    {s.kind} {_quoted(s.name)} [{', '.join(f'{v:.3f}' for v in s.values)}]")
    return "\n".join(lines) + "\n"


def chart_markdown(chart: Chart) -> list[str]:
    """A fenced ```mermaid block and its caption, as markdown lines."""
    caption = how_to_read(mermaid_series(chart)) + " " + chart.caption
    return ["```mermaid", mermaid_xychart(chart).rstrip("\n"), "```", "", caption, ""]


# --- SVG ------------------------------------------------------------------------------------------

_W, _H = 720, 340
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 16, 64, 84
_SLANT_PX = 6.1
"""How far left of its tick a slanted tick label reaches per character (7 px wide, at -30 degrees)."""


def svg_chart(chart: Chart) -> str:
    """The chart as inline SVG (no script, no external reference), with a legend; text HTML-escaped."""
    labels = chart_labels(chart.x_labels)
    n = len(labels)
    plot_h = _H - _TOP - _BOTTOM
    band = (_W - _LEFT - _RIGHT) / max(n, 1)
    rotate = n > 6 or max((len(x) for x in labels), default=0) * 7 > band
    left = _LEFT
    if rotate:
        # A label slanted at -30 degrees runs left of its tick by about 6 px a character: the first
        # ones must not be cut off at the chart's left edge, so the plot starts far enough right.
        reach = max((len(x) * _SLANT_PX - band * (i + 0.5) for i, x in enumerate(labels)), default=0.0)
        left = int(min(max(_LEFT, reach + 8), _W / 3))
        band = (_W - left - _RIGHT) / max(n, 1)

    def x_at(i: int) -> float:
        return left + band * (i + 0.5)

    def y_at(v: float) -> float:
        return _TOP + plot_h * (1 - max(0.0, min(1.0, v)))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'role="img" aria-label="{escape(chart.title)}">',
        f'<text x="{_W / 2:.0f}" y="22" text-anchor="middle" class="chart-title">{escape(chart.title)}</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = y_at(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick:g}</text>')
    parts.append(
        f'<text x="14" y="{_TOP + plot_h / 2:.0f}" transform="rotate(-90 14 {_TOP + plot_h / 2:.0f})" '
        f'text-anchor="middle" class="axis">{escape(chart.y_title)}</text>'
    )
    for i, label in enumerate(labels):
        x, y = x_at(i), _TOP + plot_h + 16
        anchor = (
            f'text-anchor="end" transform="rotate(-30 {x:.1f} {y:.1f})"' if rotate else 'text-anchor="middle"'
        )
        parts.append(f'<text x="{x:.1f}" y="{y:.1f}" {anchor} class="tick">{escape(label)}</text>')
    bars = [s for s in chart.series if s.kind == "bar"]
    width = band * 0.7 / max(len(bars), 1)
    for s in chart.series:
        colour = s.colour
        if s.kind == "bar":
            slot = bars.index(s)
            for i, v in enumerate(s.values):
                x0 = x_at(i) - band * 0.35 + slot * width
                # A zero is a sliver on the axis, not nothing: "none passed" must not read as "not measured".
                top = min(y_at(v), y_at(0) - 2)
                parts.append(
                    f'<rect x="{x0:.1f}" y="{top:.1f}" width="{width:.1f}" height="{y_at(0) - top:.1f}" '
                    f'fill="{colour}" fill-opacity="0.85"><title>{escape(s.name)} {escape(labels[i])}: '
                    f"{v:.3f}</title></rect>"
                )
        else:
            points = " ".join(f"{x_at(i):.1f},{y_at(v):.1f}" for i, v in enumerate(s.values))
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
            for i, v in enumerate(s.values):
                parts.append(
                    f'<circle cx="{x_at(i):.1f}" cy="{y_at(v):.1f}" r="4" fill="{colour}"><title>'
                    f"{escape(s.name)} {escape(labels[i])}: {v:.3f}</title></circle>"
                )
    legend_x = left
    for s in chart.series:
        colour = s.colour
        mark = (
            f'<rect x="{legend_x}" y="36" width="14" height="10" fill="{colour}"/>'
            if s.kind == "bar"
            else f'<line x1="{legend_x}" y1="41" x2="{legend_x + 14}" y2="41" stroke="{colour}" stroke-width="3"/>'
        )
        parts.append(mark + f'<text x="{legend_x + 20}" y="46" class="legend">{escape(s.name)}</text>')
        legend_x += 40 + 8 * len(s.name)
    parts.append("</svg>")
    return "\n".join(parts)
