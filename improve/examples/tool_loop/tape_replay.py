"""Replaying opencli session tapes through the tool-loop machine (`improve tape replay`).

A tape's prompts (tapes.py) each become one run of the loop. The turns become a scripted model
(`TapeDecider`, the decider of the run) and the results the tools' recorded outputs (`TapeWorld`).
Nothing is interpreted from the results' text except by the loop itself: which guards fire, and how
often the model and the tools are called, follow from the machine and its registered guards alone. A
tape is *consumed exactly* when every model turn and every recorded result was used, and the loop
asked for nothing the tape does not have.

Each prompt's run is journaled (in memory, `PromptReplay.entries`) like any run: guard firings are
entries, and a replay of the thread reaches the same snapshot. Turns shortened to fit the decision
protocol (`TapeTurn.event`) are counted as `compacted_turns`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from improve.errors import ActorFailure
from improve.examples.tool_loop.calls import ToolCall
from improve.examples.tool_loop.env import environment
from improve.examples.tool_loop.tapes import TapePrompt, TapeTurn, parse_tape, tape_paths
from improve.examples.tool_loop.world import ToolWorld
from improve.log import LogEntry, MemoryStore
from improve.machine import DONE_EVENT
from improve.runtime import Decision, DecisionRequest, Environment, Usage, run

TAPE_MODEL_REF = "decider"


# --- the scripted model and the recorded tools -------------------------------------------------------


class TapeDecider:
    """The tape's model turns, answered in order: the loop's decider during a tape replay."""

    def __init__(self, tape: str, turns: Sequence[TapeTurn]) -> None:
        self.model = f"tape:{tape}"
        self.turns = list(turns)
        self.used = 0
        self.asked_beyond = 0
        """Model calls the loop made after the tape's turns ran out."""
        self.refused = 0
        """Tape answers the loop refused (the decider has no other answer to give)."""
        self._beyond = False

    def decide(self, request: DecisionRequest) -> Decision:
        if request.attempts:
            # A retry: the tape recorded one answer per turn, so there is nothing else to say.
            if not self._beyond:
                self.refused += 1
            return Decision(event=None, source="tape: no other answer recorded")
        self._beyond = self.used >= len(self.turns)
        if self._beyond:
            self.asked_beyond += 1
            return Decision(event=None, source="tape: no model turn left")
        turn = self.turns[self.used]
        self.used += 1
        event = turn.event()
        tokens = request.facts.get("tokens")
        sent = int(tokens.get("context", 0)) if isinstance(tokens, dict) else 0
        usage = Usage(TAPE_MODEL_REF, self.model, sent, len(json.dumps(event)) // 4)
        return Decision(event=event, usage=[usage], source=f"tape line {turn.line}")


class TapeWorld(ToolWorld):
    """The tools' recorded outputs, handed out in the order the tape recorded them."""

    def __init__(self, turns: Sequence[TapeTurn]) -> None:
        super().__init__({})
        self.recorded = [
            (call.name, result) for t in turns for call, result in zip(t.calls, t.results, strict=False)
        ]
        self.used = 0
        self.missing = 0
        """Tool calls the loop ran that the tape has no result for."""

    def execute(self, call: ToolCall) -> str:
        if self.used >= len(self.recorded):
            self.missing += 1
            raise ActorFailure(
                f"the tape has no recorded result for {call.signature}: the original loop never ran it",
                code="tape-no-result",
            )
        name, result = self.recorded[self.used]
        if name != call.name:
            raise ActorFailure(
                f"the loop ran {call.name!r} where the tape recorded a result of {name!r}",
                code="tape-diverged",
            )
        self.used += 1
        return result


# --- replaying -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardFiring:
    guard: str
    checkpoint: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"guard": self.guard, "checkpoint": self.checkpoint, "reason": self.reason}


@dataclass(frozen=True)
class PromptReplay:
    """One prompt of a tape run through the loop, and what the loop did with it."""

    line: int
    task: str
    thread_id: str
    final_state: str
    output: Any
    model_calls: int
    tool_executions: int
    firings: list[GuardFiring]
    turns: int
    unused_turns: int
    results: int
    unused_results: int
    missing_results: int
    asked_beyond: int
    refused: int
    compacted: int
    """Tape turns shortened to fit the decision protocol (`TapeTurn.event`)."""
    entries: list[LogEntry] = field(repr=False, compare=False, default_factory=list)
    """The journaled thread (a replay of it reaches the run's final snapshot)."""

    @property
    def consumed_exactly(self) -> bool:
        return not (
            self.unused_turns
            or self.unused_results
            or self.missing_results
            or self.asked_beyond
            or self.refused
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "task": self.task,
            "thread_id": self.thread_id,
            "final_state": self.final_state,
            "output": self.output,
            "model_calls": self.model_calls,
            "tool_executions": self.tool_executions,
            "guard_firings": [f.to_json() for f in self.firings],
            "tape_turns": self.turns,
            "unused_model_turns": self.unused_turns,
            "tape_results": self.results,
            "unused_tool_results": self.unused_results,
            "missing_tool_results": self.missing_results,
            "model_calls_beyond_tape": self.asked_beyond,
            "refused_tape_answers": self.refused,
            "compacted_turns": self.compacted,
            "consumed_exactly": self.consumed_exactly,
        }


