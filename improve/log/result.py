"""What a replay gives: the state a thread folds to, how the run ended, and what it cost.

Kept apart from `replay.py`, which the build compiles (`improve.native`): a compiled module's classes are
native ones, and `result_of` builds a `ReplayResult` as a plain Python object, without its `__init__`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from improve.machine import Snapshot

RunStatus = str
"""How a run ended: `done` (a final state), `waiting` (in a waiting state nobody answered: resumable;
a state may name it `checkpointed` or `blocked_ask` in `meta.status`), `budget` (model calls ran out),
`decision-exhausted` (every retry refused and no `onError`), `error` (an actor failed with no
`onError`), `incomplete` (the thread stops while an actor is owed). Threads written before runs could
be resumed say `idle` where they stopped waiting; it reads as the waiting state's status."""

Verified = Literal["verified", "unchained", "incomplete", "unverified"]
"""How a replay was verified:

- `verified`: a chained thread (schemaVersion 2): every entryHash and the chain checked, every state
  hash matched, and its `@agent.end` entry is there (and agrees with the status replay derives).
- `unchained`: a schemaVersion 1 thread: the state hashes it carries matched; nothing covers the rest
  of its content (effects, usage, attempts), and a removed last entry cannot be told.
- `incomplete`: the chain and the state hashes check, but the end entry is missing: the run stopped
  before it ended (a crash, a kill), or its last entries were removed. Not verified.
- `unverified`: replayed with `verify=False`: nothing was checked but the log's shape.
"""


@dataclass(frozen=True)
class ReplayResult:
    """The state a thread folds to, and what it cost."""

    snapshot: Snapshot
    status: RunStatus
    entries: int
    steps: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    failed_attempts: int
    stamp: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    """The journaled cost of the model calls (`costUsd` of usage entries; 0 when none is priced)."""
    verification: Verified = "unverified"
    """What `verify` established about the thread (see `Verified`)."""
    ended: RunStatus | None = None
    """The status the thread's last `@agent.end` entry records (None when it has none, or is version 1)."""
    budget_left: int | None = None
    """Model calls the budget in force at the end still allows (None when the thread states no budget)."""
    decisions: int = 0
    """Decisions a model was asked (at least one usage entry before the decision landed)."""
    fallbacks: int = 0
    """Of those, the decisions where a model call failed (the endpoint), so the policy's onError answered."""
    fallback_reason: str | None = None
    """The first failed call's error, as journaled on its usage entry."""

    @property
    def final_state(self) -> str:
        built = self.__dict__.get("snapshot")
        if built is not None:
            return str(built.value)
        return str(self.__dict__[_PENDING][1].value)

    def __getattr__(self, name: str) -> Any:
        # Only a missing attribute comes here: `snapshot`, when replay left it to be built (`result_of`).
        pending = self.__dict__.get(_PENDING) if name == "snapshot" else None
        if pending is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        fold, run = pending
        snapshot = fold.snapshot(run)
        self.__dict__["snapshot"] = snapshot
        del self.__dict__[_PENDING]
        return snapshot

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle holds the snapshot itself, never the fold's run it is built from.
        self.snapshot  # noqa: B018  (built, if it was not yet)
        return self.__dict__

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


_PENDING = "_snapshot_of"
"""Where a `ReplayResult` keeps the fold and the run its `snapshot` is built from, until it is read."""


def result_of(fields: dict[str, Any], fold: Any = None, run: Any = None) -> ReplayResult:
    """A `ReplayResult` of every field, built without the frozen dataclass's `__init__`, which sets each
    of its sixteen fields through `object.__setattr__`: a tenth of replaying a short thread. `fields`
    becomes its `__dict__` (a dict display, not keywords: packing sixteen keywords cost as much again).
    It is as frozen as any other (tests/test_replay.py checks that every field is given, and nothing else).

    Without `snapshot` in `fields`, `fold` and `run` (a `Fold` and the `FoldRun` replay ended with) build it
    when it is first read: a replay whose result is read for its status and counts (most of `improve
    replay`, a warehouse's materializing) never builds one, which was a fifth of replaying a short thread."""
    if "snapshot" not in fields:
        fields[_PENDING] = (fold, run)
    result = object.__new__(ReplayResult)
    object.__setattr__(result, "__dict__", fields)
    return result
