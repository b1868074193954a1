"""A thread read back as what happened outside the machine: its input, each tool call, each person's answer.

An environment's `world_from_thread` hook reads this rather than raw log entries: the log names an
actor only by its invoke id (`actorId`, the state's name by default), so which tool answered and with
what input is learned by folding the thread through the machine, once, here. Nothing is called: the
tools' outputs, errors and effects are the ones journaled.

Entries whose type starts with `@agent.` other than the init (`@agent.usage` spend records, and any
such bookkeeping entry a later format adds) are not events of the machine and are passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.errors import LogError, MachineError
from improve.log import INIT_EVENT, RESUME_KEY, USAGE_EVENT, Budget, LogEntry, RunStatus, validate_log
from improve.machine import DECIDE_SRC, DONE_EVENT, ERROR_EVENT, Machine, Snapshot, initial, transition

META_PREFIX = "@agent."
"""Bookkeeping entries (spend, the end of a run, ...): journaled beside the machine's events, never folded."""


@dataclass(frozen=True)
class ActorCall:
    """One tool call as the thread records it: which tool, from which state, with what input, and what it
    answered (an output, or an error the machine handled), with the effects the world recorded."""

    index: int
    """The entry of the completion (`xstate.done.actor` / `xstate.error.actor`)."""
    state: str
    """The state that invoked the tool."""
    src: str
    """The tool (`invoke.src`, e.g. `orders.lookup`)."""
    input: Any
    """The tool's input, evaluated from the context as the runner evaluated it."""
    output: Any = None
    """What it answered; None when it failed."""
    error: dict[str, Any] | None = None
    """The journaled error (`code`, `message`) when it failed."""
    effects: tuple[dict[str, Any], ...] = ()

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class PersonAnswer:
    """An event a person sent to a waiting state (one with no invoke), as a scenario's `people` scripts it."""

    index: int
    state: str
    event: dict[str, Any]


@dataclass(frozen=True)
class RecordedThread:
    """What a thread shows of the world: the input, the tool calls and the people's answers, in order."""

    thread_id: str
    input: Any
    calls: tuple[ActorCall, ...]
    answers: tuple[PersonAnswer, ...]
    final_state: str
    status: RunStatus
    stamp: dict[str, Any] = field(default_factory=dict)
    """Entry 0's metadata (policy, models, scenario, split, run), as the runner stamped it."""

    def outputs(self, src: str) -> list[Any]:
        """The outputs of the successful calls of one tool, in order."""
        return [call.output for call in self.calls if call.src == src and not call.failed]

    def failures(self, src: str) -> list[ActorCall]:
        return [call for call in self.calls if call.src == src and call.failed]

    @property
    def effects(self) -> list[dict[str, Any]]:
        return [dict(effect) for call in self.calls for effect in call.effects]

    def people(self) -> dict[str, list[dict[str, Any]]]:
        """The answers as a scenario's people script: per waiting state, the events in the order sent."""
        script: dict[str, list[dict[str, Any]]] = {}
        for answer in self.answers:
            script.setdefault(answer.state, []).append(dict(answer.event))
        return script


def recorded_thread(machine: Machine, entries: Sequence[LogEntry], thread_id: str) -> RecordedThread:
    """Fold `entries` through `machine`, collecting each tool call and each person's answer.

    Raises `LogError` naming the thread and the entry when the log is not a thread of this machine or an
    entry is not accepted where it stands.
    """
    try:
        validate_log(machine, entries)
    except LogError as error:
        raise type(error)(f"thread {thread_id}: {error}") from None
    snapshot: Snapshot | None = None
    calls: list[ActorCall] = []
    answers: list[PersonAnswer] = []
    model_calls = 0
    budget = Budget((entries[0].metadata or {}).get("maxModelCalls"), 0)
    for entry in entries:
        event = entry.event
        etype = entry.type
        if etype == USAGE_EVENT:
            model_calls += int(event.get("calls", 1))
            continue
        resume = (entry.metadata or {}).get(RESUME_KEY)
        if isinstance(resume, dict):  # a resumed stretch counts against its own budget, as replay does
            budget = Budget(resume.get("maxModelCalls"), model_calls)
        if etype != INIT_EVENT and etype.startswith(META_PREFIX):
            continue
        try:
            if etype == INIT_EVENT:
                snapshot = initial(machine, event.get("input"))
                continue
            assert snapshot is not None  # validate_log: entry 0 is the init
            before = snapshot
            snapshot = transition(machine, before, event)
        except MachineError as error:
            raise LogError(f"thread {thread_id}: entry {entry.index} ({etype}): {error}") from error
        if snapshot is before:
            raise LogError(
                f"thread {thread_id}: entry {entry.index} ({etype}) is not accepted in state "
                f"'{before.value}' (status {before.status}): the thread and the machine disagree"
            )
        invocation = before.invoke
        if invocation is None:
            # A waiting state: only a person (the scenario's people script) sends it events.
            answers.append(PersonAnswer(entry.index, before.value, dict(event)))
        elif invocation.src != DECIDE_SRC and etype in (DONE_EVENT, ERROR_EVENT):
            calls.append(_call(entry.index, before.value, invocation.src, invocation.input, event))
    assert snapshot is not None
    stamp = dict(entries[0].metadata or {})
    return RecordedThread(
        thread_id=thread_id,
        input=entries[0].event.get("input"),
        calls=tuple(calls),
        answers=tuple(answers),
        final_state=snapshot.value,
        status=budget.status(machine, snapshot, model_calls),
        stamp=stamp,
    )


def _call(index: int, state: str, src: str, input: Any, event: dict[str, Any]) -> ActorCall:
    error: dict[str, Any] | None = None
    if event["type"] == ERROR_EVENT:
        raw = event.get("error")
        error = dict(raw) if isinstance(raw, dict) else {"message": str(raw)}
    return ActorCall(
        index=index,
        state=state,
        src=src,
        input=input,
        output=event.get("output") if error is None else None,
        error=error,
        effects=tuple(dict(e) for e in event.get("effects") or ()),
    )
