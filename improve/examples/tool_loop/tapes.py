"""Reading opencli session tapes: the tape format, as prompts and model turns (`parse_tape`).

A tape is the opencli agent's session recording: one JSON object per line, `{"type": "user" |
"assistant" | "tool_call" | "tool_result", "timestamp": ...}` with `content` for messages, `name` and
`args` for a tool call, `name` and `result` for its result. How a tape is read:

- every `user` line starts a *prompt*: one run of the loop with its content as the task. A `user` line
  that starts with `/` (`/exit`) is a command to the opencli CLI, not a prompt: it starts no run;
- a *model turn* is an optional `assistant` line followed by consecutive `tool_call` lines: one
  `CALL_TOOLS` answer with those calls in order (and the assistant's text). An `assistant` line with no
  tool call after it is a final answer (`ANSWER`); an empty one is an empty response;
- `tool_result` lines answer the turn's calls in order (each must name the call it answers).

A turn longer than the decision protocol's 2,000-character free-text field (a `write` of a whole
file) has its long arguments replaced by a digest of their content (`TapeTurn.event`). Replaying the
prompts through the loop is tape_replay.py's job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from improve.errors import ConfigError, TapeError
from improve.examples.tool_loop.calls import ToolCall, calls_text
from improve.runtime import MAX_FREE_TEXT

COMMAND_PREFIX = "/"


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
