"""Held-out reads, counted in the policies' CHANGELOG (the rule is in `improve.evals.holdout`).

An entry whose candidate was decided on held-out has one line saying which read of the held-out set
its round was:

    - Held-out set `5f0c2a9e13b7` (27 scenarios) read 3 times, this round included; ...

The count is read back from the CHANGELOG itself, so it survives across rounds and travels with the
policies through review, and it is per set: the key is a hash of the held-out scenarios, so changing
the held-out set (adding, removing or editing one) starts a new count (docs/contracts.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from improve.evals import HeldOutRead, Scenario, set_key

HELD_OUT_READ = re.compile(r"^- Held-out set `([0-9a-f]+)` \(\d+ scenarios\) read (\d+) times?\b", re.M)
"""The line of an entry that records its round's read of a held-out set (`held_out_sentence`)."""


def held_out_sentence(held_out: dict[str, Any]) -> str:
    """`Held-out set `KEY` (27 scenarios) read 3 times, ...`: which read a round was, and the bound."""
    return (
        f"Held-out set `{held_out['key']}` ({held_out['scenarios']} scenarios) read {held_out['read']} "
        f"{'time' if held_out['read'] == 1 else 'times'}, "
        f"this round included; it supports {held_out['supported']} at held_out_bias = {held_out['max_bias']:g} "
        f"(reads <= 1 + floor(2 n eps^2 / ln 2)), and the earlier reads may bias this round's held-out pass "
        f"rates by up to sqrt((r - 1) ln 2 / (2n)) = {held_out['bias_bound']:.3f}."
    )


def held_out_lines(record: dict[str, Any]) -> list[str]:
    """The CHANGELOG lines of a round record's held-out read: the count, and the warning past the budget."""
    held_out = record.get("held_out")
    if not held_out:
        return []
    lines = [f"- {held_out_sentence(held_out)}"]
    if held_out.get("warning"):
        lines.append(f"- **Held-out reuse warning**: {held_out['warning']}.")
    return lines


def held_out_reads(text: str, key: str) -> int:
    """How many rounds a CHANGELOG's text records as reads of the held-out set `key`: its entries that
    say so, or the highest count one of them states when that is larger (an entry lost with a branch
    nobody merged, or edited away, never lowers the count below a number already written)."""
    numbers = [int(number) for found, number in HELD_OUT_READ.findall(text) if found == key]
    return max(len(numbers), max(numbers, default=0))


def next_held_out_read(changelog: Path, held_out: Sequence[Scenario], max_bias: float) -> HeldOutRead:
    """The read a round that decides on `held_out` makes: one more than the CHANGELOG records for the set."""
    key = set_key(held_out)
    text = changelog.read_text(encoding="utf-8") if changelog.exists() else ""
    return HeldOutRead(key, len(held_out), held_out_reads(text, key) + 1, max_bias)


def held_out_status(changelog: Path, held_out: Sequence[Scenario], max_bias: float) -> dict[str, Any]:
    """Where the held-out set stands for `improve score`: the rounds that have read it, what it supports,
    and how far those reads may bias the held-out pass rates of the policies they chose."""
    upcoming = next_held_out_read(changelog, held_out, max_bias)
    reads = upcoming.read - 1
    # A policy chosen after r reads carries r bits, as the numbers of the (r + 1)-th read do.
    warning = (
        f"held-out set `{upcoming.key}` ({upcoming.scenarios} scenarios) has been read by {reads} rounds "
        f"({changelog}); its held-out pass rates may be biased by up to sqrt(r ln 2 / (2n)) = "
        f"{upcoming.bias_bound:.3f}, more than held_out_bias = {max_bias:g}: read the test split "
        "(`--split test --unseal`) or fresh held-out scenarios for a number no round has adapted to"
        if upcoming.bias_bound > max_bias
        else None
    )
    return {
        "key": upcoming.key,
        "scenarios": upcoming.scenarios,
        "reads": reads,
        "supported": upcoming.supported,
        "max_bias": max_bias,
        "bias_bound": round(upcoming.bias_bound, 6),
        "warning": warning,
    }
