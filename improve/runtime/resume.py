"""Resuming a run that stopped waiting: the thread is its only state.

`resume` folds the thread through the environment's machine with every hash verified, checks that it
stopped in a waiting state and that the event is one that state accepts (the decision protocol's
refusal kinds: `unknown-event`, `invalid-payload`, `rejected-by-guard`), journals the event with its id
before anything acts on it, and drives the run on, in the same thread, to its next wait or its end.

An event id names an external event (a webhook's delivery id, an approval's id). Resuming again with
an id the thread has already taken changes nothing and answers as the first time did; without an id,
one is derived from the wait being resumed and the event, so repeating the same command is a no-op too.

The world the tools act on is the caller's: the world as the run left it. For a scenario's fixture
world, `world_at` rebuilds it by making the thread's recorded tool calls again and checking each
answers as recorded.

A resume interrupted after its event was journaled (the process killed, the disk full) leaves the
thread with the event and no end entry after it: the run has not ended. It is *finished*, not
resumed again: the same resume (the same event id) or `finish=True` drives the run on from where the
thread stops, to its next wait or its end, as the interrupted resume would have; any other event is
refused (`interrupted`) until then. A tool whose completion was not journaled before the interruption
is invoked again (at least once, as every journal-before-acting loop does).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from improve.errors import (
    ActorFailure,
    DivergenceError,
    LogError,
    MachineError,
    ResumeRefusedError,
    VersionMismatchError,
)
from improve.log import (
    END_EVENT,
    RESUME_KEY,
    LogEntry,
    ReplayResult,
    Store,
    head,
    replay,
    resumable,
)
from improve.machine import (
    Machine,
    Snapshot,
    canonical_json,
    payload_problem,
    refusing_guard,
    transition,
    waiting_for,
)
from improve.runtime.decision import Decider
from improve.runtime.environment import Environment, World
from improve.runtime.recorded import recorded_thread
from improve.runtime.run import DEFAULT_MAX_MODEL_CALLS, Journal, People, Runner, RunResult, Spent

MAX_EVENT_BYTES = 64 << 10
"""The largest event a resume journals, as canonical JSON (64 KiB): an approval, an answer, a webhook's
payload; far below the longest line ingest reads (8 MiB)."""

MAX_EVENT_DEPTH = 32
"""The deepest nesting of objects and arrays in an event (the event object counts as 1): far below what
ingest (128) and replay (about 200) read, so a journaled event always reads back."""


def event_problem(event: Any) -> str | None:
    """Why `event` cannot be journaled as it is (past the bounds above, a number that is not finite, a
    string that is not Unicode text, a key that is not a string), or None. Iterative: an event nested
    ten thousand deep is measured, not recursed into."""
    stack: list[tuple[Any, int, str]] = [(event, 1, "event")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_EVENT_DEPTH:
                return f"{where} is nested deeper than {MAX_EVENT_DEPTH} levels of objects and arrays"
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        return f"{where} has the key {key!r}, which is not a string"
                    if not _unicode(key):
                        return f"{where} has a key that is not Unicode text (a lone surrogate)"
                    stack.append((item, depth + 1, f"{where}.{key[:40]}"))
            else:
                stack.extend((item, depth + 1, f"{where}[{n}]") for n, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{where} is {value}, which JSON cannot hold (a number must be finite)"
        elif isinstance(value, str) and not _unicode(value):
            return f"{where} is not Unicode text (a lone surrogate such as \\ud800)"
        elif value is not None and not isinstance(value, bool | int | float | str):
            return f"{where} is a {type(value).__name__}, not a JSON value"
    size = len(canonical_json(event).encode("utf-8"))
    if size > MAX_EVENT_BYTES:
        return f"the event is {size:,} bytes as JSON; a resume takes at most {MAX_EVENT_BYTES:,} bytes"
    return None


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class ResumeResult:
    """How a resumed run went on: its result (counts over the whole thread), and what the resume did."""

    run: RunResult
    event_id: str
    entry: int
    """The index of the entry that journaled the event."""
    duplicate: bool
    """The event id had resumed this thread already: nothing was journaled, the result is that resume's."""
    finished: bool = False
    """The resume had been interrupted before its run ended: the run was driven on from where it stopped."""

    def to_json(self) -> dict[str, Any]:
        return {
            "thread": self.run.thread_id,
            "event_id": self.event_id,
            "entry": self.entry,
            "duplicate": self.duplicate,
            "finished": self.finished,
            "status": self.run.status,
            "final_state": self.run.final_state,
            "entries": self.run.entries,
            "model_calls": self.run.model_calls,
        }


