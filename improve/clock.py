"""The one clock: every instant the product writes is read here.

Journal entries (`recordedAt`), round ids, unsealing records, lake manifests and the warehouse's own
bookkeeping (`ingest_batches`, `rejected_lines`, `schema_migrations`, `quarantine`) all take their "now"
from `now()`, so a test freezes one thing (`frozen`) and every stamp the product writes follows it.
Durations (a command's seconds, a lock's deadline) are not instants and keep `time.monotonic`.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FrozenClock", "frozen", "now", "rfc3339"]


class FrozenClock:
    """A clock that stands at `at` and moves only by `step` per reading (and by `advance`), so a run's
    entries keep distinct, increasing stamps while every value stays a function of the test."""

    def __init__(self, at: dt.datetime, step: dt.timedelta) -> None:
        if at.tzinfo is None:
            raise ValueError(f"a frozen clock needs an aware datetime (with a time zone), got {at!r}")
        if step < dt.timedelta(0):
            raise ValueError(f"a frozen clock cannot step backwards, got step {step}")
        self._at = at.astimezone(dt.UTC)
        self._step = step
        self._lock = threading.Lock()  # runs of a suite read the clock from several threads

    def __call__(self) -> dt.datetime:
        with self._lock:
            at = self._at
            self._at += self._step
            return at

    def advance(self, by: dt.timedelta) -> None:
        with self._lock:
            self._at += by

    def peek(self) -> dt.datetime:
        """The instant the next reading returns, without moving the clock."""
        with self._lock:
            return self._at


_frozen: FrozenClock | None = None


def now() -> dt.datetime:
    """The current instant, in UTC (aware)."""
    clock = _frozen
    return clock() if clock is not None else dt.datetime.now(dt.UTC)


def rfc3339(at: dt.datetime | None = None) -> str:
    """`at` (default: now) as RFC 3339 in UTC with microseconds, the form of a journal's `recordedAt`."""
    moment = at or now()
    if moment.tzinfo is not dt.UTC:  # the clock's own instants are UTC already: no conversion to make
        moment = moment.astimezone(dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


@contextmanager
def frozen(at: dt.datetime | str, step: dt.timedelta = dt.timedelta(milliseconds=1)) -> Iterator[FrozenClock]:
    """Freeze the clock at `at` (an aware datetime or an RFC 3339 string) for the block; each reading
    then moves it on by `step`. Blocks nest; the outer clock comes back on exit."""
    global _frozen
    start = dt.datetime.fromisoformat(at.replace("Z", "+00:00")) if isinstance(at, str) else at
    clock = FrozenClock(start, step)
    previous, _frozen = _frozen, clock
    try:
        yield clock
    finally:
        _frozen = previous
