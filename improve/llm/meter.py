"""What the model calls of one command spent: calls, tokens, USD, retries; and its spend limit."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class Meter:
    """Counts every model call a command makes, live or replayed, across threads."""

    limit_usd: float | None = None
    """Stop starting new runs once this much is spent (`--max-usd`); None: no limit."""
    live: int = 0
    """Calls sent to an endpoint (failed ones included)."""
    recorded: int = 0
    """Calls answered from responses recorded before this command (`--cache replay`, or `record`)."""
    repeated: int = 0
    """Calls this command had already made, asked again (a counterfactual run repeating a run's first
    calls): answered from this command's own recording."""
    reused: int = 0
    """Calls answered by the same request's recorded answer in the run a run started from (replay-first):
    no model and no recording was asked, and they are not among `calls`."""
    failed: int = 0
    reasked: int = 0
    """Requests sent again another way, after the endpoint refused or ignored a way of asking (not
    retries: each was answered)."""
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    priced: bool = False
    """Whether any call had a price (otherwise USD is unknown, not zero)."""
    fingerprints: set[str] = field(default_factory=set)
    """The endpoints' `system_fingerprint`s the calls reported (which build of the model answered)."""
    say: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    """Where a note goes as it is learned (the CLI's stderr); notes are kept either way."""
    notes: list[str] = field(default_factory=list)
    """What the command learned about its endpoints, each said once: `smollm2: the endpoint ignored tools
    (HTTP 200, no tool call); asking by json_schema`."""
    _retries: list[Callable[[], int]] = field(default_factory=list, repr=False)
    _retries_elsewhere: int = field(default=0, repr=False)
    """Retries counted by meters of other processes (workers of a cluster), absorbed here."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, text: str, *, loud: bool = True) -> None:
        """Keep `text` and say it, the first time only; `loud` False: keep it only (the command said it
        already, through another meter: each round of `--rounds` has its own)."""
        with self._lock:
            if text in self.notes:
                return
            self.notes.append(text)
        if self.say is not None and loud:
            self.say(text)

    def watch(self, retries: Callable[[], int]) -> None:
        """Count an endpoint's retries (`Endpoint.retries`: each call's HTTP attempts past its first, as
        the call ends, so the count never goes down)."""
        with self._lock:
            self._retries.append(retries)

    def add(
        self,
        *,
        source: Literal["live", "recorded", "repeated"],
        input_tokens: int,
        output_tokens: int,
        usd: float | None,
    ) -> None:
        with self._lock:
            if source == "live":
                self.live += 1
            elif source == "recorded":
                self.recorded += 1
            else:
                self.repeated += 1
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            if usd is not None:
                self.usd += usd
                self.priced = True

    def reuse(self, calls: int) -> None:
        with self._lock:
            self.reused += calls

    def reask(self) -> None:
        with self._lock:
            self.reasked += 1

    def fail(self) -> None:
        with self._lock:
            self.live += 1
            self.failed += 1

    def absorb(self, counts: dict[str, Any], fingerprints: Iterable[str] = ()) -> None:
        """Add another process's meter (its `to_json()` and fingerprints): the calls a worker of a
        cluster made."""
        for text in counts.get("notes") or []:
            self.note(str(text))
        with self._lock:
            self.fingerprints.update(fingerprints)
            self.live += int(counts.get("live") or 0)
            self.recorded += int(counts.get("recorded") or 0)
            self.repeated += int(counts.get("repeated") or 0)
            self.reused += int(counts.get("reused") or 0)
            self.failed += int(counts.get("failed") or 0)
            self.reasked += int(counts.get("reasked") or 0)
            self.input_tokens += int(counts.get("input_tokens") or 0)
            self.output_tokens += int(counts.get("output_tokens") or 0)
            self._retries_elsewhere += int(counts.get("retries") or 0)
            if counts.get("usd") is not None:
                self.usd += float(counts["usd"])
                self.priced = True

    @property
    def retries(self) -> int:
        """HTTP requests sent again after a failed attempt, this process's and its workers': a count that
        only grows (a call still in flight is no retry)."""
        return sum(count() for count in self._retries) + self._retries_elsewhere

    @property
    def calls(self) -> int:
        return self.live + self.recorded + self.repeated

    @property
    def mixed(self) -> bool:
        """Some answers came from earlier recordings and some from the endpoint now."""
        return self.live > 0 and self.recorded > 0

    def over_limit(self) -> bool:
        return self.limit_usd is not None and self.usd >= self.limit_usd

    def summary(self) -> str:
        """`model calls 120 (8 recorded), tokens 53,211, $0.0213, retries 2, failed 0`; with `, 300
        answers reused` after the calls when replay-first runs took recorded answers."""
        cost = f"${usd_text(self.usd)}" if self.priced else "USD unknown (no price)"
        recorded = f" ({self.recorded} recorded)" if self.recorded else ""
        reused = f", {self.reused} answers reused" if self.reused else ""
        return (
            f"model calls {self.calls}{recorded}{reused}, tokens {self.input_tokens + self.output_tokens:,}, {cost}, "
            f"retries {self.retries}, failed {self.failed}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "live": self.live,
            "recorded": self.recorded,
            "repeated": self.repeated,
            "reused": self.reused,
            "failed": self.failed,
            "reasked": self.reasked,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "usd": round(self.usd, 9) if self.priced else None,
            "retries": self.retries,
            "limit_usd": self.limit_usd,
            "notes": list(self.notes),
        }


def usd_text(value: float) -> str:
    """An amount of USD as a person reads it: four decimals (0.0213), and two significant digits below a
    cent, where four decimals showed a small model's 0.000048 a thread as 0.0000."""
    if value == 0 or abs(value) >= 0.01:
        return f"{value:.4f}"
    return f"{value:.2g}"