@dataclass(frozen=True)
class WaitingThread:
    """A thread folded, verified and found waiting: where, and what it has spent."""

    entries: list[LogEntry]
    replayed: ReplayResult

    @property
    def snapshot(self) -> Snapshot:
        return self.replayed.snapshot

    @property
    def resumes(self) -> int:
        """How many times the run has been resumed so far."""
        return sum(RESUME_KEY in (e.metadata or {}) for e in self.entries)

    @property
    def interrupted(self) -> int | None:
        """The position of the entry that journaled a resume whose run has not ended (no end entry after
        it: the process was killed, or a write failed), or None."""
        for position in range(len(self.entries) - 1, -1, -1):
            entry = self.entries[position]
            if entry.type == END_EVENT:
                return None
            if RESUME_KEY in (entry.metadata or {}):
                return position
        return None


def resume(
    env: Environment,
    *,
    store: Store,
    thread_id: str,
    event: Any,
    decider: Decider,
    world: World,
    event_id: str | None = None,
    people: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    finish: bool = False,
) -> ResumeResult:
    """Resume the waiting thread `thread_id` of `store` with `event` and run on to the next wait or the end.

    `world` is the world as the run left it (`world_at` for a fixture's); `people` may script answers to
    later waits, as a scenario's do. Raises `ResumeRefusedError` (its `kind` says which check) with
    nothing journaled when the thread or the event is refused.

    A resume that was interrupted before its run ended is finished instead (see the module): by the same
    event (id), or by `finish=True` whatever `event` is; another event is refused (`interrupted`)."""
    folded = fold_thread(env, store, thread_id)
    entries = folded.entries
    interrupted = folded.interrupted
    if finish or interrupted is not None:
        return _finish_or_refuse(
            env, store, thread_id, folded, event, event_id, decider, world, people, finish
        )
    if not isinstance(event, dict) or not isinstance(event.get("type"), str) or not event["type"]:
        # The example is one the state waits for, not another desk's approval.
        accepted = [w["type"] for w in waiting_for(env.machine, folded.snapshot.value)]
        example = json.dumps({"type": accepted[0]}) if accepted else '{"type": "APPROVE"}'
        raise ResumeRefusedError(
            f"thread {thread_id}: the event {json.dumps(event, default=str)[:200]} is not an object with a "
            f"`type`, e.g. {example}"
            + (f" (state '{folded.snapshot.value}' accepts {', '.join(accepted)})" if accepted else ""),
            kind="unknown-event",
        )
    problem = event_problem(event)
    if problem is not None:
        raise ResumeRefusedError(f"invalid-payload: thread {thread_id}: {problem}", kind="invalid-payload")
    event = dict(event)
    replayed = folded.replayed
    waiting = replayed.ended is not None and resumable(replayed.ended) and entries[-1].type == END_EVENT
    # A given id is looked up whatever the thread does now. A derived one names an earlier wait only
    # when the thread no longer waits: waiting again, the same event is one for the new wait.
    earlier = _earlier(entries, event, event_id) if event_id is not None or not waiting else None
    if earlier is not None:
        return _again(env, store, thread_id, entries, earlier, event)
    if not waiting:
        raise ResumeRefusedError(
            f"thread {thread_id} is not waiting: it ended {replayed.ended or 'without an end entry'} in state "
            f"'{replayed.final_state}'; only a run that stopped in a waiting state can be resumed",
            kind="not-waiting",
        )
    snapshot = replayed.snapshot
    after = check_event(env.machine, snapshot, event, thread_id)
    event_id = event_id or derived_event_id(entries[-1], event)
    budget = env.resume_budget
    if budget is None:
        budget = replayed.budget_left if replayed.budget_left is not None else DEFAULT_MAX_MODEL_CALLS
    journal = Journal(store, thread_id, env.machine)
    written = journal.resumed(event, after, event_id, budget)
    spent = Spent(
        replayed.model_calls, replayed.input_tokens, replayed.output_tokens, replayed.failed_attempts
    )
    runner = Runner(env, world, People(people or {}), decider, journal, budget, spent)
    result = runner.drive(after)
    return ResumeResult(result, event_id, written.index, duplicate=False)


