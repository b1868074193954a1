"""Replay: a pure fold of a thread's entries through the machine that recorded it.

No actor, model or person is called: their answers come from the log. The log is validated first
(contiguous indices from 0, `@agent.init` first, one machine id, the replaying machine's version, an
`@agent.end` only last, or followed by the event that resumed a run that stopped waiting).
`@agent.usage` and `@agent.end` entries are journal records, not events: they are counted, never
folded. A resumed thread's model calls count against each stretch's own budget: the stamp's until
the first resume, then each resume's `maxModelCalls` (`Budget`).

With `verify=True`, a chained thread (schemaVersion 2) has its hash chain checked first (`chain.py`:
`TamperError` at the first bad entry), then every entry's `verification.stateHash` against the
snapshot replay reaches (`DivergenceError` at the first divergence), and the end entry's status
against the status replay derives. `ReplayResult.verification` says what was established. Without
`verify`, nothing is hashed: a replay costs what it did before chains existed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from improve.errors import DivergenceError, LogError, MachineError, VersionMismatchError
from improve.log.bulk import EntryView
from improve.log.chain import check_chain, is_chained
from improve.log.entry import (
    END_EVENT,
    INIT_EVENT,
    LEGACY_WAIT_STATUS,
    MAX_USAGE_COUNT,
    RESUME_KEY,
    USAGE_EVENT,
)
from improve.log.result import ReplayResult, RunStatus, Verified, result_of
from improve.machine import RESUMABLE_STATUSES, Fold, FoldRun, Machine, Snapshot, fold_of, wait_status
from improve.native import digest


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector for bulk decoding and replay.

    Decoding a large log allocates millions of small objects that form no cycles, and the collector
    rescans all of them again and again as they accumulate: decoding 127,000 entries ran 2.7x slower
    with it on. Reference counting still frees everything; one collection runs at the end.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def validate_log(machine: Machine, entries: Sequence[EntryView]) -> None:
    """Raise `LogError` (or `VersionMismatchError`) naming the first entry that breaks the rules."""
    if not entries:
        raise LogError("the thread is empty: a log starts with an @agent.init entry")
    if entries[0].type != INIT_EVENT:
        raise LogError(f"entry 0 is {entries[0].type!r}; a log starts with {INIT_EVENT!r}")
    machine_id, version = machine.id, machine.version
    thread = entries[0].threadId
    last = len(entries) - 1
    # One pass of plain comparisons; the messages are built only for the entry that fails.
    for position, entry in enumerate(entries):
        if (
            entry.index != position
            or entry.machineId != machine_id
            or entry.machineVersion != version
            or entry.threadId != thread
        ):
            _misplaced(machine, entry, position, thread)
        etype = entry.event["type"]
        if etype == INIT_EVENT and position > 0:
            raise LogError(f"entry {entry.index} is a second {INIT_EVENT!r}")
        if etype == END_EVENT and position != last:
            resumed = RESUME_KEY in (entries[position + 1].metadata or {})
            if not (resumable(entry.event.get("status")) and resumed):
                raise LogError(
                    f"entry {entry.index} is {END_EVENT!r} but {last - position} entries follow it: a run's end "
                    "entry is its last, unless the run stopped waiting and the next entry is the event that "
                    "resumed it"
                )


class _Misshapen(Exception):
    """The fold's pass found an entry `validate_log` refuses: it says which, and why."""


def _misplaced(machine: Machine, entry: EntryView, position: int, thread: str | None) -> None:
    """Raise for an entry out of place: a wrong index, machine, version or thread, checked in that order."""
    expected = f"{machine.id}@{machine.version}"
    if entry.index != position:
        raise LogError(
            f"entry at position {position} has index {entry.index}; indices must be contiguous from 0"
        )
    found = f"{entry.machineId}@{entry.machineVersion}"
    if entry.machineId != machine.id:
        raise VersionMismatchError(
            f"entry {entry.index} was recorded by machine {found}, expected {expected}: "
            "a thread is replayed by the machine that recorded it"
        )
    if entry.machineVersion != machine.version:
        raise VersionMismatchError(
            f"entry {entry.index}: version mismatch, expected {expected}, found {found}; "
            "replay it with the pinned version of the environment"
        )
    raise LogError(f"entry {entry.index} belongs to thread {entry.threadId!r}, not {thread!r}")


