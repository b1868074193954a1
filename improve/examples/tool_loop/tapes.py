"""Replaying opencli session tapes through the tool-loop machine (`improve tape replay`).

A tape is the opencli agent's session recording: one JSON object per line, `{"type": "user" |
"assistant" | "tool_call" | "tool_result", "timestamp": ...}` with `content` for messages, `name` and
`args` for a tool call, `name` and `result` for its result. How a tape becomes runs of the loop:

- every `user` line starts a *prompt*: one run of the loop with its content as the task. A `user` line
  that starts with `/` (`/exit`) is a command to the opencli CLI, not a prompt: it starts no run;
- a *model turn* is an optional `assistant` line followed by consecutive `tool_call` lines: one
  `CALL_TOOLS` answer with those calls in order (and the assistant's text). An `assistant` line with no
  tool call after it is a final answer (`ANSWER`); an empty one is an empty response;
- `tool_result` lines answer the turn's calls in order (each must name the call it answers).

The turns become a scripted model (`TapeDecider`, the decider of the run) and the results the tools'
recorded outputs (`TapeWorld`). Nothing is interpreted from the results' text except by the loop
itself: which guards fire, and how often the model and the tools are called, follow from the machine and
its registered guards alone. A tape is *consumed exactly* when every model turn and every recorded
result was used, and the loop asked for nothing the tape does not have.

Each prompt's run is journaled (in memory, `PromptReplay.entries`) like any run: guard firings are
entries, and a replay of the thread reaches the same snapshot. A turn longer than the decision
protocol's 2,000-character free-text field (a `write` of a whole file) has its long arguments replaced
by a digest of their content (`TapeTurn.event`); the count is reported as `compacted_turns`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from improve.errors import ConfigError, LogError
from improve.examples.tool_loop.env import ToolWorld, environment
from improve.examples.tool_loop.guards import ToolCall, calls_text
from improve.log.entry import LogEntry
from improve.log.store import MemoryStore
from improve.machine import DONE_EVENT
from improve.runtime.decision import MAX_FREE_TEXT, Decision, DecisionRequest, Usage
from improve.runtime.environment import ActorFailure, Environment
from improve.runtime.run import run

COMMAND_PREFIX = "/"
TAPE_MODEL_REF = "decider"


class TapeError(LogError):
    """A tape line that cannot be read as the opencli format (exit code 3: the data is wrong)."""


# --- reading a tape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TapeTurn:
    """One model turn of a tape: its text, its tool calls, and the results recorded for them."""

    line: int
    """1-based line of the turn's first line in the tape."""
    text: str
    calls: tuple[ToolCall, ...]
    results: tuple[str, ...]
    """Recorded outputs, in call order; fewer than the calls when the tape stops mid-turn."""

    @property
    def compacted(self) -> bool:
        """Whether the answer had to be shortened to fit the decision protocol (see `event`)."""
        return len(calls_text(self.calls)) > MAX_FREE_TEXT or len(self.text) > MAX_FREE_TEXT

    def event(self) -> dict[str, Any]:
        """The answer the model gave, in the decision protocol's terms.

        The protocol caps a free-text field at 2,000 characters, and a turn that writes a file is longer.
        Such a turn's long arguments are replaced by a digest of their content (`<6565 chars, sha256
        1f2e...>`): equal contents keep equal digests, so the signatures the stuck-loop guard compares
        are unchanged, and nothing else the loop reads depends on them (the results come from the tape).
        Text longer than the cap is cut, with a marker saying how much was left out.
        """
        text = _cut(self.text)
        if self.calls:
            calls = calls_text(self.calls)
            if len(calls) > MAX_FREE_TEXT:
                calls = calls_text(_compact(c) for c in self.calls)
            event: dict[str, Any] = {"type": "CALL_TOOLS", "calls": calls}
            if text:
                event["text"] = text
            return event
        return {"type": "ANSWER", "text": text}


LONG_ARGUMENT = 200
"""An argument whose JSON is longer than this is digested when a turn does not fit the protocol."""