def _finish_or_refuse(
    env: Environment,
    store: Store,
    thread_id: str,
    folded: WaitingThread,
    event: Any,
    event_id: str | None,
    decider: Decider,
    world: World,
    people: Mapping[str, Sequence[dict[str, Any]]] | None,
    finish: bool,
) -> ResumeResult:
    """Finish the interrupted resume, answer (`finish`) as the last resume did, or refuse."""
    entries = folded.entries
    position = folded.interrupted
    if position is None:
        last = _last_resume(entries)
        if last is None:
            ended = folded.replayed.ended
            # `--event` only where the thread waits: on one that ended done, it was refused in turn.
            waits = ended is not None and resumable(ended)
            raise ResumeRefusedError(
                f"thread {thread_id} has no interrupted resume to finish: it was never resumed (it ended "
                f"{ended or 'without an end entry'} in state '{folded.replayed.final_state}')"
                + ("; resume it with --event" if waits else ": there is nothing to resume"),
                kind="not-interrupted",
            )
        return _again(env, store, thread_id, entries, last, dict(entries[last].event))
    taken = entries[position]
    taken_id = str(((taken.metadata or {}).get(RESUME_KEY) or {}).get("eventId"))
    given = event_id if event_id is not None else _derived_or_none(entries[position - 1], event)
    same = given == taken_id
    if not (finish or same):
        raise ResumeRefusedError(
            f"thread {thread_id} was interrupted while being resumed with {canonical_json(taken.event)} (entry "
            f"{taken.index}, event id {taken_id}): its run has not ended, so no other event can resume it. "
            f"Finish it first with `improve resume {thread_id} --finish` (or the same command again)",
            kind="interrupted",
        )
    replayed = folded.replayed
    journal = Journal(store, thread_id, env.machine)
    spent = Spent(
        replayed.model_calls, replayed.input_tokens, replayed.output_tokens, replayed.failed_attempts
    )
    budget = replayed.budget_left if replayed.budget_left is not None else DEFAULT_MAX_MODEL_CALLS
    runner = Runner(env, world, People(people or {}), decider, journal, budget, spent)
    result = runner.drive(replayed.snapshot)
    return ResumeResult(result, taken_id, taken.index, duplicate=False, finished=True)


def _derived_or_none(wait: LogEntry, event: Any) -> str | None:
    return derived_event_id(wait, event) if isinstance(event, dict) else None


def _last_resume(entries: Sequence[LogEntry]) -> int | None:
    for position in range(len(entries) - 1, -1, -1):
        if RESUME_KEY in (entries[position].metadata or {}):
            return position
    return None


def fold_thread(env: Environment, store: Store, thread_id: str) -> WaitingThread:
    """The thread read and replayed with every hash checked; refused when it does not verify or was
    recorded by another environment or version."""
    entries = store.read(thread_id) if store.exists(thread_id) else []
    if not entries:
        raise ResumeRefusedError(f"no thread {thread_id!r} to resume", kind="not-found")
    recorded_env = (entries[0].metadata or {}).get("environment")
    if recorded_env is not None and recorded_env != env.name:
        raise ResumeRefusedError(
            f"thread {thread_id} was recorded in environment {recorded_env!r}, not {env.name!r}",
            kind="version-changed",
        )
    try:
        replayed = replay(env.machine, entries, verify=True, thread_id=thread_id)
    except VersionMismatchError as error:
        raise ResumeRefusedError(
            f"thread {thread_id}: the environment changed since the run stopped ({error}); a run goes on only "
            "under the machine that recorded it",
            kind="version-changed",
        ) from None
    except (DivergenceError, LogError) as error:
        raise ResumeRefusedError(
            f"thread {thread_id} does not verify, so it is not resumed: {error}", kind="does-not-verify"
        ) from None
    if replayed.verification == "unchained":
        raise ResumeRefusedError(
            f"thread {thread_id} is unchained (schemaVersion 1): its content cannot be verified, so it is not "
            "resumed",
            kind="does-not-verify",
        )
    return WaitingThread(list(entries), replayed)


def check_event(machine: Machine, snapshot: Snapshot, event: dict[str, Any], thread_id: str) -> Snapshot:
    """The snapshot after `event` in the waiting `snapshot`; refused, in the decision protocol's order,
    when the state does not accept it."""
    state = snapshot.value
    accepted = {w["type"]: w["payload"] for w in waiting_for(machine, state)}
    where = f"thread {thread_id} waits in state '{state}'"
    if event["type"] not in accepted:
        raise ResumeRefusedError(
            f"unknown-event: {where}, which accepts {', '.join(accepted)}, not {event['type']!r}",
            kind="unknown-event",
        )
    problem = payload_problem(accepted[event["type"]], event)
    if problem is not None:
        raise ResumeRefusedError(f"invalid-payload: {where}: {problem}", kind="invalid-payload")
    try:
        after = transition(machine, snapshot, event)
    except MachineError as error:
        raise ResumeRefusedError(
            f"invalid-payload: {where}: the rules cannot read the event: {error}", kind="invalid-payload"
        ) from None
    if after is snapshot:
        guard = refusing_guard(machine, snapshot, event)
        raise ResumeRefusedError(
            f"rejected-by-guard: {where}: the rules do not allow {event['type']} now"
            + (f" ({guard})" if guard else ""),
            kind="rejected-by-guard",
        )
    return after