def replay(
    machine: Machine,
    entries: Sequence[EntryView],
    *,
    verify: bool = False,
    upto: int | None = None,
    thread_id: str | None = None,
    lines: Sequence[bytes] | None = None,
) -> ReplayResult:
    """Fold `entries[:upto]` through `machine`.

    `verify` checks the hash chain of a chained thread, whole even when `upto` folds a prefix (the chain
    is seeded by the thread's id: `thread_id`, else the `threadId` its entries carry), the journaled
    snapshot hashes of the entries folded, and, when the whole thread is folded, the end entry's status.
    It raises `TamperError` or `DivergenceError` at the first bad entry. `lines`: the lines the entries
    were decoded from (`read_file_thread_lines`), which the chain is checked over as written."""
    chained = False
    if verify and entries:
        chained = is_chained(entries)
        if chained:
            # First, so an edited, missing or moved entry is named as such, not as whatever check of the
            # log's shape it happens to break.
            check_chain(entries, thread_id if thread_id is not None else entries[0].threadId, lines)
    if upto is not None or not entries or entries[0].event["type"] != INIT_EVENT:
        validate_log(machine, entries)  # a prefix's rest is checked too; an empty or headless log is named
    chosen = entries if upto is None else entries[:upto]
    if not chosen:
        raise LogError("replaying a prefix of length 0: the prefix must include the @agent.init entry")
    stamp: dict[str, Any] = dict(chosen[0].metadata or {})
    # The fold's fast path (`fold_of(machine)`): the same snapshots as `initial` and `transition`, built
    # only where one is read (a verified state hash, a resumed run's end, the result).
    fold = fold_of(machine)
    run: FoldRun | None = None
    steps = calls = tokens_in = tokens_out = failed = 0
    decisions = fallbacks = 0
    asked, erred, reason = False, False, None  # the usage entries since the last event
    cost = 0.0
    ended: RunStatus | None = None
    hashed: tuple[int, str] | None = None  # (steps, hash): an end entry repeats the state before it
    # The model-call budget in force: the stamp's from the start, each resume's from its entry on (a
    # `Budget`'s two fields kept apart: making one per replay was a Python call on every thread).
    max_calls: Any = stamp.get("maxModelCalls")
    calls_before = 0
    # `validate_log`'s checks are made in the fold's own pass; anything that fails in it (a check, the
    # fold, a count) asks `validate_log` first, so a log of the wrong shape is named as such, whatever
    # else an earlier entry of it broke (as when the whole log was validated before folding).
    config = machine.config
    machine_id, version, thread = config.id, config.version, chosen[0].threadId
    last = len(entries) - 1
    fields_of = _ENTRY_FIELDS if _ENTRY_FIELDS is not None else _entry_fields
    try:
        for position, entry in enumerate(chosen):
            fields = fields_of(entry)
            index, entry_machine, entry_version, entry_thread, event, metadata, attempts, journal = fields
            if (
                index != position
                or entry_machine != machine_id
                or entry_version != version
                or entry_thread != thread
            ):
                raise _Misshapen
            etype = event["type"]
            if etype == USAGE_EVENT:
                asked = True
                if (
                    event.get("error") and event.get("errorKind") != "answer"
                ):  # the endpoint failed, not the answer
                    erred = True
                    reason = reason or str(event["error"])
                n = event.get("calls", 1)
                t_in = event.get("inputTokens", 0)
                t_out = event.get("outputTokens", 0)
                usd = event.get("costUsd", 0.0)
                # The common case checked inline (exactly what `_count` and `_cost` accept, but for int
                # subclasses, which they judge): a call each was a tenth of the fold of a usage entry.
                if (
                    type(n) is int
                    and type(t_in) is int
                    and type(t_out) is int
                    and (type(usd) is float or type(usd) is int)
                    and 0 <= n <= MAX_USAGE_COUNT
                    and 0 <= t_in <= MAX_USAGE_COUNT
                    and 0 <= t_out <= MAX_USAGE_COUNT
                    and 0 <= usd <= MAX_USAGE_COUNT
                ):
                    calls += n
                    tokens_in += t_in
                    tokens_out += t_out
                    cost += usd
                else:
                    calls += _count(entry, event, "calls", 1)
                    tokens_in += _count(entry, event, "inputTokens", 0)
                    tokens_out += _count(entry, event, "outputTokens", 0)
                    cost += _cost(entry, event)
                continue
            if etype == END_EVENT:
                if position != last and not (
                    resumable(event.get("status")) and RESUME_KEY in (entries[position + 1].metadata or {})
                ):
                    raise _Misshapen
                ended = str(event.get("status"))
                if verify and run is not None:
                    hashed = _check_state(entry, fold, run, steps, hashed)
                    if entry is not entries[-1]:
                        # A run stopped waiting, and was resumed after: it stopped as it says.
                        before = fold.snapshot(run)
                        stretch = Budget(max_calls, calls_before)
                        _check_end(entry, stretch.status(machine, before, calls), before.status, before.value)
                continue
            if metadata is not None:
                if asked and "decision" in metadata:
                    decisions += 1
                    fallbacks += erred
                resume = metadata.get(RESUME_KEY)
                if isinstance(resume, dict):
                    max_calls, calls_before = resume.get("maxModelCalls"), calls
            asked = erred = False
            try:
                if etype == INIT_EVENT:
                    if position:
                        raise _Misshapen
                    run = fold.start(event.get("input"))
                else:
                    assert run is not None
                    if not fold.step(run, event):
                        raise LogError(
                            f"entry {entry.index} ({etype}) is not accepted in state '{run.value}' "
                            f"(status {run.status}): the log and the machine disagree"
                        )
            except MachineError as err:
                raise LogError(f"entry {entry.index} ({etype}): {err}") from err
            steps += 1
            if attempts:
                failed += len(attempts)
            if verify:
                journaled = journal.stateHash if journal is not None else None
                if journaled is not None:
                    if fold.matches(run, journaled):
                        hashed = (steps, journaled)
                    else:  # the canonical text decides, and names the divergence
                        hashed = _check_state(entry, fold, run, steps, None)
    except Exception:
        validate_log(machine, entries)  # raises when the log's shape is wrong (and `_Misshapen` says it is)
        raise
    assert run is not None
    # The status from the run itself: the snapshot is built when the result's is first read (`result_of`).
    status = derived_status(
        machine,
        run.status,
        run.error,
        run.value,
        fold.actor_source(run),
        calls - calls_before,
        max_calls,
    )
    verification: Verified = "unverified"
    if verify:
        if not chained:
            verification = "unchained"
        elif entries[-1].event["type"] != END_EVENT:
            verification = "incomplete"
        else:
            verification = "verified"
            if len(chosen) == len(entries):
                _check_end(entries[-1], status, run.status, run.value)
    return result_of(
        {
            "status": status,
            "entries": len(chosen),
            "steps": steps,
            "model_calls": calls,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "failed_attempts": failed,
            "stamp": stamp,
            "cost_usd": cost,
            "verification": verification,
            "ended": ended,
            "budget_left": _left(max_calls, calls - calls_before),
            "decisions": decisions,
            "fallbacks": fallbacks,
            "fallback_reason": reason,
        },
        fold,
        run,
    )


