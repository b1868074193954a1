"""Driving an environment through one scenario, journaling every external input before acting on it.

The loop: invoke actors (journal `xstate.done.actor` / `xstate.error.actor`), answer waiting states from
the scenario's people script, ask the decider at `agent.decide` states (the decision protocol), until
a final state, a waiting state nobody answers, or a budget. Each entry is written to the store before
the next action, so a crash loses at most the action in flight and the thread replays to where it was.

A run that stops in a waiting state ends its process with the thread as its only state: the end entry
says the status (`waiting`, or the state's `meta.status`), the state and what it waits for
(`waitingFor`), and `improve.runtime.resume` continues it in the same thread. A run whose people
script answers a wait with an event the machine refuses there ends there too (`refused="end"`, a
suite's run): its end entry says which answer (`peopleRefused`), and the thread replays as any run that
stopped waiting, the refused answer never folded.

Every entry is chained (schemaVersion 2, `verification.entryHash`, `improve.log.chain`), and a run that
ends, whatever its status, writes a last `@agent.end` entry saying how. A run that raised (an actor
crashed, a store failed) has none: its thread is incomplete, which is what it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from improve.errors import (
    ActorCrash,
    ActorFailure,
    ConflictError,
    PeopleScriptError,
    RunError,
    raised,
)
from improve.log import (
    END_EVENT,
    INIT_EVENT,
    RESUME_KEY,
    SCHEMA_VERSION,
    UNCHAINED_VERSION,
    Attempt,
    EntryView,
    LogEntry,
    RunStatus,
    Store,
    Verification,
    head,
    new_entry_id,
    now_rfc3339,
    run_status,
    seal,
)
from improve.machine import (
    DECIDE_SRC,
    DONE_EVENT,
    ERROR_EVENT,
    RESUMABLE_STATUSES,
    Invocation,
    Machine,
    Snapshot,
    initial,
    refusing_guard,
    transition,
    waiting_for,
)
from improve.runtime.decision import DEFAULT_MAX_RETRIES, POLICY_ERROR, Decider, build_request, check_answer
from improve.runtime.environment import Environment, World

DEFAULT_MAX_MODEL_CALLS = 100
MAX_ENTRIES = 2000

PEOPLE_REFUSED_KEY = "peopleRefused"
"""The end entry's metadata key of a run that ended where its people script's answer was refused
(`Refused.to_json`)."""

RefusedAnswer = Literal["raise", "end"]
"""What a people script's answer the machine refuses does to a run: `raise` a `PeopleScriptError` (a
check of the script, which names it as the scenario's problem), or `end` the run there (a suite's run:
one run of a path the script did not foresee fails, the others go on)."""


@dataclass(frozen=True)
class Refused:
    """A people script's answer the machine refused where the run waited, which ended the run there."""

    state: str
    """The waiting state the script answered."""
    index: int
    """Which of the script's answers for that state (0 the first)."""
    event: dict[str, Any]
    guard: str | None
    """The guard that refused it, when the state takes the event; None when it takes no such event."""
    accepts: tuple[str, ...]
    """The events the state takes."""

    def sentence(self) -> str:
        """`the people script answers {...} in state 'S', whose rules refuse it (guard)`."""
        # Its type first, as a person writes the event, whatever order a thread read back keeps (sorted).
        event = {**({"type": self.event["type"]} if "type" in self.event else {}), **self.event}
        return f"the people script answers {json.dumps(event, default=str)} in state '{self.state}', " + (
            f"whose rules refuse it ({self.guard})"
            if self.guard
            else f"which does not accept it; it accepts {list(self.accepts)}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "index": self.index,
            "event": self.event,
            **({"guard": self.guard} if self.guard else {}),
            "accepts": list(self.accepts),
        }

    @classmethod
    def from_json(cls, data: Any) -> Refused | None:
        """The refusal an end entry's metadata holds; None when it holds none, or not in this shape (a
        thread is evidence whoever wrote it: a field of another shape is not a refusal)."""
        if not isinstance(data, dict):
            return None
        state, index, event, guard, accepts = (
            data.get("state"),
            data.get("index"),
            data.get("event"),
            data.get("guard"),
            data.get("accepts"),
        )
        if (
            not isinstance(state, str)
            or not isinstance(index, int)
            or isinstance(index, bool)
            or not isinstance(event, dict)
            or not (guard is None or isinstance(guard, str))
            or not isinstance(accepts, list)
        ):
            return None
        return cls(state, index, dict(event), guard, tuple(str(a) for a in accepts))