def _compact(call: ToolCall) -> ToolCall:
    args = {}
    for key, value in call.args.items():
        encoded = json.dumps(value, ensure_ascii=False, sort_keys=True)
        if len(encoded) > LONG_ARGUMENT:
            digest = hashlib.sha256(encoded.encode()).hexdigest()[:16]
            args[key] = f"<{len(encoded)} chars, sha256 {digest}>"
        else:
            args[key] = value
    return ToolCall(call.name, args)


def _cut(text: str) -> str:
    if len(text) <= MAX_FREE_TEXT:
        return text
    marker = " [... {} more characters]"
    keep = MAX_FREE_TEXT - len(marker.format(len(text)))
    return text[:keep] + marker.format(len(text) - keep)


@dataclass(frozen=True)
class TapePrompt:
    """A user prompt and the model turns that followed it: one run of the loop."""

    line: int
    task: str
    turns: tuple[TapeTurn, ...]


@dataclass(frozen=True)
class Tape:
    path: Path
    prompts: tuple[TapePrompt, ...]
    commands: tuple[str, ...]
    """User lines that were CLI commands (`/exit`): they start no run."""

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass
class _Building:
    line: int
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    open: bool = True
    """Still taking tool calls (no result has arrived yet)."""

    def freeze(self) -> TapeTurn:
        return TapeTurn(self.line, self.text, tuple(self.calls), tuple(self.results))


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parse_tape(path: Path) -> Tape:
    """Read a tape into prompts and turns (module docstring); errors name the file and line."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such tape file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TapeError(f"{path}: cannot be read as UTF-8 text: {err}") from None
    prompts: list[TapePrompt] = []
    commands: list[str] = []
    task: tuple[int, str] | None = None
    turns: list[_Building] = []
    after_command: tuple[int, str] | None = None

    def close() -> None:
        if task is not None:
            prompts.append(TapePrompt(task[0], task[1], tuple(t.freeze() for t in turns)))

    for number, line in enumerate(raw.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise TapeError(
                f"{where}: not JSON ({err.msg}); every line of a tape is one JSON object"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("type"), str):
            raise TapeError(
                f'{where}: expected an object with a string "type" (user, assistant, tool_call, tool_result)'
            )
        kind = row["type"]
        if kind == "user":
            close()
            content = _text(row.get("content"))
            task, turns, after_command = None, [], None
            if content.startswith(COMMAND_PREFIX):
                commands.append(content)
                after_command = (number, content)
            else:
                task = (number, content)
            continue
        if kind not in ("assistant", "tool_call", "tool_result"):
            raise TapeError(
                f"{where}: unknown line type {kind!r}; a tape has user, assistant, tool_call, tool_result"
            )
        if task is None:
            why = (
                f"it follows the command {after_command[1]!r} (line {after_command[0]}), which starts no run"
                if after_command
                else "no user prompt came before it"
            )
            raise TapeError(f"{where}: a {kind} line outside a prompt: {why}")
        if kind == "assistant":
            turns.append(_Building(number, _text(row.get("content"))))
        elif kind == "tool_call":
            name, args = row.get("name"), row.get("args", {})
            if not isinstance(name, str) or not name or not isinstance(args, dict):
                raise TapeError(f'{where}: a tool_call needs a string "name" and an object "args"')
            if not turns or not turns[-1].open:
                turns.append(_Building(number, ""))
            turns[-1].calls.append(ToolCall(name, args))
        else:
            current = turns[-1] if turns else None
            if current is None or len(current.results) >= len(current.calls):
                raise TapeError(f"{where}: a tool_result with no tool_call waiting for it")
            expected = current.calls[len(current.results)].name
            if row.get("name") != expected:
                raise TapeError(
                    f"{where}: this tool_result is for {row.get('name')!r}, but the call waiting is {expected!r} "
                    f"(line {current.line}); results answer a turn's calls in order"
                )
            current.open = False
            current.results.append(_text(row.get("result")))
    close()
    return Tape(path, tuple(prompts), tuple(commands))


def tape_paths(paths: Iterable[Path]) -> list[Path]:
    """The tape files named: files as given, directories as their `*.jsonl` files (sorted)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            files = sorted(path.glob("*.jsonl"))
            if not files:
                raise ConfigError(f"{path}: a directory with no *.jsonl tapes in it")
            found += files
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError(f"{path}: no such tape file or directory")
    return found


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