EntryFields = tuple[
    int, str, str, str | None, dict[str, Any], dict[str, Any] | None, Sequence[Any] | None, Any
]
"""What `replay` reads of each entry: index, machineId, machineVersion, threadId, event, metadata,
attempts, verification."""


def _entry_fields(entry: EntryView) -> EntryFields:
    return (
        entry.index,
        entry.machineId,
        entry.machineVersion,
        entry.threadId,
        entry.event,
        entry.metadata,
        entry.attempts,
        entry.verification,
    )


_ENTRY_FIELDS: Callable[[EntryView], EntryFields] | None = getattr(digest(), "entry_fields", None)
"""`entry_fields` of improve/_digest.c (the eight read in one call, at the struct's slots), or None."""


class Budget(NamedTuple):
    """The model-call budget of one stretch of a run: from its start, or from the event that resumed it.
    (A named tuple: every replay makes one, and a frozen dataclass's `__init__` costs up to twice as much.)"""

    max_model_calls: Any
    """The stamp's (or the resume's) `maxModelCalls`; anything but an int means no budget is known."""
    calls_before: int
    """Model calls journaled before the stretch began."""

    def status(self, machine: Machine, snapshot: Snapshot, calls: int) -> RunStatus:
        """`run_status` of the stretch: its calls counted against its own budget."""
        return run_status(
            machine, snapshot, calls - self.calls_before, {"maxModelCalls": self.max_model_calls}
        )

    def left(self, calls: int) -> int | None:
        return _left(self.max_model_calls, calls - self.calls_before)


def _left(max_model_calls: Any, spent: int) -> int | None:
    """Model calls a budget still allows after `spent` of its stretch (None: no budget is known)."""
    if not isinstance(max_model_calls, int) or isinstance(max_model_calls, bool):
        return None
    return max(0, max_model_calls - spent)