@dataclass(frozen=True)
class TapeReplay:
    """A tape replayed: per prompt, and in total."""

    tape: str
    path: str
    prompts: list[PromptReplay]
    commands: list[str]

    @property
    def model_calls(self) -> int:
        return sum(p.model_calls for p in self.prompts)

    @property
    def tool_executions(self) -> int:
        return sum(p.tool_executions for p in self.prompts)

    @property
    def firings(self) -> list[GuardFiring]:
        return [f for p in self.prompts for f in p.firings]

    @property
    def consumed_exactly(self) -> bool:
        return all(p.consumed_exactly for p in self.prompts)

    def to_json(self) -> dict[str, Any]:
        return {
            "tape": self.tape,
            "path": self.path,
            "model_calls": self.model_calls,
            "tool_executions": self.tool_executions,
            "guard_firings": [f.to_json() for f in self.firings],
            "consumed_exactly": self.consumed_exactly,
            "commands": self.commands,
            "prompts": [p.to_json() for p in self.prompts],
        }


def _thread_id(tape: str, number: int) -> str:
    return f"tape:direct:{re.sub(r'[^A-Za-z0-9._-]', '_', tape)[:120] or 'tape'}-p{number}:r1"


def replay_prompt(env: Environment, tape: str, number: int, prompt: TapePrompt) -> PromptReplay:
    """Run one prompt through the loop with the tape as the model and the tools (a journaled thread)."""
    decider = TapeDecider(tape, prompt.turns)
    world = TapeWorld(prompt.turns)
    store = MemoryStore()
    thread_id = _thread_id(tape, number)
    result = run(
        env,
        input={"task": prompt.task},
        world=world,
        people={},
        decider=decider,
        store=store,
        thread_id=thread_id,
        stamp={"environment": env.name, "tape": tape, "prompt": number},
    )
    entries = store.read(thread_id)
    firings = [
        GuardFiring(
            str(e.event["output"].get("guard", "")),
            str(e.event["output"].get("checkpoint", "")),
            str(e.event["output"].get("reason", "")),
        )
        for e in entries
        if e.type == DONE_EVENT
        and e.event.get("actorId") == "guard_fired"
        and isinstance(e.event.get("output"), dict)
    ]
    executed = sum(
        len(e.event["output"].get("results") or [])
        for e in entries
        if e.type == DONE_EVENT
        and e.event.get("actorId") == "executing_tools"
        and isinstance(e.event.get("output"), dict)
    )
    return PromptReplay(
        line=prompt.line,
        task=prompt.task,
        thread_id=thread_id,
        final_state=result.final_state,
        output=result.snapshot.output,
        model_calls=result.model_calls,
        tool_executions=executed,
        firings=firings,
        turns=len(prompt.turns),
        unused_turns=len(prompt.turns) - decider.used,
        results=len(world.recorded),
        unused_results=len(world.recorded) - world.used,
        missing_results=world.missing,
        asked_beyond=decider.asked_beyond,
        refused=decider.refused,
        compacted=sum(t.compacted for t in prompt.turns),
        entries=entries,
    )


def replay_tape(path: Path, env: Environment | None = None) -> TapeReplay:
    """Replay one tape through the loop (`env`: the tool-loop environment, built-in guards by default)."""
    tape = parse_tape(path)
    environment_ = env if env is not None else environment()
    prompts = [replay_prompt(environment_, tape.name, n, p) for n, p in enumerate(tape.prompts, start=1)]
    return TapeReplay(tape.name, str(path), prompts, list(tape.commands))


def replay_tapes(
    paths: Iterable[Path],
    env: Environment | None = None,
    progress: Callable[[Path], None] | None = None,
) -> list[TapeReplay]:
    """Replay every tape named (files, or directories of `*.jsonl`), in order."""
    environment_ = env if env is not None else environment()
    replays = []
    for path in tape_paths(paths):
        if progress:
            progress(path)
        replays.append(replay_tape(path, environment_))
    return replays