def derived_event_id(wait: LogEntry, event: Mapping[str, Any]) -> str:
    """The id of an event given without one: the wait it resumes (its end entry's hash) and the event."""
    digest = hashlib.sha256(canonical_json([head([wait]), dict(event)]).encode()).hexdigest()
    return digest[:32]


def _earlier(entries: list[LogEntry], event: dict[str, Any], event_id: str | None) -> int | None:
    """The position of the entry this event id (given, or derived for each earlier wait) resumed before;
    of the last one, for a derived id the same event took at two waits."""
    for position, entry in reversed(list(enumerate(entries))):
        resume = (entry.metadata or {}).get(RESUME_KEY)
        if not isinstance(resume, dict):
            continue
        taken = resume.get("eventId")
        if event_id is not None and taken == event_id:
            if canonical_json(entry.event) != canonical_json(event):
                raise ResumeRefusedError(
                    f"event id {event_id!r} resumed thread at entry {entry.index} with "
                    f"{canonical_json(entry.event)}, not {canonical_json(event)}; an event id names one event",
                    kind="event-id-reused",
                )
            return position
        if event_id is None and taken == derived_event_id(entries[position - 1], event):
            return position
    return None


def _again(
    env: Environment,
    store: Store,
    thread_id: str,
    entries: list[LogEntry],
    position: int,
    event: dict[str, Any],
) -> ResumeResult:
    """The answer of the resume that already took this event: where the run stopped after it."""
    stop = next((i for i in range(position, len(entries)) if entries[i].type == END_EVENT), None)
    upto = len(entries) if stop is None else stop + 1
    replayed = replay(env.machine, entries, upto=upto, thread_id=thread_id)
    recorded = recorded_thread(env.machine, entries[:upto], thread_id)
    run = RunResult(
        thread_id=thread_id,
        # A resume that crashed before its run ended left no end entry: the thread is incomplete.
        status=entries[stop].event.get("status", replayed.status) if stop is not None else "incomplete",
        snapshot=replayed.snapshot,
        entries=upto,
        model_calls=replayed.model_calls,
        input_tokens=replayed.input_tokens,
        output_tokens=replayed.output_tokens,
        failed_attempts=replayed.failed_attempts,
        effects=recorded.effects,
    )
    taken = (entries[position].metadata or {})[RESUME_KEY]["eventId"]
    return ResumeResult(run, str(taken), entries[position].index, duplicate=True)


def world_at(
    env: Environment, fixture: Mapping[str, Any], entries: Sequence[LogEntry], thread_id: str
) -> World:
    """A fresh world from `fixture`, brought to where the thread's run left it by making each recorded
    tool call again, in order; refused (`world-changed`) at the first that answers otherwise."""
    world = env.make_world(fixture)
    thread = recorded_thread(env.machine, entries, thread_id)
    for call in thread.calls:
        where = f"thread {thread_id}, entry {call.index} ({call.src} in state '{call.state}')"
        actor = env.actors.get(call.src)
        if actor is None:
            raise ResumeRefusedError(
                f"{where}: environment {env.name} has no tool {call.src!r}", kind="world-changed"
            )
        before = len(world.effects)
        answer: dict[str, Any]
        try:
            answer = {"output": _plain(actor(world, dict(call.input or {})))}
        except ActorFailure as failure:
            answer = {"error": failure.to_error()}
        effects = _plain(world.effects[before:])
        recorded = {"output": _plain(call.output)} if call.error is None else {"error": call.error}
        if answer != recorded or effects != _plain(list(call.effects)):
            raise ResumeRefusedError(
                f"{where}: the world rebuilt from the fixture answers {canonical_json(answer)} with effects "
                f"{canonical_json(effects)}, the thread records {canonical_json(recorded)} with "
                f"{canonical_json(list(call.effects))}; the fixture changed since the run stopped",
                kind="world-changed",
            )
    return world


def _plain(value: Any) -> Any:
    """`value` as JSON would carry it (tuples as lists), so a tool's answer compares with the journal's."""
    return json.loads(json.dumps(value, default=str))