def _count(entry: EntryView, event: dict[str, Any], name: str, default: int) -> int:
    """A usage entry's count, checked: an integer from 0 to `MAX_USAGE_COUNT` (a count an endpoint could
    not have meant, journaled by an older improve, fails the thread alone, not a warehouse's batch)."""
    value = event.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USAGE_COUNT:
        raise LogError(
            f"entry {entry.index} ({USAGE_EVENT}): {name} is {str(value)[:40]}, not a count (an integer from "
            f"0 to {MAX_USAGE_COUNT:,})"
        )
    return value


def _cost(entry: EntryView, event: dict[str, Any]) -> float:
    value = event.get("costUsd", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_USAGE_COUNT:
        raise LogError(
            f"entry {entry.index} ({USAGE_EVENT}): costUsd is {str(value)[:40]}, not a cost in USD"
        )
    return float(value)


def resumable(status: Any) -> bool:
    """A run that ended with this status may be resumed (the legacy `idle` included)."""
    return status in RESUMABLE_STATUSES or status == LEGACY_WAIT_STATUS


def _check_state(
    entry: EntryView, fold: Fold, run: FoldRun, steps: int, hashed: tuple[int, str] | None
) -> tuple[int, str] | None:
    """The journaled state hash, when the entry has one, against the snapshot replay reached (after
    `steps` steps; `hashed` is the hash last computed and when, returned updated)."""
    journaled = entry.verification.stateHash if entry.verification is not None else None
    if journaled is None:
        return hashed
    if hashed is None or hashed[0] != steps:
        hashed = (steps, fold.hash(run, journaled))
    found = hashed[1]
    if found != journaled:
        # Shown to 12 digits, or as far as it takes to tell them apart (an edit of the last digit).
        pairs = enumerate(zip(journaled, found, strict=False))  # a journaled hash may be of any length
        shown = max(12, next((i + 1 for i, (a, b) in pairs if a != b), 12))
        raise DivergenceError(
            f"entry {entry.index} ({entry.type}) diverges: the journal says state hash "
            f"{_cut(journaled, shown)}, replay reached {_cut(found, shown)} in state '{run.value}'"
        )
    return hashed


def _cut(digest: str, digits: int) -> str:
    return digest if len(digest) <= digits else digest[:digits] + "..."


def _check_end(end: EntryView, status: RunStatus, snapshot_status: str, value: str) -> None:
    """The status the run journaled as it ended against the one replay derives (`status`, in state `value`,
    the snapshot's own status `snapshot_status`). The runner also stops a run that is still active when it
    reaches its entry cap, as `budget`, a limit the log does not carry: that `budget` is accepted whatever
    an active snapshot derives."""
    recorded = end.event.get("status")
    if recorded == status or (recorded == "budget" and snapshot_status == "active"):
        return
    if recorded == LEGACY_WAIT_STATUS and status in RESUMABLE_STATUSES:
        return  # written before runs could be resumed: `idle` then meant what `waiting` says now
    raise DivergenceError(
        f"entry {end.index} ({END_EVENT}) diverges: the run recorded status {recorded!r} as it ended, "
        f"replay derives {status!r} in state '{value}'"
    )


def run_status(machine: Machine, snapshot: Snapshot, model_calls: int, stamp: dict[str, Any]) -> RunStatus:
    """Derive how a run ended from its last snapshot, so live runs and replays agree on it."""
    invoke = snapshot.invoke
    return derived_status(
        machine,
        snapshot.status,
        snapshot.error,
        snapshot.value,
        invoke.src if invoke is not None else None,
        model_calls,
        stamp.get("maxModelCalls"),
    )


def derived_status(
    machine: Machine, status: str, error: Any, value: str, source: str | None, model_calls: int, budget: Any
) -> RunStatus:
    """`run_status` of a snapshot's parts: its status, error and state, the source of the actor it owes
    (None: none), the model calls counted against its `budget` (`maxModelCalls`, anything but an int
    meaning none is known)."""
    if status == "done":
        return "done"
    if status == "error":
        if isinstance(error, dict) and error.get("kind") in ("decision-exhausted", "no-options"):
            return "decision-exhausted"
        return "error"
    if source is None:
        state = machine.states[value]
        return wait_status(state) if state.idle else "stuck"
    if source == "agent.decide" and isinstance(budget, int) and model_calls >= budget:
        return "budget"
    return "incomplete"
