"""Held-out reuse: how many rounds a held-out set supports, and how far reuse may bias its pass rates.

A round that applies the promotion rule reads the held-out split: the candidate's held-out runs decide
whether it is promoted, and that decision shapes every later round (which policy is the next baseline,
which causes are skipped). After a few rounds the loop is an adaptive analyst of the held-out set, and
the held-out pass rates a round shows (its baseline's and its candidate's) are no longer unbiased
estimates of the pass rates on new scenarios of the same kind.

The rule (docs/contracts.md, held-out reuse) rests on the information-theoretic generalization bound
(Russo & Zou 2016; Xu & Raginsky 2017): when the policies a round compares depend on the held-out set S
only through I(S; history) nats, the expected gap between the held-out mean of a per-scenario score in
[0, 1] (sub-Gaussian with sigma = 1/2, so the mean of n has sigma^2 = 1/(4n)) and its true mean is at
most sqrt(2 sigma^2 I) = sqrt(I / (2n)). A round's read reveals at most one bit (ln 2 nats) to later
rounds, the promotion decision, so the numbers of the r-th read of a set of n held-out scenarios were
produced by policies chosen with at most r - 1 bits of it:

    bias(r) <= sqrt((r - 1) * ln 2 / (2n))          (the first read is of a fresh set: 0)

The set supports the reads that keep this at or below epsilon (`[objective] held_out_bias`, 0.1 by
default: ten points of pass rate):

    r <= 1 + floor(2 * n * epsilon^2 / ln 2)        (epsilon = 0.1: n = 35 supports 2 reads, 104 support 4)

It is the order of the naive holdout's known failure too (Blum & Hardt 2015: k adaptive queries can bias
it by about sqrt(k / n)). The bound is a worst case for a loop that learns one bit per read; a person who
reads the printed held-out scores and changes course because of them learns more, and it is then
optimistic. Past the budget the count does not stop a round: it warns, and says how to fix it (fresh
held-out scenarios start a new count; the sealed test split gives one unbiased final number).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from improve.evals.scenarios import Scenario
from improve.machine import canonical_json

LN2 = math.log(2)


def set_key(scenarios: Iterable[Scenario]) -> str:
    """A scenario set's key: the first 12 hex digits of the sha256 of its scenarios (ids and content,
    in id order). Adding, removing or editing a scenario makes another key, so reads are counted per set."""
    content = sorted((s.model_dump(mode="json", exclude_none=True) for s in scenarios), key=lambda s: s["id"])
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()[:12]


def bias_bound(earlier_reads: int, scenarios: int) -> float:
    """sqrt(b ln 2 / (2n)): the most b one-bit reads of n scenarios can bias a [0, 1] mean (capped at 1)."""
    if earlier_reads <= 0:
        return 0.0
    if scenarios <= 0:
        return 1.0
    return min(1.0, math.sqrt(earlier_reads * LN2 / (2 * scenarios)))


def supported_reads(scenarios: int, max_bias: float) -> int:
    """1 + floor(2 n eps^2 / ln 2): the reads of n scenarios whose numbers stay within eps of unbiased."""
    return 1 + math.floor(2 * scenarios * max_bias**2 / LN2)


def scenarios_needed(reads: int, max_bias: float) -> int:
    """ceil((r - 1) ln 2 / (2 eps^2)): the held-out scenarios that support r reads at eps."""
    return max(1, math.ceil((reads - 1) * LN2 / (2 * max_bias**2)))


@dataclass(frozen=True)
class HeldOutRead:
    """One round's read of a held-out set: which read it is, and what the set supports."""

    key: str
    """The held-out set's key (`set_key`): reads are counted per key, so a changed set starts at 1."""
    scenarios: int
    read: int
    """Which read of this set the round is (1 for the first), counting the reads the CHANGELOG records."""
    max_bias: float
    """epsilon, `[objective] held_out_bias`."""

    @property
    def supported(self) -> int:
        return supported_reads(self.scenarios, self.max_bias)

    @property
    def bias_bound(self) -> float:
        """How far the earlier reads may bias the held-out pass rates this round shows."""
        return bias_bound(self.read - 1, self.scenarios)

    @property
    def over(self) -> bool:
        return self.read > self.supported

    def warning(self) -> str | None:
        """Past what the set supports: what it means and how to fix it; None within it."""
        if not self.over:
            return None
        return (
            f"held-out set `{self.key}` ({self.scenarios} scenarios) has been read by {self.read} rounds, more "
            f"than the {self.supported} it supports at held_out_bias = {self.max_bias:g} (reads <= 1 + "
            f"floor(2 n eps^2 / ln 2)): the decisions of the {self.read - 1} earlier rounds (promoted or not) "
            f"may bias the held-out pass rates this round compares by up to sqrt((r - 1) ln 2 / (2n)) = "
            f"{self.bias_bound:.3f} (r = {self.read}, n = {self.scenarios}). Add "
            f"fresh held-out scenarios ({scenarios_needed(self.read, self.max_bias)} support {self.read} "
            f"reads; a changed held-out set starts a new count), or label a sealed `split: test` set and "
            f"score the final policy once with `improve score --split test --unseal`"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenarios": self.scenarios,
            "read": self.read,
            "supported": self.supported,
            "max_bias": self.max_bias,
            "bias_bound": round(self.bias_bound, 6),
            "warning": self.warning(),
        }
