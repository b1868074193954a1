"""Replay-first runs: a run that starts from another run's recorded model calls (docs/contracts.md).

A candidate policy's run of a scenario and sample starts from the baseline's recorded run of the same
scenario and sample. The candidate's policy decides at each decision; where it asks a model the very
request the baseline asked (the same ref, model, and request with its attempts: `asked_digest`), the
baseline's recorded answer is the answer, and no model is asked. The m-th time the candidate asks a
request, it takes the baseline's m-th answer to that request, while there is one; any other call asks
the model. So the run costs model calls only where its path departs from the baseline's, and a
change that never fires costs none.

Each recorded answer is a draw of the model's answer to its request. Taking it for the same request is
taking the same draw: the pair of runs shares its random numbers wherever the paths agree (common
random numbers), and each draw answers at most once, so the run's answers are distributed as a run
asking every call would get, for a model whose answer depends on the request alone.

The run itself is an ordinary journaled run: the environment's world and tools, the people's script,
every entry written and chained as it happens. Its usage entries say which calls were answered from the
recording (`reused`), and its end entry says what it started from (`replayFirst`: the baseline's
thread, the calls reused and asked, and where the paths parted, if they did).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from improve.log import USAGE_EVENT, LogEntry
from improve.machine import DONE_EVENT, ERROR_EVENT, Invocation, Machine
from improve.runtime.decision import Decision, DecisionRequest, Usage
from improve.runtime.judgment import Judgment
from improve.runtime.models import Model
from improve.runtime.policy import Ask, PolicyDecider

REPLAY_FIRST_KEY = "replayFirst"
"""The end entry's metadata key of a replay-first run."""


@dataclass(frozen=True)
class RecordedCall:
    """One model call of a recorded run, as its usage entry journaled it."""

    number: int
    """The call's number in its run, from 1."""
    asked: str
    answer: Any
    usage: Mapping[str, Any]
    """The usage event (ref, model, tokens, cost, fingerprint)."""


@dataclass(frozen=True)
class RecordedRun:
    """What a replay-first run takes from the run it starts from: its model calls that were answered,
    and the answers each of its decisions took in turn (the refused ones, then the one that landed)."""

    thread_id: str
    calls: tuple[RecordedCall, ...]
    decisions: tuple[tuple[str, tuple[Any, ...]], ...]
    """Per decision the decider was asked, in order: its name and its answers."""

    @classmethod
    def of(cls, thread_id: str, entries: Sequence[LogEntry]) -> RecordedRun:
        """The calls and decisions of a thread. A call journaled without what it asked (a thread from
        before replay-first, or one whose call failed) answers nothing here."""
        calls: list[RecordedCall] = []
        decisions: list[tuple[str, tuple[Any, ...]]] = []
        number = 0
        for entry in entries:
            event = entry.event
            if entry.type == USAGE_EVENT:
                number += int(event.get("calls", 1))
                asked = event.get("asked")
                if isinstance(asked, str) and "answer" in event and not event.get("error"):
                    calls.append(RecordedCall(number, asked, event["answer"], event))
                continue
            decision = (entry.metadata or {}).get("decision")
            if not isinstance(decision, dict) or not decision.get("options"):
                continue  # not a decision, or one with no option (the decider was not asked)
            answers = [a.event for a in entry.attempts or ()]
            if entry.type != ERROR_EVENT:
                answers.append(dict(event))
            decisions.append((str(decision.get("name", "")), tuple(answers)))
        return cls(thread_id, tuple(calls), tuple(decisions))


@dataclass(frozen=True)
class Parting:
    """Where a replay-first run's path left the recorded one's."""

    decision: int
    """The decision, counted from 1 among those the decider was asked."""
    name: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "name": self.name, "why": self.why}


class ReplayFirstDecider(PolicyDecider):
    """A policy deciding with the recorded answers of another run wherever it asks what that run asked
    (see the module's docstring); every other call goes to its models."""

    def __init__(
        self,
        policy: Machine,
        models: Mapping[str, Model],
        judgments: Mapping[str, Judgment] | None,
        recorded: RecordedRun,
    ) -> None:
        super().__init__(policy, models, judgments)
        self.recorded = recorded
        self._unused: dict[str, deque[RecordedCall]] = {}
        for call in recorded.calls:
            self._unused.setdefault(call.asked, deque()).append(call)
        self.reused = 0
        self.asked = 0
        self.parted: Parting | None = None
        self._decision = 0
        self._name = ""

    def decide(self, request: DecisionRequest) -> Decision:
        if not request.attempts:  # a decision starts with no attempt; a retry carries the refusals
            self._decision += 1
        self._name = request.name
        decision = super().decide(request)
        if self.parted is None:
            answers = self._recorded_answers()
            turn = len(request.attempts)
            if turn >= len(answers):
                self._part("the recorded run took no further answer here")
            elif answers[turn] != decision.event:
                self._part(
                    f"answered {answer_text(decision.event)} where the recorded run answered {answer_text(answers[turn])}"
                )
        return decision

    def note(self) -> dict[str, Any]:
        """What the run's end entry says of it (`replayFirst`)."""
        return {
            REPLAY_FIRST_KEY: {
                "from": self.recorded.thread_id,
                "reused": self.reused,
                "asked": self.asked,
                "parted": self.parted.to_json() if self.parted is not None else None,
            }
        }

    def _ask(self, ask: Ask, usage: list[Usage], invocation: Invocation) -> dict[str, Any]:
        queue = self._unused.get(ask.asked)
        if not queue:
            if self.parted is None:
                self._part(f"asked {ask.ref} what the recorded run did not ask")
            self.asked += 1
            return super()._ask(ask, usage, invocation)
        call = queue.popleft()
        advance = getattr(ask.model, "advance", None)
        if advance is not None:
            advance(ask.request, call.number)
        self.reused += 1
        recorded = call.usage
        usage.append(
            Usage(
                ask.ref,
                ask.model.name,
                int(recorded.get("inputTokens") or 0),
                int(recorded.get("outputTokens") or 0),
                recorded.get("costUsd"),
                fingerprint=recorded.get("fingerprint"),
                asked=ask.asked,
                answer=call.answer,
                reused=True,
            )
        )
        return {"type": DONE_EVENT, "actorId": invocation.id, "output": call.answer}

    def _recorded_answers(self) -> tuple[Any, ...]:
        decisions = self.recorded.decisions
        return decisions[self._decision - 1][1] if self._decision <= len(decisions) else ()

    def _part(self, why: str) -> None:
        self.parted = Parting(self._decision, self._name, why)


def answer_text(event: Any) -> str:
    """An answer as reports show it: `REFUND{amount=40}`, `CLOSE`, or `(no answer)`."""
    if not isinstance(event, dict):
        return "(no answer)"
    fields = ", ".join(f"{k}={v}" for k, v in event.items() if k != "type")
    return f"{event.get('type')}{{{fields}}}" if fields else str(event.get("type"))
