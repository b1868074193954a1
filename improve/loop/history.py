"""A policy's history as the CHANGELOG records it: the versions that led to it and their pass rates,
for the chart of pass rate per version (`improve.evals.charts.history_chart`).

The CHANGELOG is the record that travels with the policies (report folders are not committed), so
the history is read from its entries: each names its candidate, its baseline and, when the promotion
rule ran, each split's pass rate before and after. The line of versions is followed backwards from the
head through the baselines of the entries that proposed them, so discarded candidates and unmerged
branches stay off it. Each version gets the pass rates of the newest round that measured it, so the
last two points are always one round's own measurement of both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from improve.evals import VersionScore
from improve.loop.changelog import BASELINE, ENTRY

_SCORE = re.compile(
    r"^- (?P<split>train|held-out): (?P<before>\d+(?:\.\d+)?) -> (?P<after>\d+(?:\.\d+)?)\b", re.M
)


@dataclass(frozen=True)
class Measured:
    """One round as its CHANGELOG entry records it."""

    candidate: str
    baseline: str
    round_id: str
    recommended: bool
    before: dict[str, float]
    after: dict[str, float]


def read_entries(changelog: Path) -> list[Measured]:
    """Every entry of the CHANGELOG with a baseline, oldest first (a missing file has none)."""
    if not changelog.is_file():
        return []
    text = changelog.read_text(encoding="utf-8")
    heads = list(ENTRY.finditer(text))
    found = []
    for index, head in enumerate(heads):
        end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
        body = text[head.end() : end]
        baseline = BASELINE.search(body)
        if baseline is None:
            continue
        scores = {m["split"]: (float(m["before"]), float(m["after"])) for m in _SCORE.finditer(body)}
        found.append(
            Measured(
                candidate=head["version"],
                baseline=baseline["baseline"].strip(),
                round_id=head["round"],
                recommended=head["decision"] == "recommended",
                before={split: pair[0] for split, pair in scores.items()},
                after={split: pair[1] for split, pair in scores.items()},
            )
        )
    return found


def measured_from_record(record: dict[str, Any]) -> Measured | None:
    """The round being recorded (`RoundResult.to_json()`), before its entry is in the CHANGELOG."""
    scores = record.get("scores") or {}
    if not record.get("candidate_version") or not scores:
        return None
    return Measured(
        candidate=str(record["candidate_version"]),
        baseline=str(record["baseline_version"]),
        round_id=str(record["round_id"]),
        recommended=bool(record.get("recommended")),
        before={split: float(s["before"]) for split, s in scores.items()},
        after={split: float(s["after"]) for split, s in scores.items()},
    )


def policy_history(entries: list[Measured], head: str, current: Measured | None = None) -> list[VersionScore]:
    """The versions that led to `head` (itself last) with their pass rates, oldest first.

    `current` is the round being recorded (its candidate is `head`); without it the head's newest entry
    starts the walk. A version proposed by a recommended entry leads back to that entry's baseline; the
    walk stops at a version no recommended entry proposed (v0, a policy written by hand) or at a loop.
    """
    start = current or next((e for e in entries[::-1] if e.candidate == head), None)
    if start is None:
        return []
    rates: dict[str, tuple[float, float, str]] = {}

    def note(version: str, scores: dict[str, float], round_id: str) -> None:
        if version not in rates and "train" in scores and "held-out" in scores:
            rates[version] = (scores["train"], scores["held-out"], round_id)

    chain = [start.candidate]
    step: Measured | None = start
    while step is not None:
        note(step.candidate, step.after, step.round_id)
        note(step.baseline, step.before, step.round_id)
        if step.baseline in chain:
            break
        baseline = step.baseline
        chain.append(baseline)
        step = next((e for e in entries[::-1] if e.recommended and e.candidate == baseline), None)
    return [VersionScore(v, *rates[v]) for v in reversed(chain) if v in rates]