def refused_at_end(entries: Sequence[EntryView]) -> Refused | None:
    """The people script's answer refused where the thread's run ended (its last end entry's
    `peopleRefused`), or None: none was, or a person resumed the run since and it went on past it."""
    if not entries or entries[-1].event.get("type") != END_EVENT:
        return None
    return Refused.from_json((entries[-1].metadata or {}).get(PEOPLE_REFUSED_KEY))


@dataclass
class RunResult:
    """How one run ended and what it cost. Effects are the world's, not the agent's report."""

    thread_id: str
    status: RunStatus
    snapshot: Snapshot
    entries: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    failed_attempts: int
    effects: list[dict[str, Any]] = field(default_factory=list)
    refused: Refused | None = None
    """The people script's answer the machine refused where the run ended (`refused="end"`), if one was."""

    @property
    def final_state(self) -> str:
        return self.snapshot.value


class Journal:
    """Appends entries to one thread, numbering them, stamping each with the snapshot hash and chaining
    each to the one before it (`entryHash`; entry 0 to the thread id). Without `hashes`, a new thread is
    written unchained and without state hashes: a run only scored in memory and thrown away (a
    counterfactual run) needs neither, and they are most of what writing an entry costs."""

    def __init__(self, store: Store, thread_id: str, machine: Machine, hashes: bool = True) -> None:
        self.store = store
        self.thread_id = thread_id
        self.machine = machine
        self.hashes = hashes
        self.index = store.length(thread_id)
        self.last_id: str | None = None
        # The link the next entry chains to. A thread that already has entries continues in its own form:
        # after an unchained (version 1) entry, entries are written unchained too, never a mix.
        self.previous: str | None = thread_id if hashes else None
        if self.index:
            last = store.read(thread_id, self.index - 1)
            self.previous = head(last)
            self.last_id = last[-1].id if last else None

    def write(
        self,
        event: dict[str, Any],
        after: Snapshot | None = None,
        attempts: list[Attempt] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> LogEntry:
        entry = LogEntry(
            schemaVersion=SCHEMA_VERSION if self.previous is not None else UNCHAINED_VERSION,
            id=new_entry_id(),
            index=self.index,
            recordedAt=now_rfc3339(),
            machineId=self.machine.id,
            machineVersion=self.machine.version,
            event=event,
            causationId=self.last_id,
            attempts=attempts or None,
            metadata=metadata,
            verification=Verification(stateHash=after.hash())
            if (after is not None and self.hashes)
            else None,
        )
        if self.previous is not None:
            entry = seal(entry, self.previous)
            assert entry.verification is not None
            self.previous = entry.verification.entryHash
        self.store.append(self.thread_id, self.index, [entry])
        self.index += 1
        self.last_id = entry.id
        return entry

    def end(self, status: RunStatus, final: Snapshot, metadata: dict[str, Any] | None = None) -> LogEntry:
        """The run's last entry, `{"type": "@agent.end", "status": status}`, with the final state's hash;
        a run that stopped waiting also says where (`state`) and for what (`waitingFor`). `metadata`:
        what else the run says of itself (a replay-first run, what it started from)."""
        event: dict[str, Any] = {"type": END_EVENT, "status": status}
        state = self.machine.states[final.value]
        if status in RESUMABLE_STATUSES and final.invoke is None and state.idle:
            event["state"] = final.value
            event["waitingFor"] = waiting_for(self.machine, final.value)
        return self.write(event, final, metadata=metadata)

    def resumed(
        self, event: dict[str, Any], after: Snapshot, event_id: str, max_model_calls: int
    ) -> LogEntry:
        """The external event that resumes a waiting run, journaled before anything acts on it."""
        resume = {"eventId": event_id, "maxModelCalls": max_model_calls}
        return self.write(event, after, metadata={"source": "resume", RESUME_KEY: resume})


class People:
    """The scenario's people script: per waiting state, answers consumed in order."""

    def __init__(self, script: Mapping[str, Sequence[dict[str, Any]]]) -> None:
        self._queues = {state: list(answers) for state, answers in script.items()}
        self._given = {state: 0 for state in script}

    def answer(self, state: str) -> dict[str, Any] | None:
        queue = self._queues.get(state)
        if not queue:
            return None
        self._given[state] += 1
        return dict(queue.pop(0))

    def given(self, state: str) -> int:
        """How many answers the script has given in `state` so far."""
        return self._given.get(state, 0)


def run(
    env: Environment,
    *,
    input: Any,
    world: World,
    people: Mapping[str, Sequence[dict[str, Any]]],
    decider: Decider,
    store: Store,
    thread_id: str,
    stamp: Mapping[str, Any] | None = None,
    max_model_calls: int = DEFAULT_MAX_MODEL_CALLS,
    note: Callable[[], dict[str, Any]] | None = None,
    hashes: bool = True,
    refused: RefusedAnswer = "raise",
) -> RunResult:
    """Run `env` once from `input` to the end, journaling the thread `thread_id` into `store`. `note`:
    the end entry's metadata, asked for when the run ends (a replay-first decider's `note`); `hashes`:
    see `Journal`; `refused`: what an answer of `people` the machine refuses does (`RefusedAnswer`)."""
    if store.length(thread_id):
        raise ConflictError(f"thread {thread_id} already has entries; delete it or use another run number")
    runner = Runner(
        env,
        world,
        People(people),
        decider,
        Journal(store, thread_id, env.machine, hashes=hashes),
        max_model_calls,
        note=note,
        refused=refused,
    )
    return runner.start(input, {**(stamp or {}), "maxModelCalls": max_model_calls})


@dataclass(frozen=True)
class Spent:
    """What a thread spent before a stretch of its run began (a resume continues the counts)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    failed_attempts: int = 0


class Runner:
    """Drives one stretch of a run: from its start, or from the event that resumed it."""

    def __init__(
        self,
        env: Environment,
        world: World,
        people: People,
        decider: Decider,
        journal: Journal,
        max_model_calls: int,
        spent: Spent | None = None,
        note: Callable[[], dict[str, Any]] | None = None,
        refused: RefusedAnswer = "raise",
    ) -> None:
        self.env = env
        self.note = note
        self.on_refused = refused
        self.refused: Refused | None = None
        """The people script's answer refused where this stretch ended, if one was (`refused="end"`)."""
        self.machine = env.machine
        self.world = world
        self.people = people
        self.decider = decider
        self.journal = journal
        self.max_model_calls = max_model_calls
        """The budget of this stretch: model calls it may make from its start."""
        spent = spent or Spent()
        self.calls_before = spent.calls
        self.calls = spent.calls
        self.tokens_in = spent.input_tokens
        self.tokens_out = spent.output_tokens
        self.failed = spent.failed_attempts

    def start(self, input: Any, metadata: dict[str, Any]) -> RunResult:
        snapshot = initial(self.machine, input)
        self.journal.write({"type": INIT_EVENT, "input": input}, snapshot, metadata=metadata)
        return self.drive(snapshot)

    def drive(self, snapshot: Snapshot) -> RunResult:
        """Go on from `snapshot` to a final state, a wait nobody answers, or a budget; end the thread."""
        stop: RunStatus | None = None
        while snapshot.status == "active":
            if self.journal.index >= MAX_ENTRIES:
                stop = "budget"
                break
            invocation = snapshot.invoke
            if invocation is None:
                nxt = self._person(snapshot)
            elif invocation.src == DECIDE_SRC:
                nxt = self._decide(snapshot, invocation)
                if nxt is None:
                    stop = "budget"
            else:
                nxt = self._actor(snapshot, invocation)
            if nxt is None:
                break  # nobody answers (the run ends waiting), or the model-call budget is spent
            snapshot = nxt
        spent = self.calls - self.calls_before
        status = stop or run_status(self.machine, snapshot, spent, {"maxModelCalls": self.max_model_calls})
        metadata = self.note() if self.note is not None else None
        if self.refused is not None:
            # Said on the end entry, which replay does not fold: the refused answer was never taken, so
            # the thread folds (and verifies) to the wait it stopped in, as a run nobody answered does.
            metadata = {**(metadata or {}), PEOPLE_REFUSED_KEY: self.refused.to_json()}
        self.journal.end(status, snapshot, metadata)
        return RunResult(
            thread_id=self.journal.thread_id,
            status=status,
            snapshot=snapshot,
            entries=self.journal.index,
            model_calls=self.calls,
            input_tokens=self.tokens_in,
            output_tokens=self.tokens_out,
            failed_attempts=self.failed,
            effects=list(self.world.effects),
            refused=self.refused,
        )

    def _person(self, snapshot: Snapshot) -> Snapshot | None:
        answer = self.people.answer(snapshot.value)
        if answer is None:
            return None
        nxt = transition(self.machine, snapshot, answer)
        if nxt is snapshot:
            accepts = sorted(self.machine.states[snapshot.value].on)
            # An event the state takes, refused by its rules (a value misspelt: `shows: decy`), is said
            # with the guard that refused it, not as an event the state does not take.
            guard = refusing_guard(self.machine, snapshot, answer) if answer.get("type") in accepts else None
            refused = Refused(
                snapshot.value, self.people.given(snapshot.value) - 1, answer, guard, tuple(accepts)
            )
            if self.on_refused == "end":
                # A path the script's author did not foresee (the model escalated what careful does not):
                # this run fails there, with the answer said, and the suite's other runs go on.
                self.refused = refused
                return None
            raise PeopleScriptError(
                f"thread {self.journal.thread_id}: {refused.sentence()}", refused.state, refused.index
            )
        self.journal.write(answer, nxt, metadata={"source": "person"})
        return nxt

    def _land(
        self, snapshot: Snapshot, event: dict[str, Any], attempts: list[Attempt], meta: dict[str, Any]
    ) -> Snapshot:
        nxt = transition(self.machine, snapshot, event)
        self.journal.write(event, nxt, attempts=attempts, metadata=meta)
        return nxt

    def _decide(self, snapshot: Snapshot, invocation: Invocation) -> Snapshot | None:
        """The decision protocol: offer, ask, check, feed refusals back, land or exhaust."""
        request = build_request(self.machine, snapshot)
        invoke = self.machine.states[snapshot.value].invoke
        retries = invoke.max_retries if invoke and invoke.max_retries is not None else DEFAULT_MAX_RETRIES
        decision_meta = {"name": request.name, "options": request.options}
        if not request.options:
            error = {"kind": "no-options", "message": "the rules allow no option here"}
            event = {"type": ERROR_EVENT, "actorId": invocation.id, "error": error}
            return self._land(snapshot, event, [], {"decision": decision_meta})
        attempts: list[Attempt] = []
        source = ""
        for _ in range(retries + 1):
            if self.calls - self.calls_before >= self.max_model_calls:
                return None
            decision = self.decider.decide(request.with_attempts(attempts))
            source = decision.source
            for use in decision.usage:
                self.calls += 1
                self.tokens_in += use.input_tokens
                self.tokens_out += use.output_tokens
                self.journal.write(use.to_event(request.name))
            refusal = check_answer(self.machine, snapshot, request, decision.event)
            if refusal is not None and refusal.kind == "no-answer" and source.startswith(POLICY_ERROR):
                # The policy itself failed (a guard reading a fact the request does not hold): said as
                # such, or the thread blames a decider that was never asked.
                failed = source.removeprefix(POLICY_ERROR)
                refusal = refusal.model_copy(update={"reason": f"no-answer: the policy failed: {failed}"})
            if refusal is None:
                assert decision.event is not None
                self.failed += len(attempts)
                return self._land(
                    snapshot, decision.event, attempts, {"decision": decision_meta, "source": source}
                )
            attempts.append(refusal)
        self.failed += len(attempts)
        error = {
            "kind": "decision-exhausted",
            "message": f"{len(attempts)} answers refused; the last: {attempts[-1].reason}",
        }
        event = {"type": ERROR_EVENT, "actorId": invocation.id, "error": error}
        return self._land(snapshot, event, attempts, {"decision": decision_meta, "source": source})

    def _actor(self, snapshot: Snapshot, invocation: Invocation) -> Snapshot:
        actor = self.env.actors.get(invocation.src)
        if actor is None:
            raise RunError(f"actor '{invocation.src}' is not registered with environment {self.env.name}")
        before = len(self.world.effects)
        event: dict[str, Any]
        try:
            output = actor(self.world, dict(invocation.input or {}))
            event = {"type": DONE_EVENT, "actorId": invocation.id, "output": output}
        except ActorFailure as failure:
            event = {"type": ERROR_EVENT, "actorId": invocation.id, "error": failure.to_error()}
        except Exception as err:
            raise ActorCrash(
                f"thread {self.journal.thread_id}: actor '{invocation.src}' crashed in state "
                f"'{snapshot.value}': {raised(err)}"  # with the file and line that raised it
            ) from err
        if len(self.world.effects) > before:
            # The world's receipts travel with the completion, so replay and scoring see them.
            event["effects"] = [dict(e) for e in self.world.effects[before:]]
        nxt = transition(self.machine, snapshot, event)
        self.journal.write(event, nxt)
        return nxt
